package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// etcdTimeout bounds each etcd read a write makes (the standbys before
// it, the term check after): with etcd unreachable the write fails
// within it instead of waiting for etcd.
const etcdTimeout = 2 * time.Second

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

// prepare is the common head of every write: refuse when deposed, and
// read (from etcd) the standbys the write will wait for, which fails
// before anything changes when etcd is unreachable or the term is gone.
func (f *Fenced) prepare(ctx context.Context) ([]string, error) {
	if r := f.refused(); r != nil {
		return nil, r
	}
	if f.Source == nil {
		return nil, nil
	}
	pctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	standbys, err := f.Source.Prepare(pctx)
	if err != nil {
		return nil, f.termError(err, "before writing")
	}
	return standbys, nil
}

// termError turns a failed etcd read or term check into the write's
// error: the refusal when deposed, Unavailable otherwise.
func (f *Fenced) termError(err error, when string) error {
	if errors.Is(err, cluster.ErrDeposed) {
		if f.Deposed != nil {
			f.Deposed()
		}
		if r := f.refused(); r != nil {
			return r
		}
		return cluster.NewRefusal(nil)
	}
	return fmt.Errorf("%w: cluster: etcd cannot confirm this hub's term %s (nothing is acknowledged): %v", errs.ErrUnavailable, when, err)
}

// acknowledge is the common tail of every write: replicate, then check
// the term.
func (f *Fenced) acknowledge(ctx context.Context, standbys []string) error {
	if f.Source != nil {
		if err := f.Source.Sync(ctx, standbys); err != nil {
			if r := f.refused(); r != nil {
				return r // deposed while waiting
			}
			return err
		}
	}
	if f.Check == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	if err := f.Check(cctx); err != nil {
		return f.termError(err, "before acknowledging")
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
	standbys, err := f.prepare(ctx)
	if err != nil {
		return store.Info{}, err
	}
	req.Epoch = f.Epoch
	var info store.Info
	err = f.commit(func() error {
		var err error
		info, err = f.Store.Push(ctx, req)
		return err
	})
	if err != nil {
		return info, err
	}
	return info, f.acknowledge(ctx, standbys)
}

// Claim implements store.Claimer (replicated like a push).
func (f *Fenced) Claim(ctx context.Context, name, owner string) error {
	c, ok := f.Store.(store.Claimer)
	if !ok {
		return nil
	}
	standbys, err := f.prepare(ctx)
	if err != nil {
		return err
	}
	if err := f.commit(func() error { return c.Claim(ctx, name, owner) }); err != nil {
		return err
	}
	return f.acknowledge(ctx, standbys)
}

// Release implements store.Claimer.
func (f *Fenced) Release(ctx context.Context, name, owner string) error {
	c, ok := f.Store.(store.Claimer)
	if !ok {
		return nil
	}
	standbys, err := f.prepare(ctx)
	if err != nil {
		return err
	}
	if err := f.commit(func() error { return c.Release(ctx, name, owner) }); err != nil {
		return err
	}
	return f.acknowledge(ctx, standbys)
}

// Delete implements store.Deleter.
func (f *Fenced) Delete(ctx context.Context, name string) error {
	d, ok := f.Store.(store.Deleter)
	if !ok {
		return fmt.Errorf("%w: this store cannot delete", errs.ErrInvalid)
	}
	standbys, err := f.prepare(ctx)
	if err != nil {
		return err
	}
	if err := f.commit(func() error { return d.Delete(ctx, name) }); err != nil {
		return err
	}
	return f.acknowledge(ctx, standbys)
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
