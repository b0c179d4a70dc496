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
package store

import (
	"context"
	"time"

	"github.com/rlhub/rlhub/internal/tensor"
)

// ExpectAny, as PushRequest.Expect, skips the compare-and-set check (the
// version and epoch rules still hold).
const ExpectAny = ^uint64(0)

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
	// this one did (1 for the first), kept across restarts; a reader that
	// saw Seq a and then Seq b skipped b-a-1 versions. 0 when unknown (a
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

// Info describes a model's newest version and what is retained.
type Info struct {
	Name     string
	Version  uint64
	Epoch    uint64
	Bytes    int64
	Created  time.Time
	Retained []uint64 // versions held, ascending
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
	_ Lender = (*Memory)(nil)
	_ Lender = (*File)(nil)
)
