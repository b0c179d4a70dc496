package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

// Fenced is the primary's store as every writer on the hub sees it (the
// hub's Config.WrapStore): each push checks the term proof (Proof: held
// from etcd for the lease, no etcd round trip per publish), carries the
// term's epoch as its writer epoch, commits with scans held off, waits
// for the standbys' acknowledgements (Source.Sync) and checks the proof
// again before it is acknowledged. A push on a deposed primary, or one
// whose proof has lapsed, returns an error (the refusal, or Unavailable
// naming etcd when etcd cannot renew the proof): it is never
// acknowledged.
//
// The standbys are the second fence: a standby that has seen a newer
// term follows no older primary (Follower), so a deposed primary's
// publish cannot gather the acknowledgements it waits for.
type Fenced struct {
	store.Store
	// Epoch is the term's epoch.
	Epoch uint64
	// Source replicates; nil means no replication (Sync skipped).
	Source *Source
	// Proof reports, without asking etcd, whether the term still holds
	// (cluster.Term.Valid); nil means no check.
	Proof func() error
	// Renew renews the proof (cluster.Term.Renew: one etcd round trip);
	// a write whose Proof found it expired (cluster.ErrProofExpired, etcd
	// reachable but a renewal slow) renews it itself before it gives up,
	// so a loaded machine pays a round trip rather than a failure. Nil:
	// the write fails.
	Renew func(ctx context.Context) error
	// Refusal is the answer once deposed (the node fills in the new
	// primary when it knows it); nil while this hub is the primary.
	Refusal func() *cluster.Refusal
	// Deposed is called when a check finds the term gone.
	Deposed func()
	// ProofEnded, when set, returns a channel closed once a renewal of the
	// term proof failed (cluster.Term.ProofEnded): a publish waiting for
	// its standbys' acknowledgements then fails at once, not acknowledged,
	// naming etcd — on a machine cut off from etcd and the standbys it
	// could not be acknowledged anyway. Nil: it waits for the acks (up to
	// SourceConfig.AckTimeout) or the Source's Stop.
	ProofEnded func() <-chan struct{}
	// Over, when set, is done once this hub's term is over (deposed,
	// stepping down): a publish renewing an expired proof itself (Renew)
	// stops waiting for etcd then and is answered with the refusal — the
	// step-down stops the hub within a second, and a publish still
	// waiting for etcd on a machine cut off from it would have its
	// connection cut unanswered. Nil: never.
	Over context.Context
	// Fault, when set, is told of a write that failed on this hub's own
	// storage (no space, read-only, I/O error: nothing was committed).
	// true: the hub steps down for a standby, and the write fails as
	// Unavailable (a following client writes again to the next primary);
	// false: the write fails with its error.
	Fault func(error) bool

	visOnce sync.Once
	v       *visibility
}

var (
	_ store.Lender       = (*Fenced)(nil)
	_ store.Acknowledger = (*Fenced)(nil)
	_ store.Committer    = (*Fenced)(nil)
	_ store.Claimer      = (*Fenced)(nil)
	_ store.StateWriter  = (*Fenced)(nil)
	_ store.Deleter      = (*Fenced)(nil)
	_ store.Prechecker   = (*Fenced)(nil)
	_ store.StatsReader  = (*Fenced)(nil)
	_ store.UsageReader  = (*Fenced)(nil)
	_ store.LifeReader   = (*Fenced)(nil)
	_ store.LifeWaiter   = (*Fenced)(nil)
)

func (f *Fenced) refused() error {
	if f.Refusal != nil {
		if r := f.Refusal(); r != nil {
			return r
		}
	}
	return nil
}

// prepare is the common head of every write: refuse when deposed or
// when the term proof does not hold (before anything changes), and take
// the standbys the write will wait for.
func (f *Fenced) prepare(ctx context.Context) ([]string, error) {
	if r := f.refused(); r != nil {
		return nil, r
	}
	if err := f.proof(ctx); err != nil {
		return nil, f.termError(err, "before writing")
	}
	if f.Source == nil {
		return nil, nil
	}
	standbys, err := f.Source.Prepare(ctx)
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
	var r *cluster.Refusal
	if errors.As(err, &r) {
		return err
	}
	return fmt.Errorf("%w: cluster: etcd cannot confirm this hub's term %s (nothing is acknowledged): %v", errs.ErrUnavailable, when, err)
}

