package wsync

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// livesApplied is one version a lives test's collector applied.
type livesApplied struct {
	version, epoch, life uint64
	blob                 string
}

// livesRecorder records every version a collector applies.
type livesRecorder struct {
	mu      sync.Mutex
	applied []livesApplied
}

func (r *livesRecorder) apply(s *store.Snapshot) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, livesApplied{s.Version, s.Epoch, s.Life(), string(s.Blob)})
	return nil
}

func (r *livesRecorder) last() livesApplied {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) == 0 {
		return livesApplied{}
	}
	return r.applied[len(r.applied)-1]
}

func (r *livesRecorder) sawBlob(blob string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.applied {
		if a.blob == blob {
			return true
		}
	}
	return false
}

// startLivesFollower runs a Receiver on src (following lives or not) in a
// goroutine until the test ends.
func startLivesFollower(t *testing.T, src Source, follow bool, onApplied func(uint64)) *livesRecorder {
	t.Helper()
	r := &livesRecorder{}
	recv, err := NewReceiver(ReceiverConfig{Source: src, FollowLives: follow, Apply: r.apply, OnApplied: onApplied})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- recv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// gatedDialer is d whose dials (both kinds) wait while the gate is
// closed, and which keeps the sources it opened so a test can end them.
type gatedDialer struct {
	mu     sync.Mutex
	open   chan struct{} // closed: dials go ahead
	opened []io.Closer
}

func (g *gatedDialer) wrap(d Dialer) Dialer {
	g.open = make(chan struct{})
	close(g.open)
	keep := func(ctx context.Context, src Source, c io.Closer, err error) (Source, io.Closer, error) {
		if err == nil {
			g.mu.Lock()
			g.opened = append(g.opened, c)
			g.mu.Unlock()
		}
		return src, c, err
	}
	return Dialer{Name: d.Name,
		Dial: func(ctx context.Context, have uint64) (Source, io.Closer, error) {
			g.wait(ctx)
			src, c, err := d.Dial(ctx, have)
			return keep(ctx, src, c, err)
		},
		DialLives: func(ctx context.Context, have, life uint64) (Source, io.Closer, error) {
			g.wait(ctx)
			src, c, err := d.DialLives(ctx, have, life)
			return keep(ctx, src, c, err)
		},
	}
}

func (g *gatedDialer) wait(ctx context.Context) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
	}
}

// close closes the gate and returns the function that opens it again.
func (g *gatedDialer) close() (reopen func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.open = ch
	g.mu.Unlock()
	return func() { close(ch) }
}

// endSources ends every source opened so far (a stream cut: the Failover
// dials again).
func (g *gatedDialer) endSources() {
	g.mu.Lock()
	cs := g.opened
	g.opened = nil
	g.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// A model deleted and pushed again from version 1 (a training run
// restarted under the same name), followed by Go collectors on a
// Failover of the hub's push stream — the default for push and for
// clusters. One whose Failover and Receiver follow lives takes the new
// model's version 1 at once; before, Failover's versions only grew and it
// stayed on the deleted model's v5. A source it dials after a failure
// starts from the collector's version and its life, so a model deleted
// and pushed again while the stream was down is taken at once too. One
// that does not ask keeps today's rule, and fencing holds across lives:
// a new life at an older epoch than delivered is never delivered.
func TestFailoverFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	ctx := context.Background()
	h := startHub(t)
	for v := uint64(1); v <= 5; v++ {
		wsynctest.PushLife(t, h.st, v, 3, v)
	}
	conn := dial(t, h.addr)
	newFailover := func(follow bool, d Dialer) *Failover {
		f, err := NewFailover(FailoverConfig{Dialers: []Dialer{d}, FollowLives: follow, Backoff: 10 * time.Millisecond, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	var gate gatedDialer
	lf := newFailover(true, gate.wrap(PushDialer("push", conn, "lives", "m")))
	of := newFailover(false, PushDialer("push", conn, "older", "m"))
	lives := startLivesFollower(t, lf, true, lf.Running)
	older := startLivesFollower(t, of, false, of.Running)
	waitFor(t, "both collectors at v5", func() bool { return lives.last().version == 5 && older.last().version == 5 })
	oldLife := lives.last().life
	if oldLife == 0 {
		t.Fatal("v5 came with no life")
	}

	// A new life at an older epoch (a deposed primary's): never delivered.
	if err := h.st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	stale := wsynctest.PushLife(t, h.st, 1, 2, 101)
	fresh := wsynctest.PushLife(t, h.st, 2, 3, 102)
	waitFor(t, "the lives collector at the new life's v2", func() bool { return lives.last().blob == fresh })
	if got := lives.last(); got.life == oldLife || got.life == 0 || got.epoch != 3 {
		t.Fatalf("applied v%d epoch %d life %d (deleted life %d), want the new life's v2 at epoch 3", got.version, got.epoch, got.life, oldLife)
	}
	if lives.sawBlob(stale) {
		t.Fatal("the Failover delivered the new life's v1 of epoch 2 after delivering epoch 3")
	}
	if got := older.last(); got.version != 5 || got.life != oldLife {
		t.Fatalf("a collector not following lives applied v%d of life %d, want it still at the deleted life's v5 (today's rule)", got.version, got.life)
	}

	// Deleted and pushed again while the stream is down: the source dialed
	// next starts from v2 of the life the collector runs, and so is sent
	// the newest life's v1 at once.
	secondLife := lives.last().life
	reopen := gate.close()
	gate.endSources()
	if err := h.st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	third := wsynctest.PushLife(t, h.st, 1, 3, 103)
	reopen()
	waitFor(t, "the lives collector at the third life's v1", func() bool { return lives.last().blob == third })
	if got := lives.last(); got.life == secondLife || got.life == oldLife {
		t.Fatalf("the third life's v1 came as life %d, want a life other than %d and %d", got.life, secondLife, oldLife)
	}

	// The older collector still takes versions past the one it runs.
	var v6 string
	for v := uint64(2); v <= 6; v++ {
		v6 = wsynctest.PushLife(t, h.st, v, 3, 100+v)
	}
	waitFor(t, "the older collector past v5", func() bool { return older.last().version == 6 })
	waitFor(t, "the lives collector at the third life's v6", func() bool { return lives.last().blob == v6 })
}
