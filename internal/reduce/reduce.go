// Package reduce is the pure core of the push-pull gradient server: the
// batch accumulator, the staleness rule, the exactly-once ledger and the
// counters. Nothing here starts a goroutine, reads a clock or touches the
// network; package reducer wraps it in services.
//
// Reduction order (the contract the correctness tests rely on):
//  1. A secondary's batch sum starts at zero and adds each admitted
//     gradient, multiplied by its staleness weight, element by element in
//     the order the pushes completed (Batch.Add order; Batch.Adopt takes
//     the first gradient itself as the sum, scaled by its weight: the same
//     values as adding it to zero, up to the sign of zero). With weight 1 the
//     add is exact IEEE float32 addition, so the sum equals a plain loop in
//     the same order bit for bit.
//  2. The primary applies one forwarded batch per optimizer step, in the
//     order batches reach it. With Mean it multiplies the sum by
//     float32(1/n), n the number of gradients in the batch.
//  3. Clipping (Clip) scales the reduced gradient by torch's
//     clip_grad_norm_ factor, gradient_max/(norm + 1e-6) when below 1, of
//     the global L2 norm (accumulated in float64).
//  4. The optimizer steps (package optim) and version+1 is published.
package reduce

import (
	"fmt"
	"math"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/tensor"
)

// ID names one pushed gradient: the client's id and its sequence number.
type ID struct {
	Client string
	Seq    uint64
}

func (id ID) String() string { return fmt.Sprintf("(client %q, seq %d)", id.Client, id.Seq) }

// MaxClientIDBytes bounds a client id: the ledger keeps the newest ids of
// every client, the journal writes each batch's, a secondary remembers
// refused ones, so one id must not make any of them hold megabytes.
const MaxClientIDBytes = 128

// CheckClientID refuses a client id longer than MaxClientIDBytes.
func CheckClientID(client string) error {
	if len(client) > MaxClientIDBytes {
		return fmt.Errorf("%w: client id %s is longer than %d bytes", errs.ErrInvalid, errs.Quote(client), MaxClientIDBytes)
	}
	return nil
}

// CheckGradient checks that g has exactly the model's tensor names, dtypes
// and shapes, that every tensor is F32 and that it holds no NaN or Inf. The
// error wraps errs.ErrInvalid and names the first problem; nonFinite is true
// when the problem is a NaN/Inf value (counted apart from layout errors).
func CheckGradient(layout, g *tensor.StateDict) (nonFinite bool, err error) {
	return check(gradientNoun, layout, g)
}

// CheckWeights is CheckGradient for weights (an optimizer host's step):
// its errors call them weights.
func CheckWeights(layout, w *tensor.StateDict) error {
	_, err := check(weightsNoun, layout, w)
	return err
}

// noun names what is checked in check's errors.
type noun struct{ name, doesNot string }

var (
	gradientNoun = noun{"gradient", "does not"}
	weightsNoun  = noun{"weights", "do not"}
)

func check(what noun, layout, g *tensor.StateDict) (nonFinite bool, err error) {
	if err := checkLayout(what, layout, g); err != nil {
		return false, err
	}
	for _, t := range g.Tensors() {
		f, _ := t.Float32s() // checkLayout viewed each
		if i := kernels.FirstNonFinite(f); i >= 0 {
			return true, fmt.Errorf("%w: %s tensor %q holds %v at element %d", errs.ErrInvalid, what.name, t.Name, f[i], i)
		}
	}
	return false, nil
}

// CheckLayout is CheckGradient without the NaN/Inf scan, for callers that
// scanned the values already (or will, as the primary does with the norm):
// exactly the model's names, dtypes and shapes, every tensor F32 and
// viewable as []float32.
func CheckLayout(layout, g *tensor.StateDict) error {
	return checkLayout(gradientNoun, layout, g)
}

func checkLayout(what noun, layout, g *tensor.StateDict) error {
	if err := g.CheckLayout(layout); err != nil {
		return fmt.Errorf("%w: %s %s match the model: %v", errs.ErrInvalid, what.name, what.doesNot, err)
	}
	for _, t := range g.Tensors() {
		if _, err := t.Float32s(); err != nil {
			return fmt.Errorf("%w: %s tensor %q: %v", errs.ErrInvalid, what.name, t.Name, err)
		}
	}
	return nil
}

