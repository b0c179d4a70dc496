package ars

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/rlhub/rlhub/internal/errs"
)

// Version is one of the paper's four ARS variants (Algorithm 2).
type Version int

const (
	// V1: linear map of the raw state, all N directions used.
	V1 Version = iota + 1
	// V2: state normalised by the running mean/std, all N directions.
	V2
	// V1t: V1 keeping only the top b directions.
	V1t
	// V2t: V2 keeping only the top b directions.
	V2t
)

var versionNames = map[Version]string{V1: "V1", V2: "V2", V1t: "V1-t", V2t: "V2-t"}

func (v Version) String() string {
	if s, ok := versionNames[v]; ok {
		return s
	}
	return fmt.Sprintf("Version(%d)", int(v))
}

// ParseVersion reads "V1", "V2", "V1-t" or "V2-t" (case-insensitive).
func ParseVersion(s string) (Version, error) {
	for v, name := range versionNames {
		if strings.EqualFold(s, name) {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: ARS version %q: want V1, V2, V1-t or V2-t", errs.ErrInvalid, s)
}

// Normalises reports whether the version uses state normalisation.
func (v Version) Normalises() bool { return v == V2 || v == V2t }

// Truncates reports whether the version keeps only the top b directions.
func (v Version) Truncates() bool { return v == V1t || v == V2t }

// Hyper are the algorithm's hyperparameters.
type Hyper struct {
	Version Version
	// Directions is N, the directions sampled per iteration.
	Directions int
	// Top is b, the directions kept; 0 means N. Non-truncating versions
	// require b = N.
	Top int
	// StepSize is α.
	StepSize float64
	// Noise is ν, the exploration noise standard deviation.
	Noise float64
	// Shift is subtracted from every reward in training episodes (the
	// survival-bonus correction); never in evaluation.
	Shift float64
}

// Validate fills Top and rejects nonsense.
func (h *Hyper) Validate() error {
	if _, ok := versionNames[h.Version]; !ok {
		return fmt.Errorf("%w: unknown ARS version %d", errs.ErrInvalid, h.Version)
	}
	if h.Directions < 1 || h.Directions > 1<<20 {
		return fmt.Errorf("%w: directions %d outside [1, 2^20]", errs.ErrInvalid, h.Directions)
	}
	if h.Top == 0 {
		h.Top = h.Directions
	}
	if h.Top < 1 || h.Top > h.Directions {
		return fmt.Errorf("%w: top b = %d outside [1, N = %d]", errs.ErrInvalid, h.Top, h.Directions)
	}
	if !h.Version.Truncates() && h.Top != h.Directions {
		return fmt.Errorf("%w: %v uses all directions: top b = %d must equal N = %d (or use %v-t)", errs.ErrInvalid, h.Version, h.Top, h.Directions, h.Version)
	}
	if !(h.StepSize > 0) || math.IsInf(h.StepSize, 0) {
		return fmt.Errorf("%w: step size %v must be > 0 and finite", errs.ErrInvalid, h.StepSize)
	}
	if !(h.Noise > 0) || math.IsInf(h.Noise, 0) {
		return fmt.Errorf("%w: noise %v must be > 0 and finite", errs.ErrInvalid, h.Noise)
	}
	if !finite(h.Shift) {
		return fmt.Errorf("%w: shift %v must be finite", errs.ErrInvalid, h.Shift)
	}
	return nil
}

// TopB returns the indices of the b directions with the largest
// max(r+, r−), largest first; equal keys are ordered by lower index, so
// exactly b indices come back whatever the ties.
func TopB(rplus, rminus []float64, b int) []int {
	idx := make([]int, len(rplus))
	for i := range idx {
		idx[i] = i
	}
	key := func(i int) float64 { return max(rplus[i], rminus[i]) }
	slices.SortStableFunc(idx, func(i, j int) int {
		ki, kj := key(i), key(j)
		switch {
		case ki > kj:
			return -1
		case ki < kj:
			return 1
		}
		return i - j
	})
	return idx[:b]
}

// StepInfo describes one update.
type StepInfo struct {
	Selected []int   // directions used, in TopB order
	SigmaR   float64 // population std of the 2b rewards used
	Scale    float64 // α/(b·σ_R), 0 when σ_R = 0 (the paper's step)
	// Grad describes the ARS gradient when Config.Update is not the
	// default (only LR otherwise).
	Grad GradInfo
}

// Step performs Algorithm 2's update in place:
//
//	θ ← θ + α/(b·σ_R) · Σ_{k=1..b} (r+_(k) − r−_(k)) · δ_(k)
//
// over the top b directions (TopB), σ_R being the population standard
// deviation of their 2b rewards. The sum runs in TopB order into a zeroed
// accumulator, then is scaled and added to θ. When σ_R = 0 every kept
// difference is 0 and θ is left unchanged. direction(d, dst) writes δ_d.
// rplus and rminus must have length h.Directions and be finite (callers
// validate what arrives from workers).
func Step(theta []float64, h *Hyper, rplus, rminus []float64, direction func(d int, dst []float64)) StepInfo {
	sel := TopB(rplus, rminus, h.Top)
	info := StepInfo{Selected: sel, SigmaR: sigmaR(rplus, rminus, sel)}
	if info.SigmaR == 0 {
		return info
	}
	info.Scale = h.StepSize / (float64(len(sel)) * info.SigmaR)
	g := make([]float64, len(theta))
	delta := make([]float64, len(theta))
	for _, d := range sel {
		direction(d, delta)
		diff := rplus[d] - rminus[d]
		for i := range g {
			g[i] += float64(diff * delta[i])
		}
	}
	for i := range theta {
		theta[i] += float64(info.Scale * g[i])
	}
	return info
}

// Perturb writes θ + sign·ν·δ into dst (sign is +1 or −1).
func Perturb(dst, theta, delta []float64, nu float64, sign float64) {
	for i := range dst {
		dst[i] = theta[i] + float64(sign*float64(nu*delta[i]))
	}
}
