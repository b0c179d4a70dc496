package ars

import (
	"fmt"
	"math"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/tensor"
)

// PaperStep is Update.Optimizer.Kind's name for the paper's update (the
// default, also written ""): θ ← θ + α_k/(b·σ_R) · Σ (r+ − r−) · δ in
// float64, α_k being the step size under the schedule.
const PaperStep optim.Kind = "step"

// Update says how θ moves each iteration: the paper's step (the default)
// or, as Machin's distributed ARS does, one of internal/optim's torch
// optimizers applied to the ARS gradient, with an lr schedule and
// gradient-norm clipping.
//
// The ARS gradient is Machin's (machin.frame.algorithms.ars, ARS.update
// and _cal_gradient), a descent direction for a loss:
//
//	g = 1/(b·σ_R) · Σ_{k=1..b} (r−_(k) − r+_(k)) · ν·δ_(k)
//
// over the top b directions, σ_R being the population standard deviation
// of their 2b rewards and ν·δ the perturbation actually applied (Machin's
// noise table holds ν·N(0,1)). With σ_R = 0 every kept difference is 0 and
// g = 0 (the optimizer still steps, as torch's would on a zero gradient).
//
// With an optimizer θ is a float32 parameter vector, as Machin's torch
// actor: g is rounded to float32, clipped, and the optimizer (learning rate
// Hyper.StepSize, its Schedule) steps θ; plain SGD is then the paper's
// step with α = StepSize·ν, to float32 rounding. The paper's step keeps θ
// in float64 and is bit-identical to Step when nothing else is set.
type Update struct {
	// Optimizer selects and configures the optimizer: Kind "" or PaperStep
	// for the paper's step (only Schedule may be set then), or an
	// optim.Kind with that kind's hyper-parameters. LR must be 0 or equal
	// Hyper.StepSize: the step size is the learning rate. Schedule (any of
	// internal/optim's, torch's scheduler arithmetic) scales the step size
	// by update index k = 0, 1, … in both cases.
	Optimizer optim.Config
	// GradientMax clips g's global L2 norm as
	// torch.nn.utils.clip_grad_norm_(params, GradientMax) does: g is
	// multiplied by min(1, GradientMax/(‖g‖ + 1e-6)). 0 means none
	// (Machin's default, np.inf).
	GradientMax float64
}

// Plain reports whether the update is the paper's step.
func (u *Update) Plain() bool { return u.Optimizer.Kind == "" || u.Optimizer.Kind == PaperStep }

// Default reports whether the update is exactly Step: the paper's step
// with a constant rate and no clipping.
func (u *Update) Default() bool {
	return u.Plain() && u.GradientMax == 0 && u.Optimizer.Schedule == (optim.Schedule{})
}

// validate fills defaults; stepSize is Hyper.StepSize (already valid).
func (u *Update) validate(stepSize float64) error {
	if !(u.GradientMax >= 0) || math.IsInf(u.GradientMax, 0) {
		return fmt.Errorf("%w: gradient_max %v must be ≥ 0 and finite (0: no clipping)", errs.ErrInvalid, u.GradientMax)
	}
	o := &u.Optimizer
	if o.LR != 0 && o.LR != stepSize {
		return fmt.Errorf("%w: optimizer lr %v: the ARS step size (%v) is the learning rate; leave lr unset", errs.ErrInvalid, o.LR, stepSize)
	}
	if u.Plain() {
		o.Kind = PaperStep
		sched := o.Schedule
		rest := *o
		rest.Kind, rest.LR, rest.Schedule = "", 0, optim.Schedule{}
		if rest != (optim.Config{}) {
			return fmt.Errorf("%w: the paper's step takes no optimizer hyper-parameters (only an lr schedule); choose an optimizer such as sgd or adam", errs.ErrInvalid)
		}
		if err := sched.Validate(); err != nil {
			return err
		}
		o.Schedule, o.LR = sched, 0
		return nil
	}
	o.LR = stepSize
	return o.Validate()
}

// OptimState is a run's optimizer state between iterations (TrainerState):
// internal/optim's State as plain slices, one tensor "theta" of P
// parameters per slot.
type OptimState struct {
	Meta  map[string]string    `json:"meta"`
	Slots map[string][]float32 `json:"slots"`
}

const thetaName = "theta"

// newOptimizer returns u's optimizer for p parameters (nil for the paper's
// step).
func (u *Update) newOptimizer(p int) (*optim.Optimizer, error) {
	if u.Plain() {
		return nil, nil
	}
	return optim.New(u.Optimizer, thetaLayout(p))
}

func thetaLayout(p int) *tensor.StateDict {
	sd := &tensor.StateDict{}
	if err := sd.Add(tensor.NewF32(thetaName, int64(p))); err != nil {
		panic(err)
	}
	return sd
}

func optimState(o *optim.Optimizer) *OptimState {
	if o == nil {
		return nil
	}
	sd, meta := o.State()
	st := &OptimState{Meta: meta, Slots: map[string][]float32{}}
	for _, t := range sd.Tensors() {
		f, _ := t.Float32s()
		st.Slots[t.Name] = append([]float32(nil), f...)
	}
	return st
}

