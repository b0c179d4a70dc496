package replica

import (
	"context"
	"errors"
	"fmt"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

// Fenced is the primary's store as every writer on the hub sees it (the
// hub's Config.WrapStore): each push carries the term's epoch as its
// writer epoch, commits with scans held off, waits for the standbys'
// acknowledgements (Source.Sync) and then checks the term in etcd before
// it is acknowledged. A push on a deposed primary, or one whose term
// check fails, returns an error (the refusal, or Unavailable when etcd
// cannot answer): it is never acknowledged.
type Fenced struct {
	store.Store
	// Epoch is the term's epoch.
	Epoch uint64
	// Source replicates; nil means no replication (Sync skipped).
	Source *Source
	// Check asks etcd whether the term still holds (cluster.Term.Check).
	Check func(ctx context.Context) error
	// Refusal is the answer once deposed (the node fills in the new
	// primary when it knows it); nil while this hub is the primary.
	Refusal func() *cluster.Refusal
	// Deposed is called when a check finds the term gone.
	Deposed func()
}

var (
	_ store.Lender      = (*Fenced)(nil)
	_ store.Claimer     = (*Fenced)(nil)
	_ store.Deleter     = (*Fenced)(nil)
	_ store.Prechecker  = (*Fenced)(nil)
	_ store.StatsReader = (*Fenced)(nil)
)

func (f *Fenced) refused() error {
	if f.Refusal != nil {
		if r := f.Refusal(); r != nil {
			return r
		}
	}
	return nil
}

// acknowledge is the common tail of every write: replicate, then check
// the term.
func (f *Fenced) acknowledge(ctx context.Context) error {
	if f.Source != nil {
		if err := f.Source.Sync(ctx); err != nil {
			if r := f.refused(); r != nil {
				return r // deposed while waiting
			}
			return err
		}
	}
	if f.Check == nil {
		return nil
	}
	if err := f.Check(ctx); err != nil {
		if errors.Is(err, cluster.ErrDeposed) {
			if f.Deposed != nil {
				f.Deposed()
			}
			if r := f.refused(); r != nil {
				return r
			}
			return cluster.NewRefusal(nil)
		}
		return fmt.Errorf("%w: term check before acknowledging: %v", errs.ErrUnavailable, err)
	}
	return nil
}

func (f *Fenced) commit(fn func() error) error {
	if f.Source == nil {
		return fn()
	}
	return f.Source.Commit(fn)
}

// Push writes req at the term's epoch (a client's own epoch is replaced:
// in a cluster the term is the fencing token).
func (f *Fenced) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	if r := f.refused(); r != nil {
		return store.Info{}, r
	}
	req.Epoch = f.Epoch
	var info store.Info
	err := f.commit(func() error {
		var err error
		info, err = f.Store.Push(ctx, req)
		return err
	})
	if err != nil {
		return info, err
	}
	return info, f.acknowledge(ctx)
}

// Claim implements store.Claimer (replicated like a push).
func (f *Fenced) Claim(ctx context.Context, name, owner string) error {
	c, ok := f.Store.(store.Claimer)
	if !ok {
		return nil
	}
	if r := f.refused(); r != nil {
		return r
	}
	if err := f.commit(func() error { return c.Claim(ctx, name, owner) }); err != nil {
		return err
	}
	return f.acknowledge(ctx)
}

// Release implements store.Claimer.
func (f *Fenced) Release(ctx context.Context, name, owner string) error {
	c, ok := f.Store.(store.Claimer)
	if !ok {
		return nil
	}
	if r := f.refused(); r != nil {
		return r
	}
	if err := f.commit(func() error { return c.Release(ctx, name, owner) }); err != nil {
		return err
	}
	return f.acknowledge(ctx)
}

// Delete implements store.Deleter.
func (f *Fenced) Delete(ctx context.Context, name string) error {
	d, ok := f.Store.(store.Deleter)
	if !ok {
		return fmt.Errorf("%w: this store cannot delete", errs.ErrInvalid)
	}
	if r := f.refused(); r != nil {
		return r
	}
	if err := f.commit(func() error { return d.Delete(ctx, name) }); err != nil {
		return err
	}
	return f.acknowledge(ctx)
}

// Lend implements store.Lender.
func (f *Fenced) Lend(ctx context.Context, name string, version uint64) (*store.Snapshot, func(), error) {
	return store.Borrow(ctx, f.Store, name, version)
}

// LendNewer implements store.Lender.
func (f *Fenced) LendNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, func(), error) {
	return store.BorrowNewer(ctx, f.Store, name, after)
}

// Precheck implements store.Prechecker.
func (f *Fenced) Precheck(name string, totalBytes uint64) error {
	if r := f.refused(); r != nil {
		return r
	}
	if p, ok := f.Store.(store.Prechecker); ok {
		return p.Precheck(name, totalBytes)
	}
	return nil
}

// Stats implements store.StatsReader.
func (f *Fenced) Stats() store.Stats {
	if s, ok := f.Store.(store.StatsReader); ok {
		return s.Stats()
	}
	return store.Stats{}
}
