package testkit

import (
	"io"
	"net"
	"sync"
	"testing"
)

// What a SilentHub writes on each connection before it falls silent.
var (
	// Nothing: a hub that accepts and never answers (SIGSTOPped, wedged).
	Silent []byte
	// PrefaceOnly is a valid HTTP/2 server preface (an empty SETTINGS
	// frame) and then nothing: a gRPC server whose handlers hang.
	PrefaceOnly = []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}
	// HalfSettings is an HTTP/2 SETTINGS frame's 9-byte header announcing
	// 6 bytes, and 3 of them: a server that stopped mid-message.
	HalfSettings = []byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0}
)

// SilentHub is a real listener on 127.0.0.1 that accepts connections,
// writes first on each (Silent, PrefaceOnly, HalfSettings, or any bytes)
// and then holds it open, reading and discarding, until the client closes
// it or the test ends. It returns its address; cleanup closes the
// listener and every connection and waits for its goroutines.
func SilentHub(tb testing.TB, first []byte) string {
	tb.Helper()
	addr, _ := SilentHubCounting(tb, first)
	return addr
}

// SilentHubCounting is SilentHub that also returns how many connections
// it has accepted so far (for tests of how often a client tries it).
func SilentHubCounting(tb testing.TB, first []byte) (addr string, accepted func() int) {
	tb.Helper()
	lis := Listen(tb)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	n := 0 // connections accepted
	closed := false
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed { // accepted as the cleanup began
				mu.Unlock()
				c.Close()
				return
			}
			conns = append(conns, c)
			n++
			mu.Unlock()
			wg.Go(func() {
				_, _ = c.Write(first)
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			})
		}
	})
	tb.Cleanup(func() {
		lis.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}
