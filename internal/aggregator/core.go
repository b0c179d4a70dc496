package aggregator

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// This file is the pure core: split, slice and merge. No goroutines, no
// clocks; everything is a function of its arguments.

// DefaultHomogeneousKeys are DI-engine's homogeneous info keys: every
// learner reports them identically and they merge to one value.
var DefaultHomogeneousKeys = []string{"learner_step", "buffer_id", "task_id", "learner_done"}

// FailurePolicy says what a task does when a learner fails during it.
type FailurePolicy int

const (
	// PolicyResplit (the zero value) gives the failed learner's rows to the
	// remaining learners of the task, in order, by their demand. The task
	// fails only when no learner is left.
	PolicyResplit FailurePolicy = iota
	// PolicyFail fails the task with an error naming the learner.
	PolicyFail
)

// ParseFailurePolicy parses "resplit" or "fail".
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "resplit":
		return PolicyResplit, nil
	case "fail":
		return PolicyFail, nil
	}
	return 0, fmt.Errorf("%w: failure policy %q: want resplit or fail", errs.ErrInvalid, s)
}

func (p FailurePolicy) String() string {
	if p == PolicyFail {
		return "fail"
	}
	return "resplit"
}

// MaxDemandRows bounds the learners' batch sizes added up: a demand over
// it is refused, and Split refuses weights adding up past it.
const MaxDemandRows = 1 << 62

// Share is one learner's part of a batch: rows [Start, Start+Rows).
type Share struct {
	Learner string
	Start   int64
	Rows    int64
}

// Split divides rows [0, rows) into contiguous shares, one per learner in
// the given order, proportional to weights (each learner's declared batch
// size). When the weights sum to rows every learner gets exactly its weight;
// otherwise (the batch differs from the demand, or membership changed since
// the demand was recorded) the shares are recomputed proportionally with
// largest remainders (ties to the earlier learner). The shares always cover
// every row exactly once: never truncated, never duplicated. A learner may
// get 0 rows. Errors wrap errs.ErrInvalid.
func Split(rows int64, learners []string, weights []int64) ([]Share, error) {
	if len(learners) != len(weights) {
		return nil, fmt.Errorf("%w: %d learners but %d weights", errs.ErrInvalid, len(learners), len(weights))
	}
	if len(learners) == 0 {
		return nil, fmt.Errorf("%w: no learners to split %d rows among", errs.ErrUnavailable, rows)
	}
	if rows < 0 {
		return nil, fmt.Errorf("%w: negative row count %d", errs.ErrInvalid, rows)
	}
	var total uint64
	for i, w := range weights {
		if w < 0 {
			return nil, fmt.Errorf("%w: learner %q has negative weight %d", errs.ErrInvalid, learners[i], w)
		}
		var carry uint64
		total, carry = bits.Add64(total, uint64(w), 0)
		if carry != 0 || total > MaxDemandRows {
			return nil, fmt.Errorf("%w: learner weights overflow", errs.ErrInvalid)
		}
	}
	if total == 0 {
		return nil, fmt.Errorf("%w: every learner declared a batch size of 0", errs.ErrInvalid)
	}
	sizes := make([]int64, len(weights))
	rem := make([]uint64, len(weights))
	var given int64
	for i, w := range weights {
		hi, lo := bits.Mul64(uint64(rows), uint64(w))
		q, r := bits.Div64(hi, lo, total) // hi < total since w ≤ total
		sizes[i], rem[i] = int64(q), r
		given += int64(q)
	}
	// Hand out the leftover rows by largest remainder, earlier learner first.
	idx := make([]int, len(weights))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
	for k := 0; given < rows; k++ {
		sizes[idx[k%len(idx)]]++
		given++
	}
	out := make([]Share, len(learners))
	var start int64
	for i, id := range learners {
		out[i] = Share{Learner: id, Start: start, Rows: sizes[i]}
		start += sizes[i]
	}
	return out, nil
}

// Resplit divides a failed share among the surviving learners (in order,
// proportional to weights), keeping the share's row range.
func Resplit(failed Share, learners []string, weights []int64) ([]Share, error) {
	out, err := Split(failed.Rows, learners, weights)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Start += failed.Start
	}
	return out, nil
}

