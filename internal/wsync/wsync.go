package wsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Source yields whole versions of one model. Every implementation is safe
// for concurrent use unless it says otherwise.
//
// A returned Snapshot is immutable. Unless the Source documents otherwise
// it stays valid forever; shm.Reader reuses memory and documents for how
// long its snapshots stay valid.
type Source interface {
	// GetIfNewer returns the newest version if it is newer than `than`,
	// or (nil, nil) when it is not.
	GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error)
	// WaitNewer blocks until a version newer than `after` exists and
	// returns the newest one, or returns an error (ctx's, or the
	// transport's: errs.ErrUnavailable when the sender is gone).
	WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error)
}

// LifeSource is a Source that follows a model's lives (docs/weight-sync.md,
// "Lives"): WaitNewerLife is WaitNewer that also returns the newest
// version when it is of another life than life, the life of version after
// (store.Snapshot.Life; 0: unknown, as WaitNewer), though it is not newer:
// the model was deleted and pushed again. Over the network it returns such
// a version only when the sender was asked to follow lives (the push
// stream's ClientConfig.FollowLives, a store client's WaitNewerLife).
// GetIfNewerLife is GetIfNewer on the same terms: it also returns the
// newest version when it is of another life than life, the life of
// version than, though it is not newer (Receiver.Poll with
// ReceiverConfig.FollowLives).
type LifeSource interface {
	WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error)
	GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error)
}

// Releaser is a Source whose snapshots hold something of the sender's (a
// leasing shm.Reader: a slot of the segment, which the writer avoids
// while it is held). Release gives it back; the snapshot the source
// returned last must not be read afterwards. A Receiver with an Apply
// releases right after each apply, since the version is then in the
// collector's own weights: a leasing shm reader with CopyInto is one copy,
// straight from the slot into the weights.
type Releaser interface {
	Release()
}

// Publisher is the sender side of a transport: it makes a version visible
// to that transport's receivers. Publishing a version that is not newer
// than the one published is refused with an *errs.StaleError and changes
// nothing.
type Publisher interface {
	Publish(ctx context.Context, snap *store.Snapshot) error
}

// ApplyFunc installs a version into a collector's weights. A Receiver calls
// it from one goroutine at a time, only with versions newer than the last
// one applied. If it returns an error the receiver keeps its old version.
type ApplyFunc func(snap *store.Snapshot) error

// ReceiverConfig configures a Receiver.
type ReceiverConfig struct {
	// Source is where versions come from. Required.
	Source Source
	// Apply installs a version; nil means the receiver only keeps the
	// snapshot (see Receiver.Current), which is how a collector that reads
	// weights straight from the snapshot runs.
	Apply ApplyFunc
	// Start is the version the collector already runs (after a restart
	// that kept its weights); 0 means none.
	Start uint64
	// OnApplied, if set, is called after each applied version (for
	// reporting); it must not block.
	OnApplied func(version uint64)
	// FollowLives applies a version of another life than the running one
	// (store.Snapshot.Life, both known) though it is not newer: the model
	// deleted and pushed again (docs/weight-sync.md, "Lives"). Run then
	// waits with WaitNewerLife, and Poll asks with GetIfNewerLife, when
	// Source is a LifeSource. false: only newer versions are applied.
	FollowLives bool
	// StartLife is the life of Start (0: unknown).
	StartLife uint64
}

func (c *ReceiverConfig) validate() error {
	if c.Source == nil {
		return errors.New("wsync: ReceiverConfig.Source is nil")
	}
	return nil
}

// Receiver applies the newest version from a Source to a collector's
// weights. Poll, Offer and Run may be called from any goroutine; applies
// are serialized. With an Apply over a Source that leases what it returns
// (a Releaser: the shm reader, by default, or a Failover on one), one Poll
// or Run at a time calls the source, and another fails with
// ErrSourceInUse: a source call that returns a newer version moves the
// source's one lease, and the version an apply was still copying could be
// overwritten under it.
type Receiver struct {
	cfg ReceiverConfig

	mu      sync.Mutex // serializes applies; guards cur
	cur     *store.Snapshot
	version atomic.Uint64
	life    atomic.Uint64 // the running version's life (0: unknown); written under mu
	// leasing is held by the Poll or Run calling a leasing source
	// (Receiver's comment); only TryLock is used on it.
	leasing sync.Mutex
}

// ErrSourceInUse is Poll's or Run's error when another Poll or Run is
// calling the receiver's leasing source (Receiver).
var ErrSourceInUse = fmt.Errorf("%w: wsync: another Poll or Run is calling this receiver's leasing source (one at a time: a newer version it returns moves the lease under the other's apply)", errs.ErrInvalid)

// holdSource takes the receiver's leasing source for one caller when the
// receiver copies from a source that leases; release gives it back.
func (r *Receiver) holdSource() (release func(), err error) {
	if _, ok := r.cfg.Source.(Releaser); !ok || r.cfg.Apply == nil {
		return func() {}, nil
	}
	if !r.leasing.TryLock() {
		return nil, ErrSourceInUse
	}
	return r.leasing.Unlock, nil
}

