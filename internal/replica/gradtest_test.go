package replica_test

import (
	"context"
	"sync"
	"testing"

	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
)

// seedVector pushes version 1 of model, four zeros, through the cluster.
func seedVector(c *testCluster, model string) {
	c.t.Helper()
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{0, 0, 0, 0}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.push(model, 1, 0, blob)
}

// versionWatch records the versions of a model a store client following
// the cluster sees (its Watch resumed after each failover).
type versionWatch struct {
	mu     sync.Mutex
	seen   []uint64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func watchVersions(ctx context.Context, sc *storerpc.Client, model string) *versionWatch {
	w := &versionWatch{}
	ctx, w.cancel = context.WithCancel(ctx)
	w.wg.Go(func() {
		after := uint64(0)
		for ctx.Err() == nil {
			_ = sc.Watch(ctx, model, after, func(s *store.Snapshot, _ uint64) error {
				w.mu.Lock()
				defer w.mu.Unlock()
				w.seen = append(w.seen, s.Version)
				after = s.Version
				return nil
			})
		}
	})
	return w
}

// newest is the newest version seen (0: none).
func (w *versionWatch) newest() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		return 0
	}
	return w.seen[len(w.seen)-1]
}

// stop ends the watch and fails t if a version did not grow.
func (w *versionWatch) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	w.wg.Wait()
	for i := 1; i < len(w.seen); i++ {
		if w.seen[i] <= w.seen[i-1] {
			t.Errorf("the watcher saw version %d after %d", w.seen[i], w.seen[i-1])
		}
	}
}

// appliedOnce is the set of gradients a journal applied; one applied
// twice fails t.
func appliedOnce(t *testing.T, steps []reducer.JournalStep) map[reduce.ID]bool {
	t.Helper()
	applied := map[reduce.ID]bool{}
	for _, s := range steps {
		for _, id := range s.Members {
			if applied[id] {
				t.Errorf("gradient %v applied twice", id)
			}
			applied[id] = true
		}
	}
	return applied
}
