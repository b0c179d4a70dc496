package wsync

import (
	"context"
	"testing"
	"time"
)

// A collector that re-attaches (a new connection) while its old stream is
// still open on the hub (half-open TCP, keepalive not yet fired) stays
// attached once the old stream finally ends, and is not forgotten: it was
// marked detached then, and dropped from status after Forget.
func TestOverlappingStreamsOfOneCollectorStayAttached(t *testing.T) {
	h := startHubWith(t, ServiceConfig{Forget: 300 * time.Millisecond})
	h.push(t, 1, 100)
	old := startCollector(t, h.addr, "c1", 0)
	waitFor(t, "old stream at v1", func() bool { return old.recv.Version() == 1 })
	startCollector(t, h.addr, "c1", 1) // the re-attach, still open
	waitFor(t, "two streams", func() bool { return h.svc.Stats(context.Background()).Streams == 2 })
	old.stop() // the stale stream finally ends
	waitFor(t, "one stream", func() bool { return h.svc.Stats(context.Background()).Streams == 1 })
	time.Sleep(600 * time.Millisecond) // > Forget, no new version, so no Running report
	st := h.svc.Lag(context.Background(), "m")
	if len(st) != 1 || len(st[0].Collectors) != 1 {
		t.Fatalf("collector c1 holds a live push stream but status is %+v", st)
	}
	if c := st[0].Collectors[0]; !c.Attached {
		t.Fatalf("c1 holds a live push stream but Attached=%v", c.Attached)
	}
}
