package wsync

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A model deleted and pushed again from version 1, followed by Go
// receivers driven by Poll alone (a collector that polls between
// episodes, rlhub.Collector.Poll), one per source a hub serves: the push
// stream, a Failover on it, the data plane and its gRPC fallback, and a
// store in process. Each follows lives and takes the new model's v1 at its
// next polls; before, Poll asked GetIfNewer only and kept the deleted
// model's v5 until the new model's versions passed it (Run did follow
// lives). The version numbers between one life's version and the next
// life's first are no skip.
func TestPollFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	type source struct {
		name    string
		noDP    bool
		open    func(t *testing.T, h *dpHub) Source
		skipped func(src Source) uint64 // nil: the source counts no skips
	}
	dataPlane := func(t *testing.T, h *dpHub) Source {
		c, err := NewDataPlaneClient(DataPlaneConfig{Addr: h.addr, Conn: dial(t, h.addr), CollectorID: "poll", Model: "m",
			FollowLives: true, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dpSkipped := func(src Source) uint64 { return src.(*DataPlaneClient).Skipped() }
	for _, s := range []source{
		{name: "push", open: func(t *testing.T, h *dpHub) Source {
			c, err := Attach(context.Background(), ClientConfig{Conn: dial(t, h.addr), CollectorID: "poll", Model: "m", FollowLives: true,
				Logger: testkit.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}},
		{name: "failover", open: func(t *testing.T, h *dpHub) Source {
			f, err := NewFailover(FailoverConfig{Dialers: []Dialer{PushDialer("push", dial(t, h.addr), "poll", "m")}, FollowLives: true,
				Backoff: 10 * time.Millisecond, Logger: testkit.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}, skipped: func(src Source) uint64 { return src.(*Failover).Skipped() }},
		{name: "dataplane", open: dataPlane, skipped: dpSkipped},
		{name: "dataplane-fallback", noDP: true, open: dataPlane, skipped: dpSkipped},
		{name: "store", open: func(t *testing.T, h *dpHub) Source { return StoreSource{Store: h.st, Name: "m"} }},
	} {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			h := startDPHub(t, s.noDP)
			for v := uint64(1); v <= 5; v++ {
				wsynctest.PushLife(t, h.st, v, 0, v)
			}
			src := s.open(t, h)
			rec := &livesRecorder{}
			recv, err := NewReceiver(ReceiverConfig{Source: src, FollowLives: true, Apply: rec.apply})
			if err != nil {
				t.Fatal(err)
			}
			poll := func() {
				if _, err := recv.Poll(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "polled to v5", func() bool { poll(); return rec.last().version == 5 })
			oldLife := rec.last().life
			if oldLife == 0 {
				t.Fatal("v5 came with no life")
			}
			if err := h.st.Delete(ctx, "m"); err != nil {
				t.Fatal(err)
			}
			fresh := wsynctest.PushLife(t, h.st, 1, 0, 101)
			waitFor(t, "polled to the new model's v1", func() bool { poll(); return rec.last().blob == fresh })
			if got := rec.last(); got.version != 1 || got.life == oldLife || got.life == 0 {
				t.Fatalf("applied v%d of life %d (deleted life %d), want the new life's v1", got.version, got.life, oldLife)
			}
			// Deleted again and pushed from v9 (a life may start at any
			// version): v9 of another life after v1 skipped no version
			// number (the hub's data plane counts none either); before,
			// Failover and the data plane's fallback counted 7.
			var before uint64
			if s.skipped != nil {
				before = s.skipped(src)
			}
			if err := h.st.Delete(ctx, "m"); err != nil {
				t.Fatal(err)
			}
			third := wsynctest.PushLife(t, h.st, 9, 0, 109)
			waitFor(t, "polled to the third life's v9", func() bool { poll(); return rec.last().blob == third })
			if s.skipped != nil {
				if got := s.skipped(src); got != before {
					t.Fatalf("Skipped went from %d to %d over a new life's v9 after v1 of another life, want no change", before, got)
				}
			}
		})
	}
}
