package reducer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// gatedStore commits each push and acknowledges version v only once
// release(v) is called: a cluster whose round trip to the standbys is
// longer than a step (a saturated primary).
type gatedStore struct {
	*ackStore
	mu    sync.Mutex
	gates map[uint64]chan struct{}
}

func (g *gatedStore) gate(v uint64) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[v] == nil {
		g.gates[v] = make(chan struct{})
	}
	return g.gates[v]
}

func (g *gatedStore) release(v uint64) { close(g.gate(v)) }

func (g *gatedStore) PushCommitted(ctx context.Context, req store.PushRequest) (store.Info, func(context.Context) error, error) {
	info, err := g.ackStore.Store.Push(ctx, req)
	if err != nil {
		return info, nil, err
	}
	ch := g.gate(req.Version)
	return info, func(ctx context.Context) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil
}

// TestPipelinedStepsStillCompactTheJournal: on a replicated store whose
// acknowledgement of each step arrives only once the next step is
// committed (a saturated primary: maxUnacked at work), a settled step
// always found a later one pending and the journal was never compacted
// (200 steps, a 512-byte threshold: 10 KB, 200 records). A compaction now
// keeps the pending step's record after its snapshot; a restart reads the
// journal back whole: every gradient applied before it is refused again.
func TestPipelinedStepsStillCompactTheJournal(t *testing.T) {
	mem, err := store.NewMemory(store.Config{Retain: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	pushModel(t, mem, "m", testLayout(3))
	gs := &gatedStore{ackStore: &ackStore{Store: mem}, gates: map[uint64]chan struct{}{}}
	stateDir := filepath.Join(t.TempDir(), "reducer")
	cfg := PrimaryConfig{Store: store.Owned{Store: gs, Owner: "reducer"}, Logger: testkit.Logger(), StateDir: stateDir, JournalCompactBytes: 512}
	p, err := NewPrimary(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := p.Register(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.Adam, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	sess, _, _ := p.Attach(ctx, Secondary{ID: "s"})
	const steps = 200
	snapshots, largest := 0, int64(0)
	// The state directory as a kill would leave it after a compaction
	// that carried a pending step's record: a snapshot through crashAt,
	// then the records of versions crashAt+1 (pending when compacted)
	// and crashAt+2.
	crashDir, crashAt := "", uint64(0)
	var crashBlob []byte // version crashAt
	for s := uint64(1); s <= steps; s++ {
		id := reduce.ID{Client: "c", Seq: s}
		if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
			t.Fatal(err)
		}
		if v, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(3, "c", s)}); err != nil || v != s+1 {
			t.Fatalf("step %d: v%d, %v", s, v, err)
		}
		// The step before is acknowledged only now, this one's awaited.
		if s >= 2 {
			gs.release(s)
			testkit.Eventually(t, 5*time.Second, "the step before settled", func() bool { return p.Stats().Models["m"].Version == s })
		}
		recs, err := ReadJournal(stateDir, "m")
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) > 0 && recs[0].Snapshot {
			snapshots++
		}
		if crashDir == "" && len(recs) == 3 && recs[0].Snapshot && recs[0].Version == s-1 && recs[1].Version == s && recs[2].Version == s+1 {
			crashDir, crashAt = filepath.Join(t.TempDir(), "reducer"), s-1
			if err := os.CopyFS(crashDir, os.DirFS(stateDir)); err != nil {
				t.Fatal(err)
			}
			snap, err := mem.Get(ctx, "m", crashAt)
			if err != nil {
				t.Fatal(err)
			}
			crashBlob = bytes.Clone(snap.Blob)
		}
		if fi, err := os.Stat(filepath.Join(stateDir, "m", journalName)); err == nil {
			largest = max(largest, fi.Size())
		}
	}
	if snapshots == 0 || largest > 4*512 || crashDir == "" {
		t.Fatalf("after %d pipelined steps with a 512-byte threshold: the journal started with a snapshot after %d, reached %d bytes, carried a pending record: %v",
			steps, snapshots, largest, crashDir != "")
	}
	gs.release(steps + 1)
	testkit.Eventually(t, 5*time.Second, "the last step settled", func() bool { return p.Stats().Models["m"].Version == steps+1 })
	p.Detach(sess)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p, err = NewPrimary(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ms := p.Stats().Models["m"]; ms.StateError != "" || ms.Version != steps+1 {
		t.Fatalf("restarted: v%d, state error %q", ms.Version, ms.StateError)
	}
	sess, _, _ = p.Attach(ctx, Secondary{ID: "t"})
	for _, s := range []uint64{1, steps / 2, steps - 1, steps} {
		if _, _, err := p.Admit(ctx, sess, "m", reduce.ID{Client: "c", Seq: s}, 0, 0); !errors.Is(err, errs.ErrExists) {
			t.Fatalf("seq %d, applied before the restart: admit says %v", s, err)
		}
	}

	// Killed then, and the carried step never published (a new primary's
	// store holds crashAt): its record is cut, its gradient (seq crashAt:
	// version v is seq v-1's step) taken again; the one before stays
	// applied.
	lost, err := store.NewMemory(store.Config{Retain: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer lost.Close()
	// It holds the reducer's claim too, replicated with the versions
	// (restore drops a registration whose model is not the reducer's).
	if _, err := lost.Push(ctx, store.PushRequest{Name: "m", Version: crashAt, Owner: "reducer", Claim: true, Blob: crashBlob}); err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.StateDir = store.Owned{Store: &ackStore{Store: lost}, Owner: "reducer"}, crashDir
	q, err := NewPrimary(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if ms := q.Stats().Models["m"]; ms.StateError != "" || ms.Version != crashAt {
		t.Fatalf("restarted at the carried record: v%d, state error %q (want v%d)", ms.Version, ms.StateError, crashAt)
	}
	qs, _, _ := q.Attach(ctx, Secondary{ID: "u"})
	if _, _, err := q.Admit(ctx, qs, "m", reduce.ID{Client: "c", Seq: crashAt - 1}, 0, 0); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("seq %d, published before the kill: admit says %v", crashAt-1, err)
	}
	if _, _, err := q.Admit(ctx, qs, "m", reduce.ID{Client: "c", Seq: crashAt}, 0, 0); err != nil {
		t.Fatalf("seq %d, of the step the kill left unpublished: admit says %v", crashAt, err)
	}
}