// Batch accumulates gradients into one running sum. It holds the sum only,
// never a copy of each gradient. The sum is either the batch's own buffer
// or, after Adopt, the first gradient itself. Not safe for concurrent use.
type Batch struct {
	layout  *tensor.StateDict
	own     *tensor.StateDict // the batch's own sum buffer; nil until first needed
	sum     *tensor.StateDict // own, or the adopted gradient
	views   [][]float32       // sum's data, layout order
	adopted bool              // sum is a gradient handed over by Adopt
	// finite: every element of sum is known finite (the members were
	// checked finite, as Add and Adopt require, and no add overflowed).
	finite  bool
	members []ID
	weights []float32
	first   time.Time // when the first member was added
	// dirty: own holds stale values from before Reset. The first Add
	// overwrites instead of adding (saving a pass that zeroes it).
	dirty bool
}

// NewBatch returns an empty batch for a model layout (F32 tensors only). It
// allocates its own sum buffer on the first Add of an empty batch, never
// when every batch starts with Adopt.
func NewBatch(layout *tensor.StateDict) *Batch {
	return &Batch{layout: layout}
}

// setSum makes sd the running sum and caches its views in layout order.
func (b *Batch) setSum(sd *tensor.StateDict) {
	b.sum = sd
	b.views = b.views[:0]
	for _, lt := range b.layout.Tensors() {
		f, err := sd.Get(lt.Name).Float32s()
		if err != nil {
			panic(fmt.Sprintf("reduce: unchecked gradient: %v", err))
		}
		b.views = append(b.views, f)
	}
}

// Add adds weight×g to the sum and records id. g must have passed
// CheckGradient against the batch's layout (a mismatch here is a bug and
// panics). now is when it was added (the max-wait clock starts at the first).
func (b *Batch) Add(id ID, g *tensor.StateDict, weight float32, now time.Time) {
	overwrite := false
	if len(b.members) == 0 {
		if b.own == nil {
			b.own = &tensor.StateDict{}
			for _, t := range b.layout.Tensors() {
				if err := b.own.Add(tensor.NewF32(t.Name, t.Shape...)); err != nil {
					panic(err) // layout is a valid state dict
				}
			}
			b.dirty = false
		}
		b.setSum(b.own)
		overwrite = b.dirty
	}
	// A member is finite (checked, as required), so the sum stays finite
	// unless an add overflows: the adds report that in the same pass.
	finite := len(b.members) == 0 || b.finite
	for i, lt := range b.layout.Tensors() {
		x, err := g.Get(lt.Name).Float32s()
		if err != nil {
			panic(fmt.Sprintf("reduce: unchecked gradient: %v", err))
		}
		var ok bool
		switch {
		case overwrite && weight == 1:
			copy(b.views[i], x) // = 0 + x, up to the sign of zero
			ok = true
		case overwrite:
			clear(b.views[i])
			ok = kernels.AddScaledFinite(b.views[i], weight, x)
		case weight == 1:
			ok = kernels.AddFinite(b.views[i], x)
		default:
			ok = kernels.AddScaledFinite(b.views[i], weight, x)
		}
		finite = finite && ok
	}
	b.finite = finite
	if b.sum == b.own {
		b.dirty = false
	}
	b.record(id, weight, now)
}

// Adopt starts an empty batch with g itself as the running sum, scaled in
// place by weight: the same values as Add into a zeroed sum (up to the sign
// of zero), without a pass that copies g. The batch owns g from now on:
// later Adds write into it, Sum returns it, and the caller must not use g
// until Reset reports it was released. g must have passed CheckGradient
// against the batch's layout. It panics if the batch is not empty.
func (b *Batch) Adopt(id ID, g *tensor.StateDict, weight float32, now time.Time) {
	if len(b.members) != 0 {
		panic("reduce: Adopt into a non-empty batch")
	}
	b.setSum(g)
	b.adopted = true
	// g is finite (checked); scaling by |weight| ≤ 1 cannot overflow.
	b.finite = math.Abs(float64(weight)) <= 1
	if weight != 1 {
		for _, v := range b.views {
			kernels.Scale(v, weight)
		}
	}
	b.record(id, weight, now)
}

func (b *Batch) record(id ID, weight float32, now time.Time) {
	if len(b.members) == 0 {
		b.first = now
	}
	b.members = append(b.members, id)
	b.weights = append(b.weights, weight)
}

// Len is the number of gradients in the batch.
func (b *Batch) Len() int { return len(b.members) }

// Members returns the ids in Add order. The slice is the batch's own.
func (b *Batch) Members() []ID { return b.members }

