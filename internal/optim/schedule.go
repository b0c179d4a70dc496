package optim

import (
	"fmt"
	"math"

	"github.com/rlhub/rlhub/internal/errs"
)

// ScheduleKind names a learning-rate schedule.
type ScheduleKind string

// The supported schedules.
const (
	// Constant keeps the base rate (the zero value).
	Constant ScheduleKind = ""
	// StepDecay multiplies the rate by Gamma every StepSize steps
	// (torch.optim.lr_scheduler.StepLR).
	StepDecay ScheduleKind = "step"
	// Cosine anneals from the base rate to MinLR over TMax steps
	// (torch.optim.lr_scheduler.CosineAnnealingLR, closed form), then
	// follows the cosine on, as PyTorch does.
	Cosine ScheduleKind = "cosine"
)

// Schedule gives the learning rate of each step as a function of the step
// index, so it needs no state of its own: restoring the optimizer's step
// count restores the schedule.
//
// The rate at step k is base(k) × warm(k), where base is the Kind's curve and
// warm is the linear warm-up factor: WarmupStart + (1 − WarmupStart)·k/
// WarmupSteps for k < WarmupSteps, then 1
// (torch.optim.lr_scheduler.LinearLR with end_factor 1).
type Schedule struct {
	// Kind of the base curve; "" is constant.
	Kind ScheduleKind `json:"kind,omitempty"`
	// StepSize (StepDecay): steps between decays; required > 0.
	StepSize int64 `json:"step_size,omitempty"`
	// Gamma (StepDecay): decay factor; 0 means 0.1.
	Gamma float64 `json:"gamma,omitempty"`
	// TMax (Cosine): half period in steps; required > 0.
	TMax int64 `json:"t_max,omitempty"`
	// MinLR (Cosine): the floor, eta_min; 0 means 0.
	MinLR float64 `json:"min_lr,omitempty"`
	// WarmupSteps of linear warm-up; 0 means none.
	WarmupSteps int64 `json:"warmup_steps,omitempty"`
	// WarmupStart is the warm-up's first factor, in (0, 1]; 0 means 1/3
	// (PyTorch's LinearLR default).
	WarmupStart float64 `json:"warmup_start,omitempty"`
}

// Validate fills defaults and rejects nonsense, wrapping errs.ErrInvalid.
func (s *Schedule) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: lr schedule %q: %s", errs.ErrInvalid, s.Kind, fmt.Sprintf(format, args...))
	}
	if math.IsNaN(s.Gamma) || math.IsNaN(s.MinLR) || math.IsNaN(s.WarmupStart) ||
		math.IsInf(s.Gamma, 0) || math.IsInf(s.MinLR, 0) || math.IsInf(s.WarmupStart, 0) {
		return bad("non-finite parameter")
	}
	switch s.Kind {
	case Constant:
		if s.StepSize != 0 || s.Gamma != 0 || s.TMax != 0 || s.MinLR != 0 {
			return bad("constant takes no step_size, gamma, t_max or min_lr")
		}
	case StepDecay:
		if s.StepSize <= 0 {
			return bad("step_size %d must be > 0", s.StepSize)
		}
		if s.Gamma == 0 {
			s.Gamma = 0.1
		}
		if s.Gamma < 0 {
			return bad("gamma %v must be > 0", s.Gamma)
		}
		if s.TMax != 0 || s.MinLR != 0 {
			return bad("step takes no t_max or min_lr")
		}
	case Cosine:
		if s.TMax <= 0 {
			return bad("t_max %d must be > 0", s.TMax)
		}
		if s.MinLR < 0 {
			return bad("min_lr %v must be ≥ 0", s.MinLR)
		}
		if s.StepSize != 0 || s.Gamma != 0 {
			return bad("cosine takes no step_size or gamma")
		}
	default:
		return fmt.Errorf("%w: unknown lr schedule %q (want \"\", step or cosine)", errs.ErrInvalid, s.Kind)
	}
	if s.WarmupSteps < 0 {
		return bad("warmup_steps %d must be ≥ 0", s.WarmupSteps)
	}
	if s.WarmupSteps > 0 && s.WarmupStart == 0 {
		s.WarmupStart = 1.0 / 3
	}
	if s.WarmupStart < 0 || s.WarmupStart > 1 {
		return bad("warmup_start %v must be in (0, 1]", s.WarmupStart)
	}
	return nil
}

// LR returns the learning rate of step k (0-based) for base rate lr.
func (s *Schedule) LR(lr float64, k int64) float64 {
	switch s.Kind {
	case StepDecay:
		lr *= math.Pow(s.Gamma, float64(k/s.StepSize))
	case Cosine:
		lr = s.MinLR + (lr-s.MinLR)*(1+math.Cos(math.Pi*float64(k)/float64(s.TMax)))/2
	}
	if k < s.WarmupSteps {
		lr *= s.WarmupStart + (1-s.WarmupStart)*float64(k)/float64(s.WarmupSteps)
	}
	return lr
}