// acknowledge is the common tail of every write: replicate, then check
// the term proof again. The write is committed here already: an error
// other than the refusal (deposed) wraps store.ErrNotAcknowledged.
func (f *Fenced) acknowledge(ctx context.Context, standbys []string) error {
	if f.Source != nil {
		var ended <-chan struct{}
		if f.ProofEnded != nil {
			ended = f.ProofEnded()
		}
		if err := f.Source.syncUntil(ctx, standbys, ended); err != nil {
			if r := f.refused(); r != nil {
				return r // deposed while waiting
			}
			if errors.Is(err, errTermUnconfirmed) {
				if perr := f.proofNow(); perr != nil {
					err = perr // why: etcd's, or deposed
				}
				return notAcknowledged(f.termError(err, "while its standbys' acknowledgements were awaited"))
			}
			return notAcknowledged(err)
		}
	}
	if err := f.proof(ctx); err != nil {
		return notAcknowledged(f.termError(err, "before acknowledging"))
	}
	return nil
}

// notAcknowledged marks the error of a write committed here whose
// acknowledgement failed; a refusal (this hub deposed) stays as it is.
func notAcknowledged(err error) error {
	var r *cluster.Refusal
	if errors.As(err, &r) {
		return err
	}
	return fmt.Errorf("%w: %v", store.ErrNotAcknowledged, err)
}

// Acknowledge implements store.Acknowledger: it replicates everything
// committed so far (a version whose push failed with
// store.ErrNotAcknowledged included) and, once that is acknowledged and
// the term checked, makes name's versions up to version visible. The
// reducer retries a step's publish with it (docs/reducer.md).
//
// It commits nothing, yet passes through the commit path (an empty
// commit of name): a unit that covers it is then cut after every path a
// writer named before it (Source.Changed), as a push's is.
//
// It shows only what the current life of name committed: a version of a
// model deleted since (a publish retried across the Delete) shows
// nothing of the model pushed again.
func (f *Fenced) Acknowledge(ctx context.Context, name string, version uint64) error {
	standbys, err := f.prepare(ctx)
	if err != nil {
		return notAcknowledged(err)
	}
	v := f.vis()
	gen := v.generation(name)
	// The store holds version (or a newer one) of this life before the
	// ack asks for its unit, so the unit covers it.
	committed := f.newest(ctx, name) >= version
	_ = f.commit(name, func() error { return nil })
	if err := f.acknowledge(ctx, standbys); err != nil {
		return err
	}
	if committed {
		v.settle(name, version, gen, true)
	}
	return nil
}

// renewTimeout bounds the etcd round trip of a write that renews an
// expired proof itself.
const renewTimeout = 2 * time.Second

// proofNow is the term proof's state, without renewing it (nil without
// Proof).
func (f *Fenced) proofNow() error {
	if f.Proof == nil {
		return nil
	}
	return f.Proof()
}

// proof checks the term proof, renewing it once when it merely expired.
func (f *Fenced) proof(ctx context.Context) error {
	if f.Proof == nil {
		return nil
	}
	err := f.Proof()
	if errors.Is(err, cluster.ErrProofExpired) && f.Renew != nil {
		rctx, cancel := context.WithTimeout(ctx, renewTimeout)
		if f.Over != nil {
			stop := context.AfterFunc(f.Over, cancel)
			defer stop()
		}
		rerr := f.Renew(rctx)
		cancel()
		if rerr != nil {
			if r := f.refused(); r != nil {
				return r // the term ended meanwhile
			}
			return rerr
		}
		err = f.Proof()
	}
	return err
}

// commit runs fn, a write that changes model name only, with scans held
// off: Source.CommitNamed when the store names the files it changes
// (store.Namer), else Source.CommitModel.
func (f *Fenced) commit(name string, fn func() error) error {
	if f.Source == nil {
		return fn()
	}
	if n, ok := f.Store.(store.Namer); ok && n.NamesFiles() {
		return f.Source.CommitNamed(fn)
	}
	return f.Source.CommitModel(name, fn)
}

// Push writes req at the term's epoch (a client's own epoch is replaced:
// in a cluster the term is the fencing token).
func (f *Fenced) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	info, ack, err := f.PushCommitted(ctx, req)
	if err != nil {
		return info, err
	}
	return info, ack(ctx)
}

