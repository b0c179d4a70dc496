package reduce

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/rlhub/rlhub/internal/errs"
)

// Reason says why a gradient was dropped.
type Reason string

// The drop reasons. Every pushed gradient ends applied or dropped with
// exactly one of these.
const (
	// ReasonInvalid: malformed blob, wrong names, shapes or dtypes.
	ReasonInvalid Reason = "invalid"
	// ReasonNonFinite: the gradient (or a reduced batch) holds NaN or Inf.
	ReasonNonFinite Reason = "nonfinite"
	// ReasonStale: refused by the staleness rule.
	ReasonStale Reason = "stale"
	// ReasonDuplicate: the (client, seq) was already applied.
	ReasonDuplicate Reason = "duplicate"
	// ReasonFull: the secondary's bounded queue was full.
	ReasonFull Reason = "queue_full"
	// ReasonUnknownModel: no model of that name is registered.
	ReasonUnknownModel Reason = "unknown_model"
	// ReasonAborted: the push stream broke before the gradient was whole,
	// or its (client, seq) was still being reduced by another attempt
	// (the client retries later).
	ReasonAborted Reason = "aborted"
	// ReasonLost: the batch holding it could not reach or was refused by
	// the primary (its session ended), or the reducer shut down. Counted
	// by the primary when a session ends, it is provisional: a retry of
	// the same (client id, seq) that is applied later takes it back
	// (Ledger, Counters.Revive).
	ReasonLost Reason = "lost"
	// ReasonPublish: the optimizer step could not be published.
	ReasonPublish Reason = "publish_failed"
	// ReasonStepNonFinite: the gradients were finite but the optimizer
	// step they took part in gave a NaN or Inf weight or optimizer state
	// element (a gradient too large for the settings); the model stops.
	ReasonStepNonFinite Reason = "step_nonfinite"
)

// ReasonOf classifies the error that refused a push.
func ReasonOf(err error) Reason {
	switch {
	case errors.Is(err, errs.ErrNotFound):
		return ReasonUnknownModel
	case errors.Is(err, errs.ErrStale):
		return ReasonStale
	case errors.Is(err, errs.ErrExists):
		return ReasonDuplicate
	case errors.Is(err, errs.ErrFull):
		return ReasonFull
	case errors.Is(err, errs.ErrInvalid):
		return ReasonInvalid
	}
	return ReasonAborted
}

// Counters count gradients through the reducer. At a secondary: Pushed,
// Reduced (forwarded to and accepted by the primary) and Dropped. At the
// primary: Applied, Steps and Dropped (batches it accepted but could not
// publish). Summed over a primary and all its secondaries, once nothing is
// in flight: Pushed = Applied + DroppedTotal().
type Counters struct {
	// Pushed counts gradients (distinct (client, seq) ids a secondary
	// saw; a retry of one it refused is not counted again).
	Pushed uint64
	// Attempts counts push attempts, retries included.
	Attempts uint64
	Reduced  uint64
	Applied  uint64
	// Steps is optimizer steps (versions published).
	Steps   uint64
	Dropped map[Reason]uint64
}

// Drop counts n gradients dropped for r (nothing for n = 0).
func (c *Counters) Drop(r Reason, n uint64) {
	if n == 0 {
		return
	}
	if c.Dropped == nil {
		c.Dropped = map[Reason]uint64{}
	}
	c.Dropped[r] += n
}

// Revive takes back n gradients counted dropped for r (lost gradients that
// were applied after all). It panics if fewer than n were counted: that is
// a bug in the caller's bookkeeping.
func (c *Counters) Revive(r Reason, n uint64) {
	if n == 0 {
		return
	}
	if c.Dropped[r] < n {
		panic(fmt.Sprintf("reduce: reviving %d gradients dropped for %s, only %d counted", n, r, c.Dropped[r]))
	}
	c.Dropped[r] -= n
	if c.Dropped[r] == 0 {
		delete(c.Dropped, r)
	}
}

// DroppedTotal sums Dropped.
func (c *Counters) DroppedTotal() uint64 {
	var n uint64
	for _, v := range c.Dropped {
		n += v
	}
	return n
}

// Merge adds o into c.
func (c *Counters) Merge(o Counters) {
	c.Pushed += o.Pushed
	c.Attempts += o.Attempts
	c.Reduced += o.Reduced
	c.Applied += o.Applied
	c.Steps += o.Steps
	for _, r := range slices.Sorted(maps.Keys(o.Dropped)) {
		c.Drop(r, o.Dropped[r])
	}
}

// Clone returns a deep copy (with a nil Dropped when nothing is dropped,
// so that equal counts compare equal).
func (c Counters) Clone() Counters {
	if len(c.Dropped) == 0 {
		c.Dropped = nil
	} else {
		c.Dropped = maps.Clone(c.Dropped)
	}
	return c
}
