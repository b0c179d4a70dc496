package wsync

import (
	"context"
	"sync"

	"github.com/rlhub/rlhub/internal/store"
)

// Board is the in-process transport: the newest published snapshot of one
// model, handed to every reader by pointer, so no byte is copied per
// reader. Publish never waits for readers; a reader that was busy gets the
// newest version when it asks again.
//
// The zero value is not usable; call NewBoard.
type Board struct {
	name string

	mu      sync.Mutex
	cur     *store.Snapshot // guarded by mu; nil before the first Publish
	changed chan struct{}   // closed and replaced on every Publish; guarded by mu
	closed  bool
}

var (
	_ Source     = (*Board)(nil)
	_ LifeSource = (*Board)(nil)
	_ Publisher  = (*Board)(nil)
)

// NewBoard returns an empty board for the model name ("" accepts any name).
func NewBoard(name string) *Board {
	return &Board{name: name, changed: make(chan struct{})}
}

// Publish makes snap the newest version. snap must not be modified
// afterwards (readers share it). A version not newer than the current one
// is refused with an *errs.StaleError, unless it is of another life
// (newLife: the model deleted and pushed again), whose versions start
// afresh.
func (b *Board) Publish(_ context.Context, snap *store.Snapshot) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("board")
	}
	if b.name != "" && snap.Name != b.name {
		return errWrongModel(b.name, snap.Name)
	}
	if b.cur != nil && snap.Version <= b.cur.Version && !newLife(snap, b.cur.Life()) {
		return staleErr(snap.Name, b.cur.Version, snap.Version)
	}
	b.cur = snap
	close(b.changed)
	b.changed = make(chan struct{})
	return nil
}

// Newest returns the newest snapshot or nil.
func (b *Board) Newest() *store.Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur
}

// GetIfNewer implements Source.
func (b *Board) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return b.GetIfNewerLife(ctx, than, 0)
}

// GetIfNewerLife implements LifeSource.
func (b *Board) GetIfNewerLife(_ context.Context, than, life uint64) (*store.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil && (b.cur.Version > than || newLife(b.cur, life)) {
		return b.cur, nil
	}
	if b.closed {
		return nil, errClosed("board")
	}
	return nil, nil
}

// WaitNewer implements Source. After Close it fails with
// errs.ErrUnavailable once nothing newer is left.
func (b *Board) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return b.WaitNewerLife(ctx, after, 0)
}

// WaitNewerLife implements LifeSource.
func (b *Board) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	for {
		b.mu.Lock()
		cur, ch, closed := b.cur, b.changed, b.closed
		b.mu.Unlock()
		if cur != nil && (cur.Version > after || newLife(cur, life)) {
			return cur, nil
		}
		if closed {
			return nil, errClosed("board")
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close wakes every waiter; later waits fail with errs.ErrUnavailable.
// Safe to call twice.
func (b *Board) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.changed)
	}
	return nil
}

// newLife reports whether snap is of another life than life, both known
// (not 0): the model deleted and pushed again, whose versions start afresh
// (store.Snapshot.Life, docs/weight-sync.md "Lives").
func newLife(snap *store.Snapshot, life uint64) bool {
	return store.OtherLife(snap.Life(), life)
}
