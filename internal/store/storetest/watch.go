package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
)

// Watcher is the store client a VersionWatch follows: a
// storerpc.Client (not imported here, since storerpc's own tests use
// this package).
type Watcher interface {
	Watch(ctx context.Context, name string, after uint64, fn func(snap *store.Snapshot, skipped uint64) error) error
}

// VersionSeen is one version a VersionWatch saw: its number, its epoch
// and when it arrived.
type VersionSeen struct {
	Version, Epoch uint64
	At             time.Time
}

// VersionWatch records the versions of a model that a store client
// following a cluster sees, its Watch resumed after each failure (a
// failover) from the newest version seen. Its goroutine ends at Stop.
type VersionWatch struct {
	mu     sync.Mutex
	seen   []VersionSeen
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// WatchVersions starts watching model through c.
func WatchVersions(ctx context.Context, c Watcher, model string) *VersionWatch {
	w := &VersionWatch{}
	ctx, w.cancel = context.WithCancel(ctx)
	w.wg.Go(func() {
		after := uint64(0)
		for ctx.Err() == nil {
			_ = c.Watch(ctx, model, after, func(s *store.Snapshot, _ uint64) error {
				w.mu.Lock()
				defer w.mu.Unlock()
				w.seen = append(w.seen, VersionSeen{s.Version, s.Epoch, time.Now()})
				after = s.Version
				return nil
			})
		}
	})
	return w
}

// Newest is the newest version seen (0: none).
func (w *VersionWatch) Newest() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		return 0
	}
	return w.seen[len(w.seen)-1].Version
}

// FirstOfEpoch is the first version seen of epoch, or false.
func (w *VersionWatch) FirstOfEpoch(epoch uint64) (VersionSeen, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.seen {
		if s.Epoch == epoch {
			return s, true
		}
	}
	return VersionSeen{}, false
}

// Stop ends the watch and fails t if a version did not grow or an epoch
// fell.
func (w *VersionWatch) Stop(t testing.TB) {
	t.Helper()
	w.cancel()
	w.wg.Wait()
	for i := 1; i < len(w.seen); i++ {
		if w.seen[i].Version <= w.seen[i-1].Version || w.seen[i].Epoch < w.seen[i-1].Epoch {
			t.Errorf("the watcher saw v%d (epoch %d) after v%d (epoch %d)", w.seen[i].Version, w.seen[i].Epoch, w.seen[i-1].Version, w.seen[i-1].Epoch)
		}
	}
}
