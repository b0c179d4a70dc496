package ars

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
)

func TestUpdateValidateRejects(t *testing.T) {
	for name, u := range map[string]Update{
		"step with momentum":   {Optimizer: optim.Config{Kind: PaperStep, Momentum: 0.9}},
		"lr other than α":      {Optimizer: optim.Config{Kind: optim.Adam, LR: 0.5}},
		"unknown kind":         {Optimizer: optim.Config{Kind: "lion"}},
		"negative clip":        {GradientMax: -1},
		"infinite clip":        {GradientMax: math.Inf(1)},
		"NaN clip":             {GradientMax: math.NaN()},
		"cosine without t_max": {Optimizer: optim.Config{Schedule: optim.Schedule{Kind: optim.Cosine}}},
		"adam with momentum":   {Optimizer: optim.Config{Kind: optim.Adam, Momentum: 0.9}},
	} {
		cfg := cartpoleConfig(t, 1)
		cfg.Update = u
		if err := cfg.Validate(); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	cfg := cartpoleConfig(t, 1)
	cfg.Update.Optimizer.Kind = optim.Adam
	if err := cfg.Validate(); err != nil || cfg.Update.Optimizer.LR != cfg.Hyper.StepSize || cfg.Update.Optimizer.Beta1 != 0.9 {
		t.Fatalf("adam: %v, %+v", err, cfg.Update.Optimizer)
	}
}

// stepTrainers runs update on synthetic rewards: the same rewards for
// every trainer, iteration after iteration.
func stepTrainers(t *testing.T, iters int, trs ...*Trainer) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 9))
	n := trs[0].cfg.Hyper.Directions
	for it := range iters {
		rp, rm := make([]float64, n), make([]float64, n)
		for d := range n {
			rp[d], rm[d] = 10*rng.NormFloat64(), 10*rng.NormFloat64()
		}
		for _, tr := range trs {
			tr.update(rp, rm, int64(it))
			tr.iter++
		}
	}
}

func trainerWith(t *testing.T, stepSize float64, u Update) *Trainer {
	t.Helper()
	cfg := cartpoleConfig(t, 3)
	cfg.Hidden = []int{8} // θ not zero at the start
	cfg.Hyper.StepSize = stepSize
	cfg.Update = u
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func closeF32(a, b []float64) (int, bool) {
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-5*max(1, math.Abs(a[i])) {
			return i, false
		}
	}
	return 0, true
}

// Plain SGD on Machin's gradient (which carries ν) is the paper's step with
// α = lr·ν, with a schedule and with clipping too, to float32 rounding.
func TestSGDIsThePaperStepWithAlphaLrNu(t *testing.T) {
	const lr = 0.4
	nu := cartpoleConfig(t, 3).Hyper.Noise
	// (min_lr is an absolute rate, so it would not scale with α: none here.)
	sched := optim.Schedule{Kind: optim.Cosine, TMax: 7, WarmupSteps: 3}
	for name, clip := range map[string]float64{"unclipped": 0, "clipped": 0.05} {
		plain := trainerWith(t, lr*nu, Update{Optimizer: optim.Config{Schedule: sched}, GradientMax: clip})
		sgd := trainerWith(t, lr, Update{Optimizer: optim.Config{Kind: optim.SGD, Schedule: sched}, GradientMax: clip})
		start := slices.Clone(plain.theta)
		stepTrainers(t, 20, plain, sgd)
		if i, ok := closeF32(plain.theta, sgd.theta); !ok {
			t.Fatalf("%s: θ[%d] paper step %v, sgd %v", name, i, plain.theta[i], sgd.theta[i])
		}
		if slices.Equal(start, plain.theta) {
			t.Fatalf("%s: θ never moved", name)
		}
	}
	// And the default update is Step itself, bit for bit.
	a := trainerWith(t, 0.02, Update{})
	b := trainerWith(t, 0.02, Update{})
	stepTrainers(t, 5, a)
	rng := rand.New(rand.NewPCG(7, 9))
	n := b.cfg.Hyper.Directions
	for it := range 5 {
		rp, rm := make([]float64, n), make([]float64, n)
		for d := range n {
			rp[d], rm[d] = 10*rng.NormFloat64(), 10*rng.NormFloat64()
		}
		base := uint64(it * n)
		Step(b.theta, &b.cfg.Hyper, rp, rm, func(d int, dst []float64) { Direction(dst, b.cfg.Seed, base+uint64(d)) })
	}
	if !slices.Equal(a.theta, b.theta) {
		t.Fatal("the default update is not Step")
	}
}

