package cli

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

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

// One-shot commands against a hub that accepts the connection and never
// answers (silent, or after a valid HTTP/2 preface) exit non-zero once
// their --timeout has passed, with an error naming the deadline.
func TestCommandsAgainstSilentHubExitNonZero(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", nil},
		{"preface-only", []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}},
	} {
		addr := silentHub(t, hub.first)
		for _, args := range [][]string{
			{"model", "ls", "--hub", addr, "--timeout", "300ms"},
			{"ping", "--hub", addr, "--timeout", "300ms", "--wait"},
			{"aggregator", "status", "--hub", addr, "--timeout", "300ms"},
		} {
			code, _, errOut := run(t, context.Background(), args...)
			if code == 0 || !strings.Contains(errOut, "deadline") {
				t.Errorf("%s: %v against a silent hub: exit %d, stderr %q; want non-zero and a deadline error", hub.name, args[:2], code, errOut)
			}
		}
	}
}