// PushCommitted implements store.Committer: Push's commit, returning once
// the version is committed here (hidden from readers); ack replicates it,
// checks the term and makes it visible, as Push does after its commit.
// Several commits may await their acks at once: each ack asks for a unit
// covering everything committed before it, so one unit (one round trip to
// the standbys) may acknowledge several.
func (f *Fenced) PushCommitted(ctx context.Context, req store.PushRequest) (store.Info, func(context.Context) error, error) {
	standbys, err := f.prepare(ctx)
	if err != nil {
		return store.Info{}, nil, err
	}
	req.Epoch = f.Epoch
	v := f.vis()
	// Hidden from readers until acknowledged. A version already held is
	// one an earlier push committed and could not acknowledge: a retry of
	// that push is refused below, and must leave it hidden.
	gen, held := v.hold(req.Name, req.Version, func() (uint64, bool) { return f.newestKnown(ctx, req.Name) })
	if !held {
		if info, ok := f.retried(ctx, req); ok {
			return info, func(ctx context.Context) error { return f.Acknowledge(ctx, req.Name, req.Version) }, nil
		}
	}
	var info store.Info
	err = f.commit(req.Name, func() error {
		var err error
		info, err = f.Store.Push(ctx, req)
		if err == nil {
			v.retained(req.Name, gen, info.Retained)
		}
		if err == nil && f.Source != nil {
			// The next unit ships the version from the store's memory
			// (lent, so a Recycle cannot reuse it meanwhile).
			f.Source.offerVersion(ctx, f.Store, req.Name, req.Version)
		}
		return err
	})
	if err != nil {
		if held {
			v.settle(req.Name, req.Version, gen, false)
		}
		return info, nil, f.fault(err)
	}
	ack := func(ctx context.Context) error {
		err := f.acknowledge(ctx, standbys)
		if err == nil {
			v.settle(req.Name, req.Version, gen, true)
		}
		return err
	}
	return info, ack, nil
}

// newest is the store's newest version of name (0: none, or unreadable),
// read without counting a read when the store numbers lives.
func (f *Fenced) newest(ctx context.Context, name string) uint64 {
	version, _ := f.newestKnown(ctx, name)
	return version
}

// newestKnown is newest, and false when the store could not say (an
// error other than NotFound).
func (f *Fenced) newestKnown(ctx context.Context, name string) (uint64, bool) {
	if lr, ok := f.Store.(store.LifeReader); ok {
		version, _, err := lr.NewestLife(name)
		if err != nil {
			return 0, errors.Is(err, errs.ErrNotFound)
		}
		return version, true
	}
	snap, release, err := store.Borrow(ctx, f.Store, name, 0)
	if err != nil {
		return 0, errors.Is(err, errs.ErrNotFound)
	}
	defer release()
	return snap.Version, true
}

// retried reports whether req is a retry of a push that committed its
// version here and could not acknowledge it (store.ErrNotAcknowledged): the
// same bytes of the same version, from the same owner, still held. Such a
// retry is acknowledged again, as Acknowledge does, instead of being refused
// as not newer than what it pushed itself: so a client that pushes again
// after the failure (Python's client does, on Unavailable) gets the version
// once the standbys hold it, and an error saying it is not acknowledged
// until then. Anything else takes the ordinary path.
func (f *Fenced) retried(ctx context.Context, req store.PushRequest) (store.Info, bool) {
	snap, release, err := store.Borrow(ctx, f.Store, req.Name, req.Version)
	if err != nil {
		return store.Info{}, false
	}
	same := snap.Version == req.Version && snap.Epoch == f.Epoch && bytes.Equal(snap.Blob, req.Blob)
	release()
	if !same {
		return store.Info{}, false
	}
	infos, err := f.Store.List(ctx)
	if err != nil {
		return store.Info{}, false
	}
	for _, in := range infos {
		if in.Name == req.Name {
			return in, in.Owner == req.Owner
		}
	}
	return store.Info{}, false
}

// WriteState implements store.StateWriter: fn (which names what it
// writes, Source.Changed) runs as one commit, with scans held off, after
// the checks every write makes, and is acknowledged like a push.
func (f *Fenced) WriteState(ctx context.Context, fn func() error) error {
	standbys, err := f.prepare(ctx)
	if err != nil {
		return err
	}
	if f.Source == nil {
		err = fn()
	} else {
		err = f.Source.CommitNamed(fn)
	}
	if err != nil {
		return f.fault(err)
	}
	return f.acknowledge(ctx, standbys)
}