// Weights returns the staleness weights in Add order (the batch's own).
func (b *Batch) Weights() []float32 { return b.weights }

// Sum returns the running sum (nil while empty). The state dict is the
// batch's own or the adopted gradient: it is valid until Reset.
func (b *Batch) Sum() *tensor.StateDict { return b.sum }

// SumFinite reports whether every element of Sum is known to be finite:
// the members were finite, as Add and Adopt require, and no add
// overflowed (Add checks its results in the same pass). False also for an
// empty batch, or after Adopt with a weight above 1 in magnitude, where it
// means "not known".
func (b *Batch) SumFinite() bool { return b.finite && len(b.members) > 0 }

// First is when the first member was added (zero when empty).
func (b *Batch) First() time.Time { return b.first }

// Reset empties the batch and reports whether it held an adopted gradient,
// which the caller owns again. Its own sum is not zeroed now: the next Add
// overwrites it. Until then Sum must not be read.
func (b *Batch) Reset() (releasedAdopted bool) {
	released := b.adopted
	if b.sum == b.own && b.own != nil {
		b.dirty = true
	}
	b.sum, b.views, b.adopted, b.finite = nil, b.views[:0], false, false
	b.members, b.weights, b.first = b.members[:0], b.weights[:0], time.Time{}
	return released
}

// Flush policy: a batch is due when it holds size gradients or maxWait has
// passed since its first one, whichever comes first.
type Flush struct {
	// Size is reduce_batch_size, ≥ 1.
	Size int
	// MaxWait is max_wait, > 0.
	MaxWait time.Duration
}

// Due reports whether b must be flushed at now.
func (f Flush) Due(b *Batch, now time.Time) bool {
	n := b.Len()
	return n >= f.Size || (n > 0 && !now.Before(b.first.Add(f.MaxWait)))
}

// Deadline is when b becomes due by time; ok is false for an empty batch.
func (f Flush) Deadline(b *Batch) (t time.Time, ok bool) {
	if b.Len() == 0 {
		return time.Time{}, false
	}
	return b.first.Add(f.MaxWait), true
}

// Reduction selects how a batch's gradients combine.
type Reduction string

// The reductions.
const (
	// Sum adds the (weighted) gradients.
	Sum Reduction = "sum"
	// Mean adds them and multiplies by float32(1/n), n = gradients in the
	// step.
	Mean Reduction = "mean"
)

// Finish turns a batch sum of n gradients into the step's gradient in
// place, per the reduction.
func (r Reduction) Finish(sum *tensor.StateDict, n int) {
	if r != Mean || n <= 1 {
		return
	}
	s := float32(1 / float64(n))
	for _, t := range sum.Tensors() {
		f, _ := t.Float32s()
		kernels.Scale(f, s)
	}
}

// GlobalNorm returns the L2 norm over every tensor of g, accumulated in
// float64.
func GlobalNorm(g *tensor.StateDict) float64 {
	var ss float64
	for _, t := range g.Tensors() {
		f, _ := t.Float32s()
		ss += kernels.SumSquares(f)
	}
	return math.Sqrt(ss)
}

// Clip scales g in place so that its global norm is at most max (max ≤ 0
// disables clipping). It returns the norm before clipping and whether it
// scaled. The factor is torch.nn.utils.clip_grad_norm_'s, min(1, max/(norm
// + 1e-6)), in float32 (ClipCoef).
func Clip(g *tensor.StateDict, max float64) (norm float64, clipped bool) {
	norm = GlobalNorm(g)
	return norm, ClipNorm(g, max, norm)
}

// ClipCoef is the factor torch.nn.utils.clip_grad_norm_ scales a gradient
// of global norm norm by, for max_norm max: min(1, max/(norm + 1e-6)). A
// norm a little under max is scaled too (by less than 1e-6/max), as torch
// does: a user's gradient_max means what it means in torch.
func ClipCoef(max, norm float64) float64 { return min(1, max/(norm+1e-6)) }

// ClipNorm is Clip for a caller that has computed norm = GlobalNorm(g)
// already (the primary computes it once, as its NaN/Inf check of the
// reduced gradient). It reports whether it scaled.
func ClipNorm(g *tensor.StateDict, max, norm float64) bool {
	if max <= 0 {
		return false
	}
	c := ClipCoef(max, norm)
	if c >= 1 {
		return false
	}
	s := float32(c)
	for _, t := range g.Tensors() {
		f, _ := t.Float32s()
		kernels.Scale(f, s)
	}
	return true
}