// BatchRows returns the common first dimension of every tensor in batch.
// Errors wrap errs.ErrInvalid: an empty batch, a scalar tensor, or tensors
// that disagree on the row count.
func BatchRows(batch *tensor.StateDict) (int64, error) {
	if batch == nil || batch.Len() == 0 {
		return 0, fmt.Errorf("%w: empty batch (no tensors)", errs.ErrInvalid)
	}
	var rows int64 = -1
	var first string
	for _, t := range batch.Tensors() {
		if len(t.Shape) == 0 {
			return 0, fmt.Errorf("%w: batch tensor %q is a scalar; every tensor needs a first (row) dimension", errs.ErrInvalid, t.Name)
		}
		if rows < 0 {
			rows, first = t.Shape[0], t.Name
		} else if t.Shape[0] != rows {
			return 0, fmt.Errorf("%w: batch tensor %q has %d rows, %q has %d", errs.ErrInvalid, t.Name, t.Shape[0], first, rows)
		}
	}
	return rows, nil
}

// SliceRows returns rows [start, start+n) of every tensor in batch as a new
// state dict whose tensors alias batch's data (no copy). The caller has
// checked the range with BatchRows; a range outside it panics.
func SliceRows(batch *tensor.StateDict, start, n int64) *tensor.StateDict {
	out := &tensor.StateDict{}
	for _, t := range batch.Tensors() {
		if start < 0 || n < 0 || start+n > t.Shape[0] {
			panic(fmt.Sprintf("aggregator.SliceRows: rows [%d,%d) outside %q with %d rows", start, start+n, t.Name, t.Shape[0]))
		}
		rowBytes := int64(0)
		if t.Shape[0] > 0 {
			rowBytes = int64(len(t.Data)) / t.Shape[0]
		}
		shape := slices.Clone(t.Shape)
		shape[0] = n
		v := &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: t.Data[start*rowBytes : (start+n)*rowBytes : (start+n)*rowBytes]}
		if err := out.Add(v); err != nil {
			panic(err) // names were unique and sizes consistent in batch
		}
	}
	return out
}

// MergeDemand merges the learners' demands: batch sizes add up; every other
// field is taken from the first learner and must be equal on every other
// one. learners names each demand for error messages. Errors wrap
// errs.ErrInvalid and name the learner that disagrees.
func MergeDemand(learners []string, demands []*rlhubv1.Demand) (*rlhubv1.Demand, error) {
	if len(learners) != len(demands) || len(demands) == 0 {
		return nil, fmt.Errorf("%w: %d demands for %d learners", errs.ErrInvalid, len(demands), len(learners))
	}
	out := &rlhubv1.Demand{}
	for i, d := range demands {
		if d == nil {
			return nil, fmt.Errorf("%w: learner %q sent no demand", errs.ErrInvalid, learners[i])
		}
		if d.BatchSize < 0 {
			return nil, fmt.Errorf("%w: learner %q demands a negative batch size %d", errs.ErrInvalid, learners[i], d.BatchSize)
		}
		if d.BatchSize > MaxDemandRows-out.BatchSize {
			return nil, fmt.Errorf("%w: merged batch size passes %d rows at learner %q", errs.ErrInvalid, int64(MaxDemandRows), learners[i])
		}
		out.BatchSize += d.BatchSize
		if i == 0 {
			out.Fields = proto.Clone(orEmpty(d.Fields)).(*structpb.Struct)
			continue
		}
		if k, ok := firstDifference(out.Fields, orEmpty(d.Fields)); ok {
			return nil, fmt.Errorf("%w: learner %q demand field %q disagrees with learner %q", errs.ErrInvalid, learners[i], k, learners[0])
		}
	}
	return out, nil
}

func orEmpty(s *structpb.Struct) *structpb.Struct {
	if s == nil {
		return &structpb.Struct{}
	}
	return s
}

// firstDifference returns the smallest key on which a and b differ.
func firstDifference(a, b *structpb.Struct) (string, bool) {
	keys := make([]string, 0, len(a.Fields)+len(b.Fields))
	for k := range a.Fields {
		keys = append(keys, k)
	}
	for k := range b.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		va, oka := a.Fields[k]
		vb, okb := b.Fields[k]
		if oka != okb || !proto.Equal(va, vb) {
			return k, true
		}
	}
	return "", false
}

// Outcome is what became of one share sent to its learner: its info, or
// the error that made it fail.
type Outcome struct {
	Info *rlhubv1.Value
	Err  error
}

// Plan follows one learn task's shares through learner failures: the pure
// part of Learn. The caller sends the Pending shares (a round), Reports
// their outcomes in the same order, and repeats until Pending is empty;
// then Result merges the infos. A Plan is not safe for concurrent use.
type Plan struct {
	rows     int64
	order    []string
	weight   map[string]int64
	policy   FailurePolicy
	pending  []Share
	done     []InfoPart
	shares   []Share // parallel to done
	excluded map[string]bool
	failed   []string
	resplits int
}

