package bulk_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// A client with a token and no TLS writes the token in its handshake, in
// the clear: to an address off loopback it refuses before it connects
// (the dial hook sees no attempt, so nothing reaches the network, and
// the hook would refuse to connect there anyway), Unauthenticated, naming
// the address and --tls-ca. On loopback the same client dials and is
// served.
func TestTokenNotSentInPlaintextOffLoopback(t *testing.T) {
	e := start(t)
	c := bulk.NewClientConfig(bulk.ClientConfig{Token: "rlh_secret"})
	defer c.Close()
	var mu sync.Mutex
	var dialled []string
	bulk.HookDial(c, func(address string) error {
		mu.Lock()
		dialled = append(dialled, address)
		mu.Unlock()
		if host, _, _ := net.SplitHostPort(address); !net.ParseIP(host).IsLoopback() {
			return errors.New("test: no connection leaves this machine")
		}
		return nil
	})
	for _, addr := range []string{"192.0.2.1:7470", "10.255.255.1:7470", "[2001:db8::1]:7470"} {
		var resp wrapperspb.UInt64Value
		err := c.Call(ctx(t), addr, "sum", wrapperspb.UInt64(1), net.Buffers{{7}}, &resp)
		if !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), addr) ||
			!strings.Contains(err.Error(), "plaintext") || !strings.Contains(err.Error(), "--tls-ca") {
			t.Errorf("token without TLS to %s: %v, want Unauthenticated naming the address and --tls-ca", addr, err)
		}
	}
	mu.Lock()
	if len(dialled) != 0 {
		t.Errorf("the client dialled %v before refusing", dialled)
	}
	mu.Unlock()

	_, port, _ := net.SplitHostPort(e.addr)
	for _, addr := range []string{e.addr, "localhost:" + port} {
		var resp wrapperspb.UInt64Value
		if err := c.Call(ctx(t), addr, "sum", wrapperspb.UInt64(1), net.Buffers{{7}}, &resp); err != nil || resp.GetValue() != 7 {
			t.Errorf("token without TLS to loopback %s: %v, %v", addr, resp.GetValue(), err)
		}
	}
}
