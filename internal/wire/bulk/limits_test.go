package bulk_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// dialFrom opens a TCP connection to addr from local IP from (any address
// of 127.0.0.0/8 is loopback on Linux, so tests can be several peers).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c within guard (a hang
// guard, not a measurement): a read returns EOF or a reset.
func closedByServer(c net.Conn, guard time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(guard))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// halfRequest sends the magic and the first bytes of a request frame, and
// never the rest.
func halfRequest(t *testing.T, c net.Conn) {
	t.Helper()
	frame := append(bulk.Hello(""), 1)
	frame = binary.LittleEndian.AppendUint16(frame, 3)
	frame = append(frame, "su"...) // the method name is cut short
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
}

// A connection that sends the magic and part of a request is closed once
// FrameTimeout passes; one that sends only the magic, once IdleTimeout
// passes; one that sends fewer than 8 bytes, once FrameTimeout passes.
// Meanwhile other clients are served.
func TestPartialFramesAreCutOff(t *testing.T) {
	e := start(t, func(s *bulk.Server) {
		s.FrameTimeout = 200 * time.Millisecond
		s.IdleTimeout = 400 * time.Millisecond
	})
	half := dialFrom(t, "127.0.0.1", e.addr)
	halfRequest(t, half)
	magicOnly := dialFrom(t, "127.0.0.1", e.addr)
	if _, err := magicOnly.Write(bulk.Hello("")); err != nil {
		t.Fatal(err)
	}
	sniff := dialFrom(t, "127.0.0.1", e.addr)
	if _, err := sniff.Write([]byte("RLH")); err != nil {
		t.Fatal(err)
	}
	c := bulk.NewClient()
	defer c.Close()
	var resp wrapperspb.UInt64Value
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), net.Buffers{{1, 2}}, &resp); err != nil || resp.GetValue() != 3 {
		t.Fatalf("a client beside the half-open ones: %v, %v", resp.GetValue(), err)
	}
	for name, conn := range map[string]net.Conn{"half a request": half, "magic only": magicOnly, "3 bytes": sniff} {
		if !closedByServer(conn, 20*time.Second) {
			t.Fatalf("%s: the server never closed the connection", name)
		}
	}
}

// MaxConnsPerPeer: one peer IP holds at most the cap; more are closed at
// accept and counted; another peer IP is served all along; closing
// connections frees the peer's places.
func TestConnectionCapPerPeer(t *testing.T) {
	const limit = 5
	e := start(t, func(s *bulk.Server) { s.MaxConnsPerPeer = limit })
	var held []net.Conn
	for range limit {
		c := dialFrom(t, "127.0.0.2", e.addr)
		if _, err := c.Write(bulk.Hello("")); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testkit.Eventually(t, 10*time.Second, "the peer's connections counted", func() bool {
		n, _ := e.srv.PeerConns("127.0.0.2")
		return n == limit
	})
	over := dialFrom(t, "127.0.0.2", e.addr)
	if !closedByServer(over, 20*time.Second) {
		t.Fatal("a connection over the peer's cap was not closed")
	}
	if _, refused := e.srv.PeerConns("127.0.0.2"); refused != 1 {
		t.Fatalf("refused %d connections, want 1", refused)
	}
	c := bulk.NewClient()
	defer c.Close()
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(1), net.Buffers{{1}}, nil); err != nil {
		t.Fatalf("another peer while the first is at its cap: %v", err)
	}
	for _, h := range held {
		h.Close()
	}
	testkit.Eventually(t, 10*time.Second, "closed connections uncounted", func() bool {
		n, _ := e.srv.PeerConns("127.0.0.2")
		return n == 0
	})
}
