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

// GetIfNewer implements Source.
func (s StoreSource) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return s.Store.GetIfNewer(ctx, s.Name, than)
}

// WaitNewer implements Source.
func (s StoreSource) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return s.Store.WaitNewer(ctx, s.Name, after)
}

// WaitNewerLife implements LifeSource: the store's WaitNewerLife when it
// has one (StoreLifeReader), else WaitNewer (versions only grow).
func (s StoreSource) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	if lr, ok := s.Store.(StoreLifeReader); ok {
		return lr.WaitNewerLife(ctx, s.Name, after, life)
	}
	return s.Store.WaitNewer(ctx, s.Name, after)
}
