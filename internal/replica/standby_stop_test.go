package replica_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/replica"
)

// A standby server stops promptly even while a peer is stuck in the middle
// of its gRPC handshake: a newly elected hub SIGSTOPped while it asked
// this standby's position (its preface sent, its SETTINGS not) held the
// standby's takeover for gRPC's handshake timeout, 120 s (issue 15).
func TestStandbyStopsDespiteAStalledHandshake(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := replica.StartStandbyForTest(lis, nil, 1, 1)
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil { // the preface, and no SETTINGS
		t.Fatal(err)
	}
	// The server's SETTINGS frame (9-byte header): gRPC now waits for ours.
	if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // far below gRPC's 120 s, far above the standby's 1 s
		c.Close() // let it end
		<-done
		t.Fatal("the standby server's stop waited for a handshake that never completes")
	}
}