// fault hands a write that failed on this hub's storage to Fault: when the
// hub steps down for it, the write's error is Unavailable.
func (f *Fenced) fault(err error) error {
	if f.Fault == nil || !localFault(err) || !f.Fault(err) {
		return err
	}
	return fmt.Errorf("%w: this primary cannot write its store (%v); it steps down for a standby", errs.ErrUnavailable, err)
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
	if err := f.commit(name, func() error { return c.Claim(ctx, name, owner) }); err != nil {
		return f.fault(err)
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
	if err := f.commit(name, func() error { return c.Release(ctx, name, owner) }); err != nil {
		return f.fault(err)
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
	v := f.vis()
	v.deleting(name)
	failed := true
	defer func() { v.deleted(name, failed) }()
	if f.Source != nil {
		f.Source.Deleted(name)
	}
	if err := f.commit(name, func() error { return d.Delete(ctx, name) }); err != nil {
		return f.fault(err)
	}
	failed = false
	return f.acknowledge(ctx, standbys)
}

// Readers see only acknowledged versions: a version is hidden from
// Get, GetIfNewer, WaitNewer, List and the loans from the moment its push
// starts until the push is acknowledged (replicated and the term
// checked), so no reader ever holds a version that a failover could take
// back. A version whose acknowledgement failed stays hidden until a later
// version of the model is acknowledged (a later unit carries it too).

// visibility is Fenced's record of versions not yet acknowledged.
//
// A hold at or below a model's newest acknowledged version (acked) hides
// nothing: that version is visible already, and the push holding it — a
// writer that lost the race for the version, or a retry of a push that
// was acknowledged — can only be refused as stale, so readers never see
// the model step back while it is refused. A model's first hold of the
// term takes the store's newest version as acknowledged (a new primary's
// store holds what it followed, and shows all of it). A Delete of the
// model forgets its acknowledged version before the store is touched
// and, until it is done, keeps every hold effective and records no new
// acknowledgement: a push the store takes after the delete is hidden
// until acknowledged, however the two interleave.
//
// Each hold belongs to the model's generation when it was taken, which a
// Delete's start and end each advance: a push that began before or
// during a Delete may land in either life. Its acknowledgement ends its
// own hold only; only a push that no Delete overlapped (its generation
// still the model's, no Delete in progress) shows the versions below it
// and records its version as acknowledged. So a deleted model's late
// acknowledgement shows nothing of the model pushed again, and two
// pushes of one version number in two lives keep a hold each.
//
// So a model's visible versions below its lowest hidden one are acked
// and those older, except a version whose push a Delete overlapped and
// that landed in the model pushed again (visible once acknowledged,
// newer than acked maybe): loose records it, and readers then list the
// store rather than take acked as the newest visible version.
type visibility struct {
	mu      sync.Mutex
	pending map[string]map[hold]bool
	acked   map[string]uint64
	// loose is, per model, the newest version acknowledged without being
	// recorded in acked (a Delete overlapped its push), or looseUnknown
	// when the term could not read the store's newest (or a Delete
	// failed, so that the versions acked forgot may still be there);
	// absent once acked passes it.
	loose map[string]uint64
	// seeded: the models whose acked the term has taken from the store.
	seeded map[string]bool
	// deletes counts each model's Deletes in progress.
	deletes map[string]int
	// gen is each model's generation, advanced by each Delete's start and
	// end (absent: 0).
	gen map[string]uint64
	// kept is, per model, the oldest version the store retained after a
	// push of this term that no Delete overlapped (store.Info.Retained):
	// an acked below it was dropped past the store's Retain for newer
	// versions, and readers list the store for the newest they get.
	// Absent (0): none known dropped. A Delete forgets it with acked.
	kept    map[string]uint64
	changed chan struct{}
}

// hold is one push's hold: its version, in its model's generation.
type hold struct{ version, gen uint64 }

func (f *Fenced) vis() *visibility {
	f.visOnce.Do(func() {
		f.v = &visibility{pending: map[string]map[hold]bool{}, acked: map[string]uint64{}, loose: map[string]uint64{},
			seeded: map[string]bool{}, deletes: map[string]int{}, gen: map[string]uint64{}, kept: map[string]uint64{},
			changed: make(chan struct{})}
	})
	return f.v
}

// hold hides version of name, returning the generation of the hold and
// whether this call hid it (false: a push of the same generation hid it
// already). newest, called once per model and term, is the store's
// newest version of name (0: none) and whether the store could say.
func (v *visibility) hold(name string, version uint64, newest func() (uint64, bool)) (uint64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.seeded[name] {
		v.seeded[name] = true
		if v.deletes[name] == 0 {
			n, known := newest()
			v.acked[name] = max(v.acked[name], n)
			if !known {
				v.loose[name] = looseUnknown
			}
		}
	}
	if v.pending[name] == nil {
		v.pending[name] = map[hold]bool{}
	}
	h := hold{version, v.gen[name]}
	if v.pending[name][h] {
		return h.gen, false
	}
	v.pending[name][h] = true
	return h.gen, true
}

// generation is name's generation now (for Acknowledge, which holds
// nothing).
func (v *visibility) generation(name string) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gen[name]
}

// settle ends the hold of version taken in generation gen: acknowledged
// (when no Delete overlapped it, every version up to it becomes visible
// too) or refused before it landed (only it goes).
func (v *visibility) settle(name string, version, gen uint64, acked bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.pending[name], hold{version, gen})
	if acked && gen == v.gen[name] && v.deletes[name] == 0 {
		for p := range v.pending[name] {
			if p.version <= version {
				delete(v.pending[name], p)
			}
		}
		if version > v.acked[name] {
			v.acked[name] = version
		}
		if l, ok := v.loose[name]; ok && l <= version {
			delete(v.loose, name)
		}
	} else if acked && version > v.loose[name] {
		v.loose[name] = version
	}
	if len(v.pending[name]) == 0 {
		delete(v.pending, name)
	}
	close(v.changed)
	v.changed = make(chan struct{})
}

