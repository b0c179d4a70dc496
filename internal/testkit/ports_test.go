package testkit

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr hands out loopback ports below the ephemeral range, each once,
// that a listener can bind.
func TestFreeAddrIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	low := ephemeralLow()
	seen := map[string]bool{}
	for range 20 {
		addr := FreeAddr(t)
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("FreeAddr = %q", addr)
		}
		if p, _ := strconv.Atoi(port); p < 1024 || p >= low {
			t.Fatalf("FreeAddr = %q, not below the ephemeral range's %d", addr, low)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr handed out %s twice", addr)
		}
		seen[addr] = true
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on FreeAddr's %s: %v", addr, err)
		}
		l.Close()
	}
}
