package ars

import (
	"fmt"
	"math"

	"github.com/rlhub/rlhub/internal/errs"
)

// Stats is a running mean and variance of observation vectors (Welford),
// mergeable across processes with Chan et al.'s parallel formula. The zero
// value (Dim 0) is unusable; make one with NewStats.
//
// Merging is not associative in floating point, so rlhub always merges in a
// fixed order (directions by index) to stay bit-identical.
type Stats struct {
	Count float64   // number of vectors seen
	Mean  []float64 // per-component mean
	M2    []float64 // per-component sum of squared deviations
}

// NewStats returns empty statistics for dim-dimensional vectors.
func NewStats(dim int) *Stats {
	return &Stats{Mean: make([]float64, dim), M2: make([]float64, dim)}
}

// Dim returns the vector length.
func (s *Stats) Dim() int { return len(s.Mean) }

// Clone returns a deep copy.
func (s *Stats) Clone() *Stats {
	return &Stats{Count: s.Count, Mean: append([]float64(nil), s.Mean...), M2: append([]float64(nil), s.M2...)}
}

// Push adds one vector (Welford's update). len(x) must equal Dim.
func (s *Stats) Push(x []float64) {
	s.Count++
	for i, v := range x {
		d := v - s.Mean[i]
		s.Mean[i] += d / s.Count
		s.M2[i] += float64(d * (v - s.Mean[i]))
	}
}

// Merge adds o's vectors into s (Chan et al.):
// n = na+nb, δ = mb−ma, mean = ma + δ·nb/n, M2 = M2a + M2b + δ²·na·nb/n.
// It fails, changing nothing, when the dimensions differ or o is not a
// valid statistic of one task (negative or fractional count, NaN,
// negative M2, or past taskStats' bounds).
func (s *Stats) Merge(o *Stats) error {
	if err := o.check(s.Dim(), taskStats); err != nil {
		return err
	}
	if o.Count == 0 {
		return nil
	}
	if s.Count == 0 {
		s.Count = o.Count
		copy(s.Mean, o.Mean)
		copy(s.M2, o.M2)
		return nil
	}
	n := s.Count + o.Count
	for i := range s.Mean {
		d := o.Mean[i] - s.Mean[i]
		s.Mean[i] += float64(d * o.Count / n)
		s.M2[i] += o.M2[i] + float64(float64(d*d)*s.Count*o.Count/n)
	}
	s.Count = n
	return nil
}

// statsLimits bound statistics that arrive from elsewhere (Stats.check).
type statsLimits struct {
	count, mean, m2 float64
}

var (
	// taskStats bound one task's statistics (Trainer.Check, Merge's
	// argument): so that merging them (Welford: δ²·n·m/(n+m)) stays
	// finite and a run's counts never overflow.
	taskStats = statsLimits{count: maxTaskSteps, mean: maxReturn, m2: maxM2}
	// runStats bound a run's cumulative statistics (a policy's filter,
	// a restored state): a count up to 2^53 (every whole number below it
	// is exact in float64; a long Humanoid run passes 2^32 states), a mean
	// that merging task means within ±maxReturn cannot leave (up to
	// rounding), and an M2 that 2^53 merges of tasks within taskStats
	// cannot pass (each adds at most maxM2 + (2·maxReturn)²·2^32).
	runStats = statsLimits{count: maxRunStates, mean: 2 * maxReturn, m2: maxRunM2}
)

// check validates statistics that arrived from elsewhere against lim.
func (s *Stats) check(dim int, lim statsLimits) error {
	if len(s.Mean) != dim || len(s.M2) != dim {
		return fmt.Errorf("%w: filter statistics of dimension %d/%d, want %d", errs.ErrInvalid, len(s.Mean), len(s.M2), dim)
	}
	if !(s.Count >= 0) || s.Count != math.Trunc(s.Count) || s.Count > lim.count {
		return fmt.Errorf("%w: filter count %v is not a whole number from 0 to %d", errs.ErrInvalid, s.Count, int64(lim.count))
	}
	for i := range s.Mean {
		if !(s.M2[i] >= 0) && finite(s.M2[i]) {
			return fmt.Errorf("%w: filter component %d has M2 %v < 0", errs.ErrInvalid, i, s.M2[i])
		}
		if !finite(s.Mean[i]) || !finite(s.M2[i]) || math.Abs(s.Mean[i]) > lim.mean || s.M2[i] > lim.m2 {
			// Values, not shape: observations that left the finite
			// range (or the bounds) are a diverging run.
			return diverged("filter component %d has mean %v, M2 %v (finite, |mean| ≤ %g, 0 ≤ M2 ≤ %g)", i, s.Mean[i], s.M2[i], lim.mean, lim.m2)
		}
	}
	if s.Count == 0 {
		for i := range s.Mean {
			if s.Mean[i] != 0 || s.M2[i] != 0 {
				return fmt.Errorf("%w: empty filter statistics with nonzero moments", errs.ErrInvalid)
			}
		}
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Bounds of Stats.check: maxM2 bounds one task's filter component M2;
// maxRunStates and maxRunM2 a run's cumulative count and M2 (runStats).
const (
	maxM2        = 1e250
	maxRunStates = 1 << 53
	maxRunM2     = 1e280
)

// MinStd is the standard deviation below which a component is treated as
// constant: its normalised value is 0. The authors' filter
// (modestyachts/ARS code/filter.py, MeanStdFilter.stats_increment) sets a
// std below 1e-7 to +∞, so this is 1e-7 too; with 1e-8 a component with
// σ in [1e-8, 1e-7) would be amplified up to 10⁸× instead of dropped.
// (That filter also divides by σ + 1e-8 rather than σ, a relative
// difference of at most 1e-8/σ ≤ 0.1 that rlhub does not copy.)
const MinStd = 1e-7

// Filter is the frozen normalisation x ↦ (x − μ) ⊘ σ that a V2 policy
// applies within one iteration. The zero value of a component's InvStd
// makes it 0.
type Filter struct {
	Mean   []float64
	InvStd []float64 // 1/σ, or 0 for a constant component
}

// Freeze returns the filter for the current statistics. With fewer than two
// vectors seen it is the identity (μ = 0, Σ = I, Algorithm 2's
// initialisation); otherwise σ² is the sample variance M2/(n−1).
func (s *Stats) Freeze() Filter {
	f := Filter{Mean: make([]float64, s.Dim()), InvStd: make([]float64, s.Dim())}
	if s.Count < 2 {
		for i := range f.InvStd {
			f.InvStd[i] = 1
		}
		return f
	}
	copy(f.Mean, s.Mean)
	for i := range f.InvStd {
		sd := math.Sqrt(s.M2[i] / (s.Count - 1))
		if sd >= MinStd {
			f.InvStd[i] = 1 / sd
		}
	}
	return f
}

// Identity returns the filter of a V1 policy (no normalisation).
func Identity(dim int) Filter {
	f := Filter{Mean: make([]float64, dim), InvStd: make([]float64, dim)}
	for i := range f.InvStd {
		f.InvStd[i] = 1
	}
	return f
}

// Apply writes the normalised x into dst. dst and x have length Dim.
func (f Filter) Apply(dst, x []float64) {
	for i, v := range x {
		dst[i] = (v - f.Mean[i]) * f.InvStd[i]
	}
}