// retained records what the store retained of name (ascending,
// store.Info.Retained) once a push whose hold was taken in generation gen
// landed: its oldest, when no Delete overlapped the push (else it may be
// of either life).
func (v *visibility) retained(name string, gen uint64, retained []uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(retained) > 0 && gen == v.gen[name] && v.deletes[name] == 0 {
		v.kept[name] = max(v.kept[name], retained[0])
	}
}

// deleting marks a Delete of name begun; deleted, its end (failed: the
// store may still hold the versions whose acknowledgement deleting
// forgot).
func (v *visibility) deleting(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.deletes[name]++
	v.gen[name]++
	delete(v.acked, name)
	delete(v.kept, name)
}

func (v *visibility) deleted(name string, failed bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if failed {
		v.loose[name] = looseUnknown
	}
	v.gen[name]++
	if v.deletes[name]--; v.deletes[name] == 0 {
		delete(v.deletes, name)
	}
}

// bound is the lowest hidden version of name (0: none) and the channel
// that closes when holds change.
func (v *visibility) bound(name string) (uint64, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	low, _ := v.newestLocked(name)
	return low, v.changed
}

// newestLocked is the lowest hidden version of name (0: none) and its
// newest acknowledged version this term, below it (0: none, or a Delete
// of it is in progress).
func (v *visibility) newestLocked(name string) (low, acked uint64) {
	if v.deletes[name] == 0 {
		acked = v.acked[name]
	}
	for p := range v.pending[name] {
		if p.version > acked && (low == 0 || p.version < low) {
			low = p.version
		}
	}
	return low, acked
}

// looseUnknown is a loose version no acknowledgement passes: readers list
// the store for the model until the term ends.
const looseUnknown = ^uint64(0)

// exact is name's lowest hidden version (0: none), and its newest
// acknowledged version and generation, which name its newest visible
// version below low when ok: no Delete in progress, no loose version
// above acked, acked not known dropped past the store's Retain (kept).
func (v *visibility) exact(name string) (low, acked, gen uint64, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	low, acked = v.newestLocked(name)
	ok = v.deletes[name] == 0 && v.loose[name] <= acked && (acked == 0 || acked >= v.kept[name])
	return low, acked, v.gen[name], ok
}

