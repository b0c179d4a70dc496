package ars

import (
	"errors"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/optim"
)

// A run's cumulative filter statistics are bounded for what a run can
// reach (2^53 states, exact in float64), not by the per-task bound of
// 2^32: past 2^32 training states (a long Humanoid run) the hub's own
// policy must still decode and its state must still restore.
func TestCumulativeFilterCountPast2p32(t *testing.T) {
	e := env.NewCartPole()
	cfg := Config{Env: "CartPole-v1", Spec: e.Spec(), Seed: 3,
		Hyper: Hyper{Version: V2t, Directions: 4, Top: 2, StepSize: 0.02, Noise: 0.03}, MaxIterations: 100}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The run has already seen 2^32 − 100 states (valid statistics).
	tr.stats.Count = 1<<32 - 100
	for i := range tr.stats.M2 {
		tr.stats.M2[i] = tr.stats.Count
	}
	arch := tr.Arch()
	ev := NewEvaluator(e, &arch)
	it := tr.Current()
	var res []Result
	for _, task := range tr.Tasks() {
		res = append(res, ev.Run(it, task))
	}
	if _, err := tr.Finish(res); err != nil {
		t.Fatal(err)
	}
	if tr.Stats().Count <= 1<<32 {
		t.Fatalf("filter count %v, want past 2^32", tr.Stats().Count)
	}
	blob, err := tr.PolicyOf().Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodePolicy(blob); err != nil {
		t.Errorf("the hub's own published policy does not decode: %v", err)
	}
	if _, err := RestoreTrainer(tr.Config(), tr.State()); err != nil {
		t.Errorf("the run's own state does not restore: %v", err)
	}
	// One task's statistics keep the per-task bound.
	big := tr.Stats().Clone()
	r := Result{Task: Task{KindDirection, 0}, RPlus: 1, RMinus: 1, Steps: int64(big.Count), Stats: big}
	if err := tr.Check(&r); err == nil {
		t.Error("a task reporting more than 2^32 states passed Check")
	}
}

// An update that leaves θ non-finite (a step size of 1e308, which
// validation accepts) fails Finish with ErrDiverged and keeps θ, the
// statistics and the optimizer as they were: the trainer never publishes
// a θ no worker can decode.
func TestFinishRefusesNonFiniteTheta(t *testing.T) {
	for _, u := range []Update{{}, {Optimizer: optim.Config{Kind: optim.Adam}}} {
		e, err := env.Make("MountainCarContinuous-v0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Env: "MountainCarContinuous-v0", Spec: e.Spec(), Seed: 1, Update: u,
			Hyper: Hyper{Version: V1, Directions: 4, StepSize: 1e308, Noise: 0.03}, MaxIterations: 3}
		if u.Optimizer.Kind != "" {
			cfg.Hyper.StepSize = 3e38 // Adam's float32 θ overflows
		}
		var reps []Report
		tr, err := RunLocal(cfg, e, func(r Report) { reps = append(reps, r) })
		if !errors.Is(err, ErrDiverged) {
			t.Fatalf("update %q: RunLocal = %v, want ErrDiverged", u.Optimizer.Kind, err)
		}
		t.Logf("update %q: %v", u.Optimizer.Kind, err)
		fresh, _ := NewTrainer(cfg)
		if tr.Iter() != 0 || len(reps) != 0 || !slices.Equal(tr.Theta(), fresh.Theta()) || tr.Stats().Count != 0 {
			t.Fatalf("update %q: the diverged update changed the trainer: iteration %d, θ %v", u.Optimizer.Kind, tr.Iter(), tr.Theta())
		}
		if _, err := RestoreTrainer(cfg, tr.State()); err != nil {
			t.Fatalf("update %q: the state after a refused update: %v", u.Optimizer.Kind, err)
		}
	}
}

// RunUntil with a stop that never fires is Run; a stop that fires ends
// the task within 256 steps and reports it unfinished.
func TestEvaluatorRunUntilStops(t *testing.T) {
	e, err := env.Make("MountainCarContinuous-v0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Env: "MountainCarContinuous-v0", Spec: e.Spec(), Seed: 5,
		Hyper: Hyper{Version: V2, Directions: 2, StepSize: 0.02, Noise: 0.03}, MaxIterations: 1}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	arch := tr.Arch()
	ev := NewEvaluator(e, &arch)
	task := Task{KindDirection, 1}
	want := ev.Run(tr.Current(), task)
	got, ok := ev.RunUntil(tr.Current(), task, func() bool { return false })
	if !ok || got.RPlus != want.RPlus || got.RMinus != want.RMinus || got.Steps != want.Steps || !slices.Equal(got.Stats.M2, want.Stats.M2) {
		t.Fatalf("RunUntil without a stop = %+v (%v), Run = %+v", got, ok, want)
	}
	calls := 0
	if _, ok := ev.RunUntil(tr.Current(), task, func() bool { calls++; return true }); ok || calls != 1 {
		t.Fatalf("a stop that fires: finished %v after %d checks", ok, calls)
	}
}