// NewReceiver returns a receiver running cfg.Start.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Receiver{cfg: cfg}
	r.version.Store(cfg.Start)
	r.life.Store(cfg.StartLife)
	return r, nil
}

// Version is the version the collector runs (0 before the first).
func (r *Receiver) Version() uint64 { return r.version.Load() }

// Life is the life of the version the collector runs (store.Snapshot.Life;
// 0: unknown).
func (r *Receiver) Life() uint64 { return r.life.Load() }

// Current is the last applied snapshot, or nil. With a shm.Reader source it
// is valid only as long as shm.Reader documents (a leasing reader's: until
// the source's next call that returns a newer version, or its Close). With
// an Apply over a Releaser source (a leasing shm reader, or a Failover on
// one) the source's snapshot was released after the apply: Current then
// has the version's name, version, epoch, metadata and creation time but
// no Blob or Tensors (the bytes are in the collector's weights).
func (r *Receiver) Current() *store.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Offer applies snap if it is newer than the running version (or, with
// ReceiverConfig.FollowLives, of another life) and reports whether it did.
// The same or an older version is a no-op (false, nil).
func (r *Receiver) Offer(snap *store.Snapshot) (bool, error) {
	return r.offer(snap, false)
}

// offer is Offer; fromSource says snap came from the Source, which is
// then released after the apply when it is a Releaser and the receiver
// copies (Apply set): whether or not the version was applied, the
// collector no longer needs the source's copy.
func (r *Receiver) offer(snap *store.Snapshot, fromSource bool) (bool, error) {
	if snap == nil {
		return false, nil
	}
	rel, _ := r.cfg.Source.(Releaser)
	if !fromSource || r.cfg.Apply == nil {
		rel = nil
	}
	if rel != nil {
		defer rel.Release()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if snap.Version <= r.version.Load() && !(r.cfg.FollowLives && newLife(snap, r.life.Load())) {
		return false, nil
	}
	if r.cfg.Apply != nil {
		if err := r.cfg.Apply(snap); err != nil {
			return false, fmt.Errorf("wsync: apply version %d of %q: %w", snap.Version, snap.Name, err)
		}
	}
	r.cur = snap
	if rel != nil {
		r.cur = store.WithLife(&store.Snapshot{Name: snap.Name, Version: snap.Version, Epoch: snap.Epoch, Seq: snap.Seq,
			Metadata: snap.Metadata, Created: snap.Created}, snap.Life())
	}
	r.version.Store(snap.Version)
	r.life.Store(snap.Life())
	if r.cfg.OnApplied != nil {
		r.cfg.OnApplied(snap.Version)
	}
	return true, nil
}

// Poll asks the source for the newest version if it is newer than the
// running one (or, with ReceiverConfig.FollowLives and a LifeSource, of
// another life) and applies it. It reports whether a version was applied.
func (r *Receiver) Poll(ctx context.Context) (bool, error) {
	release, err := r.holdSource()
	if err != nil {
		return false, err
	}
	defer release()
	var snap *store.Snapshot
	if ls, ok := r.cfg.Source.(LifeSource); ok && r.cfg.FollowLives {
		snap, err = ls.GetIfNewerLife(ctx, r.Version(), r.Life())
	} else {
		snap, err = r.cfg.Source.GetIfNewer(ctx, r.Version())
	}
	if err != nil || snap == nil {
		return false, err
	}
	return r.offer(snap, true)
}

// Run follows the source, applying each newest version, until ctx is done
// (it then returns ctx.Err()) or the source or Apply fails.
func (r *Receiver) Run(ctx context.Context) error {
	release, err := r.holdSource()
	if err != nil {
		return err
	}
	defer release()
	ls, lives := r.cfg.Source.(LifeSource)
	lives = lives && r.cfg.FollowLives
	for {
		var snap *store.Snapshot
		if lives {
			snap, err = ls.WaitNewerLife(ctx, r.Version(), r.Life())
		} else {
			snap, err = r.cfg.Source.WaitNewer(ctx, r.Version())
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if _, err := r.offer(snap, true); err != nil {
			return err
		}
	}
}

// CopyInto returns an ApplyFunc that copies each version's tensors into
// dst, a collector's own weights, in place (like load_state_dict). A
// version whose tensor names, dtypes or shapes differ from dst is refused
// with errs.ErrInvalid before any byte is copied.
//
// Readers of dst running concurrently with an apply may see a mix of two
// versions; collectors that need whole versions while running read
// Receiver.Current instead, or apply between steps.
func CopyInto(dst *tensor.StateDict) ApplyFunc {
	return func(snap *store.Snapshot) error {
		if snap.Tensors == nil {
			return fmt.Errorf("%w: version %d has no decoded tensors", errs.ErrInvalid, snap.Version)
		}
		if err := snap.Tensors.CheckLayout(dst); err != nil {
			return fmt.Errorf("%w: %v", errs.ErrInvalid, err)
		}
		for _, t := range dst.Tensors() {
			copy(t.Data, snap.Tensors.Get(t.Name).Data)
		}
		return nil
	}
}

func staleErr(name string, cur, got uint64) error {
	return &errs.StaleError{Model: name, CurrentVersion: cur, Reason: fmt.Sprintf("version %d is not newer", got)}
}