// visible returns the newest visible version of name at or below snap
// (snap itself when it is visible), releasing snap's loan when it is
// not; nil when no retained version is visible.
//
// That is the model's newest acknowledged version, read as it is, when
// Fenced's record names it (visibility.exact) and the store still
// retains it; otherwise (an acknowledged version dropped past Retain for
// newer unacknowledged ones, a Delete meanwhile, a loose version) the
// newest retained version below the lowest hidden one, from a listing of
// the whole store.
func (f *Fenced) visible(ctx context.Context, name string, snap *store.Snapshot, release func()) (*store.Snapshot, func(), error) {
	low, acked, gen, exact := f.vis().exact(name)
	if low == 0 || snap.Version < low {
		return snap, release, nil
	}
	release()
	return f.visibleBelow(ctx, name, low, acked, gen, exact)
}

// visibleBelow is visible's answer once the version asked about is
// hidden: the newest visible version below low, the lowest hidden one,
// given what visibility.exact said (acked, gen, exact); nil when no
// retained version is visible.
func (f *Fenced) visibleBelow(ctx context.Context, name string, low, acked, gen uint64, exact bool) (*store.Snapshot, func(), error) {
	v := f.vis()
	if exact {
		if acked == 0 {
			return nil, func() {}, nil
		}
		s, rel, err := store.Borrow(ctx, f.Store, name, acked)
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			return nil, nil, err
		}
		if err == nil {
			// The same generation and acked, no Delete begun: the
			// version lent is acked, of the life it was acknowledged in.
			if _, again, g, ok := v.exact(name); ok && again == acked && g == gen {
				return s, rel, nil
			}
			rel()
		}
	}
	infos, err := f.Store.List(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, in := range infos {
		if in.Name != name {
			continue
		}
		for i := len(in.Retained) - 1; i >= 0; i-- {
			if in.Retained[i] < low {
				return store.Borrow(ctx, f.Store, name, in.Retained[i])
			}
		}
	}
	return nil, func() {}, nil
}

// Lend implements store.Lender (acknowledged versions only).
func (f *Fenced) Lend(ctx context.Context, name string, version uint64) (*store.Snapshot, func(), error) {
	snap, release, err := store.Borrow(ctx, f.Store, name, version)
	if err != nil {
		return nil, nil, err
	}
	if low, _ := f.vis().bound(name); low != 0 && snap.Version >= low {
		if version != 0 {
			release()
			return nil, nil, fmt.Errorf("%w: model %s version %d is not acknowledged yet", errs.ErrNotFound, errs.Quote(name), version)
		}
		snap, release, err = f.visible(ctx, name, snap, release)
		if err == nil && snap == nil {
			err = fmt.Errorf("%w: model %s has no acknowledged version", errs.ErrNotFound, errs.Quote(name))
		}
	}
	return snap, release, err
}

// LendNewer implements store.Lender: it waits for an acknowledged version
// newer than after.
func (f *Fenced) LendNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, func(), error) {
	return f.LendNewerLife(ctx, name, after, 0)
}

// LendNewerLife implements store.LifeWaiter: LendNewer that also returns,
// at once, the newest acknowledged version when it is of another life
// than life (0: as LendNewer), so a follower of a cluster's primary that
// follows lives takes a model deleted and pushed again as soon as the
// standbys hold its version, not at store.BorrowNewerLife's next poll.
// A version of the new life waiting for its acknowledgement is waited
// for, as LendNewer waits.
func (f *Fenced) LendNewerLife(ctx context.Context, name string, after, life uint64) (*store.Snapshot, func(), error) {
	for {
		snap, release, err := store.BorrowNewerLife(ctx, f.Store, name, after, life)
		if err != nil {
			return nil, nil, err
		}
		_, changed := f.vis().bound(name)
		snap, release, err = f.visible(ctx, name, snap, release)
		if err != nil {
			return nil, nil, err
		}
		if snap != nil && (snap.Version > after || life != 0 && snap.Life() != life) {
			return snap, release, nil
		}
		if snap != nil {
			release()
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-changed:
		}
	}
}

// Get implements store.Store (acknowledged versions only).
func (f *Fenced) Get(ctx context.Context, name string, version uint64) (*store.Snapshot, error) {
	snap, release, err := f.Lend(ctx, name, version)
	if err != nil {
		return nil, err
	}
	release()
	return f.Store.Get(ctx, name, snap.Version)
}

