package replica_test

import (
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
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

// A hub whose etcd is gone stops when told to. Its lease lapses, it tries
// to join again, and that join waits for an etcd that does not answer: it
// once waited for ever, SIGTERM unheard, so that only SIGKILL (or etcd's
// return) ended the hub — a Kubernetes pod would sit out its whole grace
// period. Both hubs, primary and standby, must end, and cleanly.
func TestHubStopsWhileEtcdIsGone(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 2)
	_, primary := c.leader(0)
	// A primary elected says nothing of the standby: it may still be in
	// its first join, which etcd's death then fails ("join failed"), so
	// it never has a membership to lose. Each hub's Join has returned
	// once it logs that it joined.
	for _, h := range c.hubs {
		testkit.Eventually(t, 60*time.Second, h.id+" to join", func() bool {
			return strings.Contains(h.out.String(), `msg="cluster: joined"`)
		})
	}
	e.Kill()
	for _, h := range c.hubs {
		testkit.Eventually(t, 30*time.Second, h.id+" lost its membership", func() bool {
			return strings.Contains(h.out.String(), "membership lost; rejoining")
		})
	}
	// The join has begun (its dial does not block): it now waits on etcd.
	time.Sleep(time.Second)
	for _, h := range c.hubs {
		h.signal(syscall.SIGTERM)
	}
	for _, h := range c.hubs {
		role := "standby"
		if h == primary {
			role = "primary"
		}
		st := h.proc.Wait(t, 30*time.Second) // the hang was for as long as etcd stayed away
		if !st.Success() {
			t.Errorf("%s (was %s) ended %v after SIGTERM:\n%s", h.id, role, st, h.out)
		}
	}
}