// Clipping scales Machin's gradient to norm GradientMax (torch's
// clip_grad_norm_, up to its 1e-6): one SGD step with lr 1 moves θ by
// exactly the clipped gradient.
func TestGradientMaxClipsTheNorm(t *testing.T) {
	const max = 1e-3
	tr := trainerWith(t, 1, Update{Optimizer: optim.Config{Kind: optim.SGD}, GradientMax: max})
	before := slices.Clone(tr.theta)
	n := tr.cfg.Hyper.Directions
	rp, rm := make([]float64, n), make([]float64, n)
	for d := range n {
		rp[d], rm[d] = float64(d), float64(-d*d)
	}
	info := tr.update(rp, rm, 0)
	if !info.Grad.Clipped || !(info.Grad.Norm > max) {
		t.Fatalf("not clipped: %+v", info.Grad)
	}
	var ss float64
	for i := range before {
		d := tr.theta[i] - before[i]
		ss += d * d
	}
	if got := math.Sqrt(ss); math.Abs(got-max) > 1e-3*max {
		t.Fatalf("step norm %v, want %v", got, max)
	}
}

// A run with an optimizer restored from its state mid-run (through JSON,
// as state.json) continues bit for bit as the uninterrupted one.
func TestOptimizerStateRestoresExactly(t *testing.T) {
	cfg := cartpoleConfig(t, 5)
	cfg.MaxIterations = 8
	cfg.Update = Update{Optimizer: optim.Config{Kind: optim.Adam, Schedule: optim.Schedule{Kind: optim.Cosine, TMax: 6, WarmupSteps: 2}}, GradientMax: 2}
	e, _ := env.Make(cfg.Env)
	ref, err := RunLocal(cfg, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	arch := tr.Arch()
	ev := NewEvaluator(e, &arch)
	iterate := func(tr *Trainer) {
		it, tasks := tr.Current(), tr.Tasks()
		res := make([]Result, len(tasks))
		for i, task := range tasks {
			res[i] = ev.Run(it, task)
		}
		if _, err := tr.Finish(res); err != nil {
			t.Fatal(err)
		}
	}
	for tr.Iter() < 4 {
		iterate(tr)
	}
	raw, err := json.Marshal(tr.State())
	if err != nil {
		t.Fatal(err)
	}
	var st TrainerState
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Optim == nil || st.Optim.Meta["optim.steps"] != "4" || len(st.Optim.Slots) != 2 {
		t.Fatalf("optimizer state %+v", st.Optim)
	}
	back, err := RestoreTrainer(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	for !back.Done() {
		iterate(back)
	}
	if !slices.Equal(back.Theta(), ref.Theta()) {
		t.Fatal("restored run differs from the uninterrupted one")
	}
	if slices.Equal(ref.Theta(), make([]float64, len(ref.Theta()))) {
		t.Fatal("θ never moved")
	}

	// Bad states are refused.
	plain := cartpoleConfig(t, 5)
	if _, err := RestoreTrainer(plain, st); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("optimizer state into a paper-step run: %v", err)
	}
	noOpt := st
	noOpt.Optim = nil
	if _, err := RestoreTrainer(cfg, noOpt); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("missing optimizer state: %v", err)
	}
	for name, mutate := range map[string]func(*OptimState){
		"short slot": func(o *OptimState) {
			for k := range o.Slots {
				o.Slots[k] = o.Slots[k][:1]
			}
		},
		"NaN": func(o *OptimState) {
			for k := range o.Slots {
				o.Slots[k][0] = float32(math.NaN())
			}
		},
		"step count": func(o *OptimState) { o.Meta["optim.steps"] = "3" },
		"kind":       func(o *OptimState) { o.Meta["optim.kind"] = "sgd" },
	} {
		var bad TrainerState
		if err := json.Unmarshal(raw, &bad); err != nil {
			t.Fatal(err)
		}
		mutate(bad.Optim)
		if _, err := RestoreTrainer(cfg, bad); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