// GetIfNewer implements store.Store (acknowledged versions only).
func (f *Fenced) GetIfNewer(ctx context.Context, name string, than uint64) (*store.Snapshot, error) {
	snap, err := f.Store.GetIfNewer(ctx, name, than)
	if err != nil || snap == nil {
		return snap, err
	}
	vs, release, err := f.visible(ctx, name, snap, func() {})
	if err != nil || vs == nil || vs.Version <= than {
		return nil, err
	}
	release()
	return vs, nil
}

// NewestLife implements store.LifeReader (acknowledged versions only), so
// that weight sync's status follows a model deleted and pushed again on a
// cluster as on a single hub: the wrapped store's newest version and its
// life, or, while that version waits for its acknowledgement, the newest
// visible version readers get (Fenced.visible; NotFound when there is
// none: the status keeps what it showed, as GetIfNewer leaves it). When
// Fenced's record names that version (visibility.exact) it is the newest
// acknowledged version, of the same life: nothing is read or listed from
// the store. Otherwise (a Delete failed or is in progress, a push across
// a Delete was acknowledged above the record: visibility.loose, or newer
// unacknowledged versions pushed the newest acknowledged one past the
// store's Retain: visibility.kept) it is found as readers find it, from a
// listing of the store, so the status never names another version than
// readers get. A wrapped store that numbers no lives gives the newest
// visible version at life 0 (unknown: the status's newest only grows, as
// it did with GetIfNewer).
func (f *Fenced) NewestLife(name string) (uint64, uint64, error) {
	lr, ok := f.Store.(store.LifeReader)
	if !ok {
		snap, release, err := f.Lend(context.Background(), name, 0)
		if err != nil {
			return 0, 0, err
		}
		release()
		return snap.Version, 0, nil
	}
	version, life, err := lr.NewestLife(name)
	if err != nil {
		return 0, 0, err
	}
	low, acked, gen, exact := f.vis().exact(name)
	if low == 0 || version < low {
		return version, life, nil
	}
	none := fmt.Errorf("%w: model %s has no acknowledged version", errs.ErrNotFound, errs.Quote(name))
	if exact {
		// Lives only grow: the same life again means no Delete came
		// between, and a Delete's start forgets acked, so acked is of
		// that life.
		if _, again, err := lr.NewestLife(name); err != nil || again != life || acked == 0 {
			return 0, 0, none
		}
		return acked, life, nil
	}
	snap, release, err := f.visibleBelow(context.Background(), name, low, acked, gen, false)
	if err != nil {
		return 0, 0, err
	}
	if snap == nil {
		return 0, 0, none
	}
	release()
	return snap.Version, snap.Life(), nil
}

// WaitNewer implements store.Store (acknowledged versions only).
func (f *Fenced) WaitNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, error) {
	snap, release, err := f.LendNewer(ctx, name, after)
	if err != nil {
		return nil, err
	}
	release()
	return f.Store.Get(ctx, name, snap.Version)
}

// List implements store.Store: each model at its newest acknowledged
// version.
func (f *Fenced) List(ctx context.Context) ([]store.Info, error) {
	infos, err := f.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := infos[:0]
	for _, in := range infos {
		low, _ := f.vis().bound(in.Name)
		if low != 0 {
			kept := in.Retained[:0:0]
			for _, r := range in.Retained {
				if r < low {
					kept = append(kept, r)
				}
			}
			in.Retained = kept
			if len(kept) == 0 {
				if in.Owner == "" {
					continue
				}
				in.Version = 0
			} else {
				in.Version = kept[len(kept)-1]
			}
		}
		out = append(out, in)
	}
	return out, nil
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

// OwnerUsage implements store.UsageReader, so per-token quotas on a
// cluster primary read the store's owner index instead of listing it:
// the wrapped store's figures when it keeps them (store.File, Memory),
// otherwise counted from List. A version still waiting for its
// acknowledgement counts (it holds the space it will hold).
func (f *Fenced) OwnerUsage(owner, name string) (models int, bytes int64, owns bool, nameBytes int64) {
	if u, ok := f.Store.(store.UsageReader); ok {
		return u.OwnerUsage(owner, name)
	}
	infos, err := f.Store.List(context.Background())
	if err != nil {
		return 0, 0, false, 0
	}
	for _, in := range infos {
		if in.Owner != owner {
			continue
		}
		models++
		bytes += in.Bytes
		if in.Name == name {
			owns, nameBytes = true, in.Bytes
		}
	}
	return models, bytes, owns, nameBytes
}
