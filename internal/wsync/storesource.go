package wsync

import (
	"context"

	"github.com/rlhub/rlhub/internal/store"
)

// StoreReader is the part of the model store a StoreSource needs:
// store.Store has it, and so does a client of the store service.
type StoreReader interface {
	GetIfNewer(ctx context.Context, name string, than uint64) (*store.Snapshot, error)
	WaitNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, error)
}

// StoreSource is the remote pull / watch transport: a Source over one
// model of a store, "only if newer". Snapshots are the store's own.
type StoreSource struct {
	Store StoreReader
	Name  string
}

var (
	_ Source     = StoreSource{}
	_ LifeSource = StoreSource{}
)

// StoreLifeReader is a StoreReader that follows lives (a store client's
// WaitNewerLife, storerpc.Client).
type StoreLifeReader interface {
	WaitNewerLife(ctx context.Context, name string, after, life uint64) (*store.Snapshot, error)
}

// StoreLifePoller is a StoreReader whose "if newer" follows lives (a
// store client's GetIfNewerLife, storerpc.Client): it also returns the
// newest version when it is of another life than life (the life of
// version than; 0: unknown), though it is not newer.
type StoreLifePoller interface {
	GetIfNewerLife(ctx context.Context, name string, than, life uint64) (*store.Snapshot, error)
}

// GetIfNewer implements Source.
func (s StoreSource) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return s.Store.GetIfNewer(ctx, s.Name, than)
}

// GetIfNewerLife implements LifeSource: the store's GetIfNewerLife when it
// has one (StoreLifePoller: a store client); on an in-process store that
// numbers lives (store.LifeReader) the newest, read whole only when its
// life is not life; else GetIfNewer (versions only grow).
func (s StoreSource) GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error) {
	if lp, ok := s.Store.(StoreLifePoller); ok {
		return lp.GetIfNewerLife(ctx, s.Name, than, life)
	}
	lr, ok := s.Store.(store.LifeReader)
	if life == 0 || !ok {
		return s.Store.GetIfNewer(ctx, s.Name, than)
	}
	if _, now, err := lr.NewestLife(s.Name); err != nil || now == life {
		return s.Store.GetIfNewer(ctx, s.Name, than) // its errors are GetIfNewer's
	}
	// Another life: its newest, whatever its number (0: any newest).
	snap, err := s.Store.GetIfNewer(ctx, s.Name, 0)
	if err != nil || snap == nil || snap.Version > than || newLife(snap, life) {
		return snap, err
	}
	return nil, nil // the life read was not the newest's (deleted again, or a stale read)
}

// WaitNewer implements Source.
func (s StoreSource) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return s.Store.WaitNewer(ctx, s.Name, after)
}

// WaitNewerLife implements LifeSource: the store's WaitNewerLife when it
// has one (StoreLifeReader: a store client); on an in-process store that
// numbers lives (store.LifeWaiter, or store.LifeReader: a cluster
// primary's replica.Fenced) store.BorrowNewerLife, which returns another
// life's newest at once (within store.LifePoll on a LifeReader); else
// WaitNewer (versions only grow).
func (s StoreSource) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	if lr, ok := s.Store.(StoreLifeReader); ok {
		return lr.WaitNewerLife(ctx, s.Name, after, life)
	}
	if life != 0 && numbersLives(s.Store) {
		// Never released: the snapshot stays the caller's for good, as
		// WaitNewer's does (a lent version that is never given back is
		// never handed back to the store's buffers either).
		snap, _, err := store.BorrowNewerLife(ctx, s.Store, s.Name, after, life)
		return snap, err
	}
	return s.Store.WaitNewer(ctx, s.Name, after)
}

// numbersLives reports whether r, an in-process store, numbers its
// models' lives (store.BorrowNewerLife can follow them).
func numbersLives(r StoreReader) bool {
	_, waits := r.(store.LifeWaiter)
	_, reads := r.(store.LifeReader)
	return waits || reads
}
