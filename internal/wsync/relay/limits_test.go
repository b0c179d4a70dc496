package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestRelayClosesSilentAndUnansweringConnections: as the hub does, the
// relay bounds a connection's handshake, and pings a connection gone
// silent and closes it when the ping goes unanswered (a collector's host
// gone without a word). Before, the relay kept gRPC's defaults: two
// minutes for a handshake and no pings.
func TestRelayClosesSilentAndUnansweringConnections(t *testing.T) {
	h := startHub(t)
	r, err := New(Config{Upstream: dial(t, h.addr), Model: "m", Logger: quiet(),
		HandshakeTimeout: 300 * time.Millisecond, KeepaliveTime: time.Second, KeepaliveTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	open := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.SetReadDeadline(time.Now().Add(15 * time.Second)); err != nil {
			t.Fatal(err)
		}
		return c
	}

	// A connection that never sends its preface.
	silent := open()
	if _, err := io.Copy(io.Discard, silent); err != nil {
		t.Fatalf("a connection without a handshake: %v, want it closed by the relay", err)
	}

	// One that completes the handshake and then answers nothing.
	mute := open()
	if _, err := mute.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(mute, mute)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	pings := 0
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a connection that answers no ping is still open after 15s (%d pings)", pings)
		}
		if err != nil {
			break // closed: a reset is as good as an end
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				pings++
			}
		}
	}
	if pings == 0 {
		t.Fatal("the relay closed a connection that completed its handshake without pinging it first")
	}
}
