package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// livesCollector is a Go collector on a push stream (to the hub or a
// relay) that records every version it applies.
type livesCollector struct {
	mu      sync.Mutex
	applied []appliedVersion
}

type appliedVersion struct {
	version, epoch, life uint64
	blob                 string
}

func (c *livesCollector) last() appliedVersion {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.applied) == 0 {
		return appliedVersion{}
	}
	return c.applied[len(c.applied)-1]
}

func (c *livesCollector) all() []appliedVersion {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]appliedVersion(nil), c.applied...)
}

// startLivesCollector attaches to addr and follows model "m", following
// lives or not.
func startLivesCollector(t *testing.T, addr, id string, follow bool) *livesCollector {
	t.Helper()
	cl, err := wsync.Attach(context.Background(), wsync.ClientConfig{Conn: dial(t, addr), CollectorID: id, Model: "m", FollowLives: follow, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return runLivesCollector(t, cl, follow, nil, cl.Close)
}

// runLivesCollector runs a receiver on src (following lives or not,
// calling onApplied if set) that records what it applies, until the test
// ends; then it closes src with closeSrc.
func runLivesCollector(t *testing.T, src wsync.Source, follow bool, onApplied func(uint64), closeSrc func() error) *livesCollector {
	t.Helper()
	c := &livesCollector{}
	recv, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: src, FollowLives: follow, OnApplied: onApplied, Apply: func(s *store.Snapshot) error {
		c.mu.Lock()
		c.applied = append(c.applied, appliedVersion{s.Version, s.Epoch, s.Life(), string(s.Blob)})
		c.mu.Unlock()
		return nil
	}})
	if err != nil {
		closeSrc()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- recv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		closeSrc()
	})
	return c
}

// startSegmentRelay is a relay (id) with a segment at path, its upstream a
// hub on the data plane over a memory store st that holds v1 to v5 of
// model "m" (wsynctest.PushLife 1 to 5), once the segment holds v5. dataPlane: the
// relay takes versions over the data plane.
func startSegmentRelay(t *testing.T, id string, dataPlane bool) (st *store.Memory, relay *Relay, path string) {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	addr := dataPlaneHub(t, st)
	for v := uint64(1); v <= 5; v++ {
		wsynctest.PushLife(t, st, v, 0, v)
	}
	path = wsynctest.ShmPath(t)
	cfg := Config{Upstream: dial(t, addr), Model: "m", ID: id, ShmPath: path, Logger: quiet()}
	if dataPlane {
		cfg.UpstreamAddr = addr
	}
	relay = runRelay(t, cfg)
	waitSegment(t, path, 5)
	return st, relay, path
}

// A model deleted and pushed again from version 1 (`rlhub model rm`, then
// a training run restarted under the same name). Collectors that follow
// lives — one on the hub's push stream, one on a relay's, through the
// relay's own push stream upstream — take the new model's version 1 at
// once; before, every follower kept the deleted model's v5 until the new
// model's versions passed it. A collector that does not ask (an older
// client) keeps today's rule: it waits for a version past 5. Fencing
// still holds across lives: the relay refuses a new life's version of an
// older epoch than the one it serves (a deposed primary's, in a cluster,
// where every later write carries a larger epoch), and takes the new
// life once its epoch is not older.
func TestFollowersTakeAModelDeletedAndPushedAgainAtOnce(t *testing.T) {
	ctx := context.Background()
	h := startHub(t)
	for v := uint64(1); v <= 5; v++ {
		wsynctest.PushLife(t, h.st, v, 3, v)
	}
	relay := runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-a", Logger: quiet()})
	direct := startLivesCollector(t, h.addr, "direct", true)
	local := startLivesCollector(t, relay.Addr(), "local", true)
	older := startLivesCollector(t, h.addr, "older", false)
	for _, c := range []*livesCollector{direct, local, older} {
		waitFor(t, "every collector at v5", func() bool { return c.last().version == 5 })
	}
	oldLife := direct.last().life
	if oldLife == 0 || local.last().life != oldLife {
		t.Fatalf("v5's life: %d on the hub's stream, %d through the relay; want the same known life", oldLife, local.last().life)
	}

	if err := h.st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	// A new life at an older epoch than the relay serves: refused there.
	stale := wsynctest.PushLife(t, h.st, 1, 2, 101)
	waitFor(t, "the hub's collector at the new v1", func() bool { return direct.last().blob == stale })
	fresh := wsynctest.PushLife(t, h.st, 2, 3, 102)
	want := appliedVersion{version: 2, epoch: 3, blob: fresh}
	for name, c := range map[string]*livesCollector{"direct": direct, "local": local} {
		waitFor(t, name+" at the new v2", func() bool { return c.last().blob == fresh })
		got := c.last()
		if got.life == oldLife || got.life == 0 || got.version != want.version || got.epoch != want.epoch {
			t.Fatalf("%s: applied version %d epoch %d life %d (deleted life %d), want the new life's v2 at epoch 3", name, got.version, got.epoch, got.life, oldLife)
		}
	}
	for _, a := range local.all() {
		if a.blob == stale {
			t.Fatalf("the relay republished the new life's v1 of epoch 2 after serving epoch 3: %v", fmt.Sprint(a.version, "/", a.epoch))
		}
	}
	if l := older.last(); l.version != 5 {
		t.Fatalf("a collector not following lives applied version %d of life %d, want it still at v5 (today's rule)", l.version, l.life)
	}
	for v := uint64(3); v <= 6; v++ {
		wsynctest.PushLife(t, h.st, v, 3, 100+v)
	}
	waitFor(t, "the older collector past v5", func() bool { return older.last().version == 6 })
	waitFor(t, "the relay's collector at the new v6", func() bool { return local.last().version == 6 })
}