// restoreOptim loads st into o (built for p parameters); it validates
// everything st holds (it may come from a file).
func restoreOptim(o *optim.Optimizer, st *OptimState, p int) error {
	sd := &tensor.StateDict{}
	for name, f := range st.Slots {
		if len(f) != p {
			return fmt.Errorf("%w: restored optimizer slot %s has %d values, θ has %d", errs.ErrInvalid, errs.Quote(name), len(f), p)
		}
		for i, v := range f {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("%w: restored optimizer slot %s[%d] = %v", errs.ErrInvalid, errs.Quote(name), i, v)
			}
		}
		if err := sd.Add(tensor.FromFloat32s(name, []int64{int64(p)}, append([]float32(nil), f...))); err != nil {
			return fmt.Errorf("%w: restored optimizer state: %v", errs.ErrInvalid, err)
		}
	}
	return o.Restore(sd, st.Meta)
}

// GradInfo describes the gradient of one update (Report.Update).
type GradInfo struct {
	// Norm is ‖g‖ before clipping; Clipped: GradientMax scaled g.
	Norm    float64
	Clipped bool
	// LR is the step size (or learning rate) this update used.
	LR float64
}

// update moves θ by the iteration's rewards under t.cfg.Update; k is the
// update index (the schedule position). It returns the step's description.
func (t *Trainer) update(rplus, rminus []float64, k int64) StepInfo {
	h := &t.cfg.Hyper
	u := &t.cfg.Update
	seed, base := t.cfg.Seed, t.iter*uint64(h.Directions)
	direction := func(d int, dst []float64) { Direction(dst, seed, base+uint64(d)) }
	if u.Default() {
		info := Step(t.theta, h, rplus, rminus, direction)
		info.Grad.LR = h.StepSize
		return info
	}
	sel := TopB(rplus, rminus, h.Top)
	info := StepInfo{Selected: sel, SigmaR: sigmaR(rplus, rminus, sel)}
	// sum = Σ (r+ − r−)·δ in TopB order, as Step; g = −ν/(b·σ_R)·sum.
	sum := make([]float64, len(t.theta))
	if info.SigmaR != 0 {
		delta := make([]float64, len(t.theta))
		for _, d := range sel {
			direction(d, delta)
			diff := rplus[d] - rminus[d]
			for i := range sum {
				sum[i] += float64(diff * delta[i])
			}
		}
	}
	if u.Plain() {
		// θ ← θ − (α_k/ν)·clip(g) = θ + α_k/(b·σ_R)·c·sum.
		lr := u.Optimizer.Schedule.LR(h.StepSize, k)
		info.Grad.LR = lr
		if info.SigmaR == 0 {
			return info
		}
		gs := h.Noise / (float64(len(sel)) * info.SigmaR)
		var ss float64
		for _, v := range sum {
			ss += float64(float64(gs*v) * float64(gs*v))
		}
		info.Grad.Norm = math.Sqrt(ss)
		info.Scale = lr / (float64(len(sel)) * info.SigmaR)
		if u.GradientMax > 0 {
			if c := reduce.ClipCoef(u.GradientMax, info.Grad.Norm); c < 1 {
				info.Scale *= c
				info.Grad.Clipped = true
			}
		}
		for i := range t.theta {
			t.theta[i] += float64(info.Scale * sum[i])
		}
		return info
	}
	// An optimizer: float32 θ and g, as a torch actor.
	p := len(t.theta)
	g := make([]float32, p)
	if info.SigmaR != 0 {
		gs := -h.Noise / (float64(len(sel)) * info.SigmaR)
		for i, v := range sum {
			g[i] = float32(gs * v)
		}
	}
	var ss float64
	for _, v := range g {
		ss += float64(float64(v) * float64(v))
	}
	info.Grad.Norm = math.Sqrt(ss)
	if u.GradientMax > 0 {
		// torch: clip_coef = max/(norm + 1e-6) in float32, clamped to 1,
		// and the gradient multiplied by it.
		c := float32(float32(u.GradientMax) / (float32(info.Grad.Norm) + 1e-6))
		if c < 1 {
			for i := range g {
				g[i] *= c
			}
			info.Grad.Clipped = true
		}
	}
	info.Grad.LR = t.opt.LR()
	theta := make([]float32, p)
	for i, v := range t.theta {
		theta[i] = float32(v)
	}
	params := tensor.NewStateDictUnchecked([]*tensor.Tensor{tensor.FromFloat32s(thetaName, []int64{int64(p)}, theta)})
	grads := tensor.NewStateDictUnchecked([]*tensor.Tensor{tensor.FromFloat32s(thetaName, []int64{int64(p)}, g)})
	if err := t.opt.Step(params, grads); err != nil {
		panic(err) // unreachable: the layout is the optimizer's own
	}
	for i, v := range theta {
		t.theta[i] = float64(v)
	}
	return info
}

// sigmaR is the population standard deviation of the selected 2b rewards.
func sigmaR(rplus, rminus []float64, sel []int) float64 {
	var mean float64
	for _, d := range sel {
		mean += rplus[d]
		mean += rminus[d]
	}
	n := float64(2 * len(sel))
	mean /= n
	var ss float64
	for _, d := range sel {
		a, b := rplus[d]-mean, rminus[d]-mean
		ss += float64(a * a)
		ss += float64(b * b)
	}
	return math.Sqrt(ss / n)
}
