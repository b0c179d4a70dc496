package arsrpc

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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

// A worker whose hub accepts the connection and never answers (silent,
// or after a valid HTTP/2 preface: an empty SETTINGS frame) gives up
// after RetryFor with DeadlineExceeded and an error that names the ARS
// coordinator's address and the bound each Attach had, not a bare
// "attach: context deadline exceeded: context deadline exceeded".
func TestWorkerAgainstSilentHubNamesWhatTimedOut(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", nil},
		{"preface-only", []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}},
	} {
		t.Run(hub.name, func(t *testing.T) {
			addr := silentHub(t, hub.first)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", RetryFor: time.Millisecond, Logger: testkit.Logger(),
				attachWait: 200 * time.Millisecond})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("RunWorker against a %s hub = %v, want DeadlineExceeded", hub.name, err)
			}
			for _, want := range []string{"attach to the ARS coordinator at " + addr, "no answer within 200ms"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("RunWorker against a %s hub = %q, want it to say %q", hub.name, err, want)
				}
			}
			if strings.Contains(err.Error(), "exceeded: context deadline exceeded") {
				t.Errorf("RunWorker against a %s hub = %q: the deadline said twice", hub.name, err)
			}
		})
	}
}
