package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreeAddr is a loopback address for a server that binds the port it is
// given rather than port 0 (etcd, a relay's or a metrics --listen), or for
// an address nothing listens on: a port below the kernel's ephemeral
// range, free now and not handed out before by this process. A port from
// the ephemeral range (what 127.0.0.1:0 gives) is free again once its
// probe closes: before the server binds it, any other listener on port 0
// (a test's, a hub's, an etcd's, in this or a parallel test process) or
// an outgoing connection's source port could take it ("bind: address
// already in use", seen in CI for the Python tests' etcd cluster, which
// picked ports that way). A server that can report the port it bound
// listens on 127.0.0.1:0 instead (Listen, `serve --addr-file`).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	low := ephemeralLow()
	span := min(12000, low-1024)
	givenMu.Lock()
	defer givenMu.Unlock()
	for range 1000 {
		port := low - 1 - rand.IntN(span)
		if given[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		given[port] = true
		return addr
	}
	tb.Fatalf("no free loopback port below %d", low)
	return ""
}

var (
	givenMu sync.Mutex
	given   = map[int]bool{} // ports FreeAddr handed out
)

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 2048 {
		return 32768
	}
	return n
}
