// Package store is the ordered model store: named models whose versions
// only move forward. It is the source of truth for every policy in a run.
//
// Rules every implementation keeps (the shared suite in storetest checks
// them):
//  1. A push names the version it writes and the version it expects to
//     replace (compare-and-set). It succeeds only if its version is greater
//     than the current one and the expectation holds; otherwise it fails
//     with an *errs.StaleError carrying the current version, and nothing
//     changes.
//  2. Versions carry a writer epoch (fencing token). Once a push with epoch
//     E has landed, a push with an epoch below E is refused, even with a
//     higher version.
//  3. A stored Snapshot is immutable and shared by every reader: its bytes
//     are never copied per reader nor modified.
//  4. WaitNewer never blocks writers; a slow reader simply gets the newest
//     version when it asks again (it skips what it missed).
//  5. A version that no reader ever took (by Get, GetIfNewer or WaitNewer)
//     is, once no longer retained and every loan of it (Lender) returned,
//     handed back to its writer if the push asked for it
//     (PushRequest.Recycle), so that a writer publishing a version per
//     step can write the next ones into memory it already has. A version
//     any reader took is never handed back: rule 3 holds for every
//     snapshot a reader can have.
//  6. A model may have an owner (Claimer): the reducer for the models it
//     reduces, an ARS run for its policy. Once owned, only pushes that
//     carry the owner's identity (PushRequest.Owner) land; any other push
//     fails with errs.ErrPermission and changes nothing. Deleting a model
//     (Deleter) clears its owner with it.
//  7. Versions and epochs are bounded: at most MaxVersion, and a push may
//     move either at most MaxStep past the model's current one; beyond
//     that it fails with errs.ErrInvalid (a version of 2^64-1 would make
//     the model unwritable for good).
package store

