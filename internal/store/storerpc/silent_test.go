package storerpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
)

// silentHub is a real listener on 127.0.0.1 that accepts connections,
// writes first (each connection) and then holds them open, reading and
// discarding, as a SIGSTOPped or wedged hub does.
func silentHub(t *testing.T, first []byte) string {
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
				_, _ = c.Write(first)
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

// Calls under a context without a deadline to a hub that accepts the
// connection and never answers (silent), stops mid-message (half of an
// HTTP/2 SETTINGS frame), or completes the HTTP/2 preface and then
// answers nothing, fail with DeadlineExceeded once CallTimeout has passed,
// saying what they waited for; on gRPC and on the data plane.
func TestCallsWithoutDeadlineToSilentHubFail(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", nil},
		{"half-sent", []byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0}},
		{"preface-only", []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}},
	} {
		for _, transport := range []string{"", "grpc"} {
			t.Run(hub.name+"/"+transport, func(t *testing.T) {
				c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: silentHub(t, hub.first), Transport: transport, CallTimeout: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				bg := context.Background()
				for _, call := range []struct {
					name string
					do   func() error
				}{
					{"List", func() error { _, err := c.List(bg); return err }},
					{"Get", func() error { _, err := c.Get(bg, "m", 0); return err }},
					{"Push", func() error {
						_, err := c.Push(bg, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: make([]byte, 64)})
						return err
					}},
				} {
					done := make(chan error, 1)
					go func() { done <- call.do() }()
					var err error
					select {
					case err = <-done:
					case <-time.After(30 * time.Second):
						c.Close() // ends the call, so that its goroutine does not leak
						<-done
						t.Fatalf("%s without a deadline to a silent hub did not return within 30s", call.name)
					}
					if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "CallTimeout") {
						t.Errorf("%s to a silent hub: %v, want DeadlineExceeded naming CallTimeout", call.name, err)
					}
				}
			})
		}
	}
}