// NewPlan splits rows over the learners in order by weight (see Split);
// the first round holds every share with rows.
func NewPlan(rows int64, order []string, weights []int64, policy FailurePolicy) (*Plan, error) {
	shares, err := Split(rows, order, weights)
	if err != nil {
		return nil, err
	}
	p := &Plan{rows: rows, order: slices.Clone(order), weight: make(map[string]int64, len(order)),
		policy: policy, excluded: make(map[string]bool)}
	for i, id := range order {
		p.weight[id] = weights[i]
	}
	p.pending = nonEmpty(shares)
	return p, nil
}

func nonEmpty(shares []Share) []Share {
	return slices.DeleteFunc(shares, func(s Share) bool { return s.Rows == 0 })
}

// Pending returns the shares of the current round; empty when the task is
// complete. The slice is the Plan's own until the next Report.
func (p *Plan) Pending() []Share { return p.pending }

// Failed lists the learners excluded so far, in the order they failed.
func (p *Plan) Failed() []string { return p.failed }

// Resplits counts the failed shares re-split so far.
func (p *Plan) Resplits() int { return p.resplits }

// Report records the outcomes of the current round (one per Pending share,
// in order). A failed share excludes its learner from the task; under
// PolicyResplit its rows are re-split over the learners not excluded (by
// weight, or equally if they all weigh 0) to form the next round. It fails
// under PolicyFail, or when no learner is left, with the learners' errors.
func (p *Plan) Report(outs []Outcome) error {
	if len(outs) != len(p.pending) {
		panic(fmt.Sprintf("aggregator: Plan.Report got %d outcomes for %d shares", len(outs), len(p.pending)))
	}
	var retry []Share
	var failures []error
	for i, sh := range p.pending {
		if outs[i].Err == nil {
			p.done = append(p.done, InfoPart{Learner: sh.Learner, Info: outs[i].Info})
			p.shares = append(p.shares, sh)
			continue
		}
		failures = append(failures, outs[i].Err)
		retry = append(retry, sh)
		if !p.excluded[sh.Learner] {
			p.excluded[sh.Learner] = true
			p.failed = append(p.failed, sh.Learner)
		}
	}
	p.pending = nil
	if len(retry) == 0 {
		return nil
	}
	if p.policy == PolicyFail {
		return fmt.Errorf("failed: %w", errors.Join(failures...))
	}
	var survivors []string
	var w []int64
	for _, id := range p.order {
		if !p.excluded[id] {
			survivors = append(survivors, id)
			w = append(w, p.weight[id])
		}
	}
	if len(survivors) == 0 {
		return fmt.Errorf("%w: no learner left to re-split onto: %w", errs.ErrUnavailable, errors.Join(failures...))
	}
	var total int64
	for _, x := range w {
		total += x
	}
	if total == 0 { // only learners that asked for nothing are left
		for i := range w {
			w[i] = 1
		}
	}
	for _, sh := range retry {
		more, err := Resplit(sh, survivors, w)
		if err != nil {
			return err
		}
		p.pending = append(p.pending, nonEmpty(more)...)
	}
	p.resplits += len(retry)
	return nil
}

// Result checks that the succeeded shares tile every row exactly once and
// merges their infos in row order (see MergeInfo).
func (p *Plan) Result(m Merge) (*rlhubv1.LearnResponse, error) {
	if len(p.pending) > 0 {
		return nil, fmt.Errorf("aggregator: Plan.Result with %d shares pending", len(p.pending))
	}
	idx := make([]int, len(p.shares))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(p.shares[a].Start, p.shares[b].Start) })
	resp := &rlhubv1.LearnResponse{Failed: slices.Clone(p.failed)}
	parts := make([]InfoPart, len(idx))
	var covered int64
	for k, i := range idx {
		sh := p.shares[i]
		if sh.Start != covered {
			// Split and Resplit tile the rows; this would be our bug.
			return nil, fmt.Errorf("aggregator: internal error: rows [%d,%d) not covered", covered, sh.Start)
		}
		covered += sh.Rows
		parts[k] = p.done[i]
		resp.Shares = append(resp.Shares, &rlhubv1.Share{LearnerId: sh.Learner, RowStart: sh.Start, Rows: sh.Rows})
	}
	if covered != p.rows {
		return nil, fmt.Errorf("aggregator: internal error: %d of %d rows covered", covered, p.rows)
	}
	info, err := MergeInfo(parts, m)
	if err != nil {
		return nil, err
	}
	resp.Info = info
	return resp, nil
}