import (
	"context"
	"fmt"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

// ExpectAny, as PushRequest.Expect, skips the compare-and-set check (the
// version and epoch rules still hold).
const ExpectAny = ^uint64(0)

const (
	// MaxVersion is the highest version and the highest epoch a push may
	// carry (2^62: far below 2^63, so that every signed conversion and
	// every "+1" on either side of the wire stays exact).
	MaxVersion = uint64(1) << 62
	// MaxStep is how far past the model's current version (and highest
	// landed epoch) one push may move it (2^32: a writer that publishes a
	// million versions a second takes more than an hour to use one step).
	MaxStep = uint64(1) << 32
)

// PushRequest writes one version of a model.
type PushRequest struct {
	// Name of the model; must satisfy the store's name rules.
	Name string
	// Version to write; must be greater than the current version.
	Version uint64
	// Expect is the version the writer believes is current: 0 means "the
	// model must not exist yet"; ExpectAny skips the check.
	Expect uint64
	// Epoch is the writer's fencing token; 0 is the lowest.
	Epoch uint64
	// Owner is the writer's identity: "" for an anonymous writer (every
	// remote push today), or the name of an in-process owner ("reducer",
	// "ars"). A push to a model that has an owner lands only when Owner
	// is that owner (rule 6).
	Owner string
	// Claim, with a non-empty Owner, makes the push claim the model for
	// Owner when it lands on a model with no owner (a model it creates,
	// say): the creation and the claim are one step, so no other writer
	// can slip in between.
	Claim bool
	// Owned, with a non-empty Owner, lands the push only on a model Owner
	// owns already: a writer that claimed the model (the reducer, at its
	// registration) never writes over the model deleted since and pushed
	// again by another writer, whose version numbers it may share
	// (ErrPermission instead).
	Owned bool
	// Admin marks a writer that may write over a model a token owns (an
	// owner starting with TokenOwnerPrefix), leaving its owner as it is;
	// models of in-process owners (the reducer, ARS) still refuse it
	// (delete the model to take it back).
	Admin bool
	// Blob is the safetensors encoding of the state dict. The store takes
	// ownership: the caller must not modify it afterwards (until Recycle
	// gives it back).
	Blob []byte
	// Recycle, when set, is called at most once with Blob when the store
	// no longer retains this version, no reader ever took it and every
	// loan of it is returned (rule 5): from then on the caller owns Blob
	// again and may write a later version into it. It is called without
	// the store's locks held, from the goroutine of the push that dropped
	// the version or of the last release; it must be quick and must not
	// block. Stores that cannot tell (a remote store) never call it.
	Recycle func(blob []byte)
}

// Snapshot is one immutable stored version of a model, shared by all
// readers. Nobody may modify Blob or the tensors, which alias it.
type Snapshot struct {
	Name    string
	Version uint64
	Epoch   uint64
	// Seq counts the model's versions that had landed in this store when
	// this one did (1 for the first), kept across restarts and started
	// again when the model is deleted; a reader that saw Seq a and then
	// Seq b of the same model, not deleted in between, skipped b-a-1
	// versions (Skips counts across a Delete too). 0 when unknown (a
	// snapshot pulled over the network).
	Seq      uint64
	Blob     []byte            // safetensors bytes
	Tensors  *tensor.StateDict // decoded view over Blob
	Metadata map[string]string // safetensors __metadata__
	Created  time.Time

	// recycle is the push's Recycle (nil: none); taken: a reader was
	// handed this snapshot for good; lent: loans not yet returned;
	// dropped: out of retention while lent. Guarded by core.mu.
	recycle func([]byte)
	taken   bool
	lent    int
	dropped bool
	// life tells the model's lives apart, for Skips: Seq restarts when a
	// model is deleted and pushed again. Set before the snapshot is
	// published, then never changed.
	life uint64
}

// Life tells the model's lives apart, as Skips does: the versions of one
// life share it, and a Delete starts a greater one, whose versions are
// numbered afresh. A store draws lives from a counter its process starts
// at the clock, so lives of two stores differ too; a File store records a
// model's life in its manifest and restores it at open, so a restart (or
// a standby's copy opened by a promoted hub) keeps it. A snapshot
// received over the network has the life its sender named (WithLife;
// BlobInfo.life); 0 when unknown.
func (s *Snapshot) Life() uint64 { return s.life }

// OtherLife reports whether lives a and b are both known (not 0) and
// differ: a version of life a belongs to another life of its model than
// one of life b (the model deleted and pushed again between them). An
// unknown life (an older hub's, or a caller's that has none) differs from
// none, so the rule that versions only grow holds for it.
func OtherLife(a, b uint64) bool { return a != 0 && b != 0 && a != b }

// WithLife sets the life of s, a snapshot received over the network, to
// the one its sender named (0: unknown), and returns s. Call it before
// anyone else sees s: a snapshot's life never changes once it is shared.
func WithLife(s *Snapshot, life uint64) *Snapshot {
	s.life = life
	return s
}

// LifeWaiter is a store whose waits follow a model deleted and pushed
// again (Memory and File, and weight sync's boards): LendNewerLife is
// LendNewer that also returns, at once, the newest version when it is of
// another life than life (0: any life, as LendNewer), even though it is
// not newer than after. A watch that asked for it then sends the new
// model's newest at once (docs/weight-sync.md, "Lives").
type LifeWaiter interface {
	LendNewerLife(ctx context.Context, name string, after, life uint64) (snap *Snapshot, release func(), err error)
}

// LifeReader is implemented by the stores that number lives (Memory and
// File, and a cluster primary's replica.Fenced over them): NewestLife
// tells a model's newest version and its life without reading it (no
// read is counted, nothing is taken or lent), so that weight sync's
// status follows a model deleted and pushed again.
type LifeReader interface {
	NewestLife(name string) (version, life uint64, err error)
}

// Skips counts the versions of a model that a reader sent one version
// after another (a Watch stream) skipped. The zero value is ready: the
// first version counts none.
type Skips struct {
	seq, life uint64
}

// Next returns how many versions of snap's model landed after the one
// passed before and before snap: Seq apart less one, or, when the model
// was deleted and pushed again in between (the count restarts with the
// model), the new model's versions before snap. 0 for the first version
// and when Seq is unknown (0).
func (k *Skips) Next(snap *Snapshot) uint64 {
	var n uint64
	switch {
	case k.seq == 0 || snap.Seq == 0:
	case snap.life != k.life:
		n = snap.Seq - 1
	case snap.Seq > k.seq:
		n = snap.Seq - k.seq - 1
	}
	k.seq, k.life = snap.Seq, snap.life
	return n
}

// Lender is implemented by stores that can lend a version rather than hand
// it over (Memory and File do): the borrower reads the snapshot until it
// calls release, exactly once, and never after. A version that was only
// ever lent still goes back to its writer (rule 5) once it is dropped and
// every loan is returned. The store's pull and watch streams borrow this
// way, so that learners pulling each new version do not keep the reducer
// from reusing its blobs.
type Lender interface {
	// Lend is Get, lent.
	Lend(ctx context.Context, name string, version uint64) (snap *Snapshot, release func(), err error)
	// LendNewer is WaitNewer, lent.
	LendNewer(ctx context.Context, name string, after uint64) (snap *Snapshot, release func(), err error)
}

// Namer is a Store that names every file it writes or removes to whoever
// replicates its directory (FileConfig.Changed), before the call that
// made the change returns.
type Namer interface {
	// NamesFiles reports whether it does (a File with Changed set).
	NamesFiles() bool
}

var _ Namer = (*File)(nil)

// Info describes a model's newest version and what is retained.
type Info struct {
	Name     string
	Version  uint64
	Epoch    uint64
	Bytes    int64
	Created  time.Time
	Retained []uint64 // versions held, ascending
	// Owner is the model's owner ("" when it has none): only pushes from
	// it land (rule 6).
	Owner string
}

// TokenOwnerPrefix starts the owner of a model a remote push created
// under a token ("token:" + the token's name, internal/auth). Such a model
// takes an admin's pushes too (PushRequest.Admin), and an in-process owner
// (the reducer registering it, say) may claim it from the token.
const TokenOwnerPrefix = "token:"

// StateWriter is implemented by a store whose writes are replicated and
// fenced (a cluster primary's replica.Fenced). WriteState runs fn, a
// write of a service's durable state beside the store (the aggregator's
// current task), as such a write: refused before fn runs when this hub
// may not write (deposed, or its term unconfirmed), and acknowledged
// like a push once fn returns (its files, which fn names through the
// hub's StateChanged, replicated to the standbys a push waits for). An
// error after fn ran wraps ErrNotAcknowledged. A store without it: run fn.
type StateWriter interface {
	WriteState(ctx context.Context, fn func() error) error
}

// Claimer is implemented by stores that record model owners (Memory and
// File do; the File store persists the owner in the model's manifest).
type Claimer interface {
	// Claim makes owner (non-empty) the model's owner, whether or not the
	// model has versions yet: from then on only pushes with
	// PushRequest.Owner == owner land. Claiming a model one already owns
	// is a no-op; a model owned by another fails with errs.ErrPermission,
	// except that an owner not starting with TokenOwnerPrefix takes a
	// model from a token owner.
	Claim(ctx context.Context, name, owner string) error
	// Release gives up owner's claim: the model takes any writer's pushes
	// again. Releasing a model one does not own fails with
	// errs.ErrPermission; a model with no owner is a no-op.
	Release(ctx context.Context, name, owner string) error
}

// UsageReader is implemented by stores that record owners (Memory, File):
// what one owner holds, for per-token quotas (internal/auth), without
// listing the store.
type UsageReader interface {
	// OwnerUsage returns how many models with at least one version owner
	// owns, the bytes of their newest versions, and whether it owns name
	// and the bytes of name's newest version.
	OwnerUsage(owner, name string) (models int, bytes int64, owns bool, nameBytes int64)
}

// Deleter is implemented by stores that can remove a model (Memory, File
// and the gRPC client). Deleting is an administrator's operation: it
// ignores the model's owner.
type Deleter interface {
	// Delete removes every retained version of a model, its epoch and its
	// owner, as if it had never been pushed: a later push of version 1
	// with Expect 0 creates it afresh. Readers that already hold a
	// snapshot keep it; watchers waiting for a newer version keep waiting
	// (for the model to be pushed again). errs.ErrNotFound for a model
	// with no versions and no owner. On the File store the removal is committed on
	// disk before Delete returns (a crash leaves the model either whole
	// or gone).
	Delete(ctx context.Context, name string) error
}

// Store is the model store. All methods are safe for concurrent use.
type Store interface {
	// Push writes a new version (see the package rules). Errors wrap
	// errs.ErrInvalid (bad name or blob), errs.ErrFull (over the size
	// limit) or are an *errs.StaleError.
	Push(ctx context.Context, req PushRequest) (Info, error)
	// Get returns a version of a model; version 0 means the newest.
	// errs.ErrNotFound for an unknown model or a version not retained.
	Get(ctx context.Context, name string, version uint64) (*Snapshot, error)
	// GetIfNewer returns the newest version if it is newer than `than`,
	// or (nil, nil) when it is not ("not modified").
	GetIfNewer(ctx context.Context, name string, than uint64) (*Snapshot, error)
	// WaitNewer blocks until the model has a version newer than `after`
	// and returns the newest one, or returns ctx's error. It waits for a
	// model that does not exist yet to appear.
	WaitNewer(ctx context.Context, name string, after uint64) (*Snapshot, error)
	// List describes every model, sorted by name.
	List(ctx context.Context) ([]Info, error)
	// Close releases the store. Safe to call twice.
	Close() error
}

var (
	_ Lender  = (*Memory)(nil)
	_ Lender  = (*File)(nil)
	_ Claimer = (*Memory)(nil)
	_ Claimer = (*File)(nil)
	_ Deleter = (*Memory)(nil)
	_ Deleter = (*File)(nil)

	_ UsageReader = (*Memory)(nil)
	_ UsageReader = (*File)(nil)
)

// ErrNotAcknowledged: a write that an Acknowledger committed on this hub
// but could not acknowledge (not replicated in time, or the term could
// not be confirmed after the commit). The version exists here, hidden
// from readers; it may or may not exist on a standby. It becomes
// visible once Acknowledge, a push of the same bytes again (a retry), or a
// later write of the model, is acknowledged. Any other error from an
// Acknowledger's write means nothing was committed. Matches
// errs.ErrUnavailable.
var ErrNotAcknowledged = fmt.Errorf("%w: committed on this hub but not acknowledged", errs.ErrUnavailable)

// Acknowledger is a store whose writes are acknowledged only once
// replicated (a cluster primary's replica.Fenced).
type Acknowledger interface {
	// Acknowledge replicates everything committed so far and, once that
	// is acknowledged, makes name's versions up to version visible. It
	// fails as a write's acknowledgement does: ErrNotAcknowledged when not
	// acknowledged in time, the refusal once this hub is no longer the
	// primary.
	Acknowledge(ctx context.Context, name string, version uint64) error
}

// AsAcknowledger returns s as an Acknowledger when it is one, or when it
// is an Owned view of one (acknowledging needs no owner); ok is false
// for a store that acknowledges every write as it commits it.
func AsAcknowledger(s any) (a Acknowledger, ok bool) {
	if o, isOwned := s.(Owned); isOwned {
		s = o.Store
	}
	a, ok = s.(Acknowledger)
	return a, ok
}

// Committer is an Acknowledger that can commit a push and leave its
// acknowledgement to the caller (a cluster primary's replica.Fenced): the
// version is committed on this hub and hidden from readers when
// PushCommitted returns, and becomes visible once the returned ack
// succeeds (or a later write of the model is acknowledged). The reducer
// takes its next step while a step's version awaits its acknowledgement.
// An error from PushCommitted means nothing was committed; ack fails as
// a write's acknowledgement does (ErrNotAcknowledged, or the refusal).
type Committer interface {
	Acknowledger
	PushCommitted(ctx context.Context, req PushRequest) (info Info, ack func(context.Context) error, err error)
}

// AsCommitter returns s as a Committer when it is one, or when it is an
// Owned view of one (the push then carries the view's owner, as Owned.Push
// does); ok is false otherwise.
func AsCommitter(s any) (c Committer, ok bool) {
	if o, isOwned := s.(Owned); isOwned {
		if c, ok := o.Store.(Committer); ok {
			return ownedCommitter{c, o.Owner}, true
		}
		return nil, false
	}
	c, ok = s.(Committer)
	return c, ok
}

// ownedCommitter is an Owned view's Committer.
type ownedCommitter struct {
	Committer
	owner string
}

func (o ownedCommitter) PushCommitted(ctx context.Context, req PushRequest) (Info, func(context.Context) error, error) {
	req.Owner, req.Claim = o.owner, true
	return o.Committer.PushCommitted(ctx, req)
}

// Owned is the view of a store that an in-process owner writes through:
// every push carries Owner and claims the model it lands on (PushRequest
// Owner and Claim), and Claim and Release act for Owner. The hub gives the
// reducer and the ARS coordinator such views, so the models they manage
// take no other writer's pushes. Reads pass through to the store.
type Owned struct {
	Store
	// Owner is the identity recorded on the models this view claims.
	Owner string
}

// Push implements Store: req is pushed as Owner's, claiming the model.
func (o Owned) Push(ctx context.Context, req PushRequest) (Info, error) {
	req.Owner, req.Claim = o.Owner, true
	return o.Store.Push(ctx, req)
}

// Claim claims name for Owner (Claimer.Claim); a store that records no
// owners (a remote one) ignores it.
func (o Owned) Claim(ctx context.Context, name string) error {
	if c, ok := o.Store.(Claimer); ok {
		return c.Claim(ctx, name, o.Owner)
	}
	return nil
}

// Release releases Owner's claim on name (Claimer.Release); a store that
// records no owners ignores it.
func (o Owned) Release(ctx context.Context, name string) error {
	if c, ok := o.Store.(Claimer); ok {
		return c.Release(ctx, name, o.Owner)
	}
	return nil
}
