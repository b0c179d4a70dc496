// Package bulktest holds data-plane servers for tests of the data plane's
// clients (bulk's own and the packages that call it).
package bulktest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// HangUp is a listener on 127.0.0.1 that reads each connection's hello
// (or as many bytes of whatever comes) and then, with request, answers
// Magic and reads the first byte of the request; then it closes the
// connection, with a reset (SO_LINGER 0) when reset is set: a hub dying,
// or a port taken by something else. It returns its address; cleanup
// closes the listener and waits for its goroutines.
func HangUp(tb testing.TB, request, reset bool) string {
	tb.Helper()
	lis := testkit.Listen(tb)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // ends the goroutine if the client stalls
				if _, err := io.ReadFull(c, make([]byte, len(bulk.Hello("")))); err != nil {
					return
				}
				if request {
					if _, err := c.Write([]byte(bulk.Magic)); err != nil {
						return
					}
					if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
						return
					}
				}
				if reset {
					_ = c.(*net.TCPConn).SetLinger(0)
				}
			})
		}
	})
	tb.Cleanup(func() { lis.Close(); wg.Wait() })
	return lis.Addr().String()
}