// startShmLivesCollector follows the relay's segment at path, then its
// push stream, through a Failover, following lives or not, and records
// what it applies.
func startShmLivesCollector(t *testing.T, path, relayAddr, id string, follow bool) (*livesCollector, *wsync.Failover) {
	t.Helper()
	f, err := wsync.NewFailover(wsync.FailoverConfig{Dialers: []wsync.Dialer{wsync.ShmDialer("relay-shm", path, "m"),
		wsync.PushDialer("relay-stream", dial(t, relayAddr), id, "m")}, FollowLives: follow, Backoff: 10 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return runLivesCollector(t, f, follow, f.Running, f.Close), f
}

// A model deleted and pushed again from version 1, followed by a relay
// into its shared-memory segment (from the upstream's push stream or its
// data plane) and by local collectors reading that segment. The relay
// starts a new segment for the new life (the segment names its life,
// docs/shm-layout.md), so a collector that follows lives takes the new
// model's v1 at once, from shared memory; before, the segment refused the
// new life's lower versions and kept the deleted model's v5, and its
// collectors stayed on it (and a Failover that follows lives, on the
// stream, could probe back to it, its versions being of no known life).
// A collector that does not follow lives keeps the older rule: it waits
// for a version past 5.
func TestRelaySegmentFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	for _, dataPlane := range []bool{false, true} {
		t.Run(fmt.Sprintf("dataPlane=%v", dataPlane), func(t *testing.T) {
			ctx := context.Background()
			st, relay, path := startSegmentRelay(t, "relay-shm-lives", dataPlane)
			lives, lf := startShmLivesCollector(t, path, relay.Addr(), "lives", true)
			older, of := startShmLivesCollector(t, path, relay.Addr(), "older", false)
			waitFor(t, "both collectors at v5 from the segment", func() bool {
				return lives.last().version == 5 && older.last().version == 5 && lf.Current() == "relay-shm" && of.Current() == "relay-shm"
			})
			oldLife := lives.last().life
			if oldLife == 0 {
				t.Fatal("v5 from the segment came with no life")
			}

			if err := st.Delete(ctx, "m"); err != nil {
				t.Fatal(err)
			}
			fresh := wsynctest.PushLife(t, st, 1, 0, 101)
			waitFor(t, "the lives collector at the new model's v1", func() bool { return lives.last().blob == fresh })
			if got := lives.last(); got.version != 1 || got.life == oldLife || got.life == 0 {
				t.Fatalf("applied v%d of life %d (deleted life %d), want the new life's v1", got.version, got.life, oldLife)
			}
			waitFor(t, "the lives collector on the segment", func() bool { return lf.Current() == "relay-shm" })
			r, err := shm.Open(shm.ReaderConfig{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			segLife := r.Life()
			r.Close()
			if segLife != lives.last().life {
				t.Fatalf("the relay's segment names life %d, want the new life %d", segLife, lives.last().life)
			}
			if got := older.last(); got.version != 5 || got.life != oldLife {
				t.Fatalf("a collector not following lives applied v%d of life %d, want the deleted model's v5 (the older rule)", got.version, got.life)
			}
			var v6 string
			for v := uint64(2); v <= 6; v++ {
				v6 = wsynctest.PushLife(t, st, v, 0, 100+v)
			}
			waitFor(t, "both collectors at the new model's v6", func() bool { return lives.last().blob == v6 && older.last().blob == v6 })
		})
	}
}

// A relay on the data plane with a segment copies a version onto its
// board (for its stream collectors) only while one waits, else on demand
// (materialize). A model deleted and pushed again while no stream
// collector waits lands in a new segment only; a stream collector that
// attaches afterwards (following lives or not: it runs nothing yet) gets
// the new model's v1. Before, the relay copied the segment onto the board
// only when the segment's version was above the board's, so the board kept
// the deleted model's v5 and handed it out, and a collector of v5 waited
// for the new model's versions to pass it.
func TestRelayStreamGetsANewLifeThatLandedInItsSegmentOnly(t *testing.T) {
	ctx := context.Background()
	st, relay, path := startSegmentRelay(t, "relay-mat", true)

	// A stream collector takes v5 (the board gets it from the segment),
	// then leaves: nobody waits on the board.
	cl, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dial(t, relay.Addr()), CollectorID: "first", Model: "m", FollowLives: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	first, err := cl.WaitNewer(wctx, 0)
	cancel()
	cl.Close()
	if err != nil || first.Version != 5 {
		t.Fatalf("first stream collector: %v, %v; want v5", first, err)
	}
	waitFor(t, "the first stream collector detached", func() bool {
		for _, ms := range relay.Service().Tracker().Status("m") {
			for _, c := range ms.Collectors {
				if c.Attached {
					return false
				}
			}
		}
		return true
	})

	if err := st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	fresh := wsynctest.PushLife(t, st, 1, 0, 101)
	waitSegment(t, path, 1)
	for _, follow := range []bool{true, false} {
		late := startLivesCollector(t, relay.Addr(), fmt.Sprintf("late-%v", follow), follow)
		waitFor(t, "the late collector applied a version", func() bool { return late.last().version != 0 })
		if got := late.all()[0]; got.blob != fresh {
			t.Fatalf("follow lives %v: the late stream collector first applied v%d of life %d, want the new model's v1", follow, got.version, got.life)
		}
	}
}
