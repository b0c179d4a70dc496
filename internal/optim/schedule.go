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
	// (torch.optim.lr_scheduler.CosineAnnealingLR, its recursive form),
	// then follows the cosine on, as PyTorch does.
	Cosine ScheduleKind = "cosine"
)

// Schedule gives the learning rate of each step as a function of the step
// index, so it needs no state of its own: restoring the optimizer's step
// count restores the schedule.
//
// The rate is exactly what torch's scheduler objects give, in torch's own
// (recursive, float64) arithmetic, with the pattern `opt.step();
// sched.step()`:
//
//	constant            no scheduler
//	step                StepLR(step_size, gamma)
//	cosine              CosineAnnealingLR(T_max, eta_min=min_lr)
//	warm-up alone       LinearLR(start_factor=warmup_start, end_factor=1, total_iters=warmup_steps)
//	warm-up + step      ChainedScheduler([LinearLR(...), StepLR(...)])
//	warm-up + cosine    ChainedScheduler([LinearLR(...), CosineAnnealingLR(...)])
//
// ChainedScheduler (both curves run from step 0, each scaling the rate the
// other left) is the torch composition of rlhub's semantics: the warm-up
// ramps whatever the base curve gives. Without a floor (min_lr 0) and for
// step decay the rate is base(k)·warm(k); with a cosine floor it is not: the
// cosine's recurrence lr ← eta_min + r_k·(lr − eta_min) is applied to the
// warmed-up rate, as torch does. SequentialLR (the cosine starting after
// the warm-up) is a different schedule; it is not offered.
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

// schedCursor is the chained schedulers' rate after k scheduler steps.
type schedCursor struct {
	k     int64
	lr    float64
	valid bool
}

// begin is the schedulers' construction: LinearLR's initial step scales the
// rate by start_factor; StepLR's and CosineAnnealingLR's leave it.
func (s *Schedule) begin(base float64) schedCursor {
	lr := base
	if s.WarmupSteps > 0 {
		lr = float64(lr * s.WarmupStart)
	}
	return schedCursor{lr: lr, valid: true}
}

// advance is one ChainedScheduler.step(): LinearLR's get_lr, then the base
// curve's, each on the rate the previous left. Products are pinned with
// float64 conversions so that Go never fuses them into a multiply-add
// (Python does not).
func (s *Schedule) advance(base float64, c *schedCursor) {
	t := c.k + 1
	lr := c.lr
	if s.WarmupSteps > 0 && t <= s.WarmupSteps {
		start, end := s.WarmupStart, 1.0
		lr = float64(lr * (1.0 + (end-start)/(float64(float64(s.WarmupSteps)*start)+float64(float64(t-1)*(end-start)))))
	}
	switch s.Kind {
	case StepDecay:
		if t%s.StepSize == 0 {
			lr = float64(lr * s.Gamma)
		}
	case Cosine:
		T := s.TMax
		if m := 2 * T; ((t-1-T)%m+m)%m == 0 {
			lr = lr + float64(float64((base-s.MinLR)*(1-math.Cos(math.Pi/float64(T))))/2)
		} else {
			r := (1 + math.Cos(math.Pi*float64(t)/float64(T))) / (1 + math.Cos(math.Pi*float64(t-1)/float64(T)))
			lr = float64(r*(lr-s.MinLR)) + s.MinLR
		}
	}
	c.k, c.lr = t, lr
}

// skip moves c toward k over the scheduler steps that leave the rate as it
// is: past the warm-up, every step of a constant rate and, for step decay,
// those between two decays.
func (s *Schedule) skip(c *schedCursor, k int64) {
	if c.k < s.WarmupSteps {
		return
	}
	switch s.Kind {
	case Constant:
		c.k = k
	case StepDecay:
		next := (c.k/s.StepSize + 1) * s.StepSize // the next decay's step
		c.k = max(c.k, min(k, next-1))
	}
}

// follow moves c to k, a scheduler step at a time where the rate changes.
func (s *Schedule) follow(base float64, c *schedCursor, k int64) {
	for c.k < k {
		if s.skip(c, k); c.k < k {
			s.advance(base, c)
		}
	}
}

// replays is how many scheduler steps follow takes from the start to k.
func (s *Schedule) replays(k int64) int64 {
	switch s.Kind {
	case Constant:
		return min(k, s.WarmupSteps)
	case StepDecay:
		return min(k, s.WarmupSteps) + k/s.StepSize
	}
	return k
}

// LR returns the learning rate of step k (0-based) for base rate lr. It
// replays the scheduler steps that change the rate (up to O(k));
// Optimizer.LR follows them incrementally.
func (s *Schedule) LR(lr float64, k int64) float64 {
	c := s.begin(lr)
	s.follow(lr, &c, k)
	return c.lr
}
