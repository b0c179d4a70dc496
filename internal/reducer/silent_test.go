package reducer

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// silentHub is a real listener on 127.0.0.1 that accepts connections and
// holds them open, reading and discarding, as a SIGSTOPped or wedged hub
// does. With half it first writes the beginning of an HTTP/2 SETTINGS
// frame (its 9-byte header announcing 6 bytes, and 3 of them) and then
// nothing: a server that stopped mid-message.
func silentHub(t *testing.T, half bool) string {
	t.Helper()
	lis := testkit.Listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				if half {
					_, _ = c.Write([]byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0})
				}
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

// A push under a context without a deadline (context.Background(), as a
// user passes) to a hub that accepts the connection and never answers, or
// stops mid-message, fails with DeadlineExceeded once CallTimeout has
// passed, instead of retrying the listing of secondaries forever.
func TestPushWithoutDeadlineToSilentHubFails(t *testing.T) {
	for _, half := range []bool{false, true} {
		name := map[bool]string{false: "silent", true: "half-sent"}[half]
		t.Run(name, func(t *testing.T) {
			c, err := NewClient(ClientConfig{Hub: silentHub(t, half), CallTimeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			done := make(chan error, 1)
			go func() {
				_, err := c.PushGrad(context.Background(), "m", 1, testLayout(4))
				done <- err
			}()
			var err2 error
			select {
			case err2 = <-done:
			case <-time.After(30 * time.Second):
				c.Close() // ends the push, so that its goroutine does not leak
				<-done
				t.Fatal("a push without a deadline to a silent hub did not return within 30s")
			}
			if !errors.Is(err2, context.DeadlineExceeded) || !strings.Contains(err2.Error(), "CallTimeout") {
				t.Fatalf("push to a silent hub: %v, want DeadlineExceeded naming CallTimeout", err2)
			}
		})
	}
}
