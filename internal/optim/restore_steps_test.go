package optim

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
)

// TestRestoreAbsurdStepCount: a state claiming 10^15 completed steps (a
// damaged or hand-made state file) must not hang the first step replaying
// the learning-rate schedule (or NAdam's momentum product) step by step:
// Restore refuses a count whose replay is beyond bound, with ErrInvalid and
// nothing changed, and a count whose rate cannot change (a constant rate,
// past the warm-up) costs no replay at all.
func TestRestoreAbsurdStepCount(t *testing.T) {
	const absurd = "1000000000000000"
	for _, cfg := range []Config{
		{Kind: SGD, LR: 0.1},
		{Kind: Adam, LR: 1e-3, Schedule: Schedule{WarmupSteps: 100}},
		{Kind: SGD, LR: 0.1, Schedule: Schedule{Kind: Cosine, TMax: 1000}},
		{Kind: SGD, LR: 0.1, Schedule: Schedule{Kind: StepDecay, StepSize: 1}},
		{Kind: NAdam, LR: 1e-3},
	} {
		o := newVecOptimizer(t, cfg, 4)
		sd, meta := o.State()
		meta["optim.steps"] = absurd
		if cfg.Kind != SGD { // stateful kinds need their buffers at step > 0
			p := make([]float32, 4)
			stepVec(t, o, p, p, []float32{1, 2, 3, 4})
			sd, meta = o.State()
			meta["optim.steps"] = absurd
			o = newVecOptimizer(t, cfg, 4)
		}
		done := make(chan error, 1)
		go func() {
			err := o.Restore(sd, meta)
			if err == nil {
				p := make([]float32, 4)
				err = o.StepTo(vecSD(p), vecSD(p), vecSD([]float32{1, 2, 3, 4}))
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("%+v: restore of %s steps: %v, want ErrInvalid or a step", cfg, absurd, err)
			}
			if err != nil && o.Steps() != 0 {
				t.Fatalf("%+v: refused restore left %d steps", cfg, o.Steps())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%+v: restore of %s steps and one step did not end in 5 s", cfg, absurd)
		}
	}
}

// TestScheduleSkipsExact: skipping the scheduler steps that leave the rate
// unchanged gives the bits of replaying every one.
func TestScheduleSkipsExact(t *testing.T) {
	for _, s := range []Schedule{{}, {WarmupSteps: 7}, {Kind: StepDecay, StepSize: 5, Gamma: 0.7},
		{Kind: StepDecay, StepSize: 3, WarmupSteps: 10, WarmupStart: 0.2}, {Kind: StepDecay, StepSize: 1}} {
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		c := s.begin(0.3)
		for k := int64(0); k < 400; k++ {
			if got := s.LR(0.3, k); got != c.lr {
				t.Fatalf("%+v: LR(%d) = %v, replaying every step gives %v", s, k, got, c.lr)
			}
			s.advance(0.3, &c)
		}
	}
}

// TestRestoreRefusesNonFiniteState: a state whose buffer holds a NaN or
// ±Inf (a step leaving one is never kept, so it is damage) is refused with
// ErrInvalid naming the element, and the optimizer keeps its own state: a
// restored NaN moment would fail every later step.
func TestRestoreRefusesNonFiniteState(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		cfg := Config{Kind: Adam, LR: 1e-3}
		src := newVecOptimizer(t, cfg, 4)
		p := make([]float32, 4)
		stepVec(t, src, p, p, []float32{1, 2, 3, 4})
		sd, meta := src.State()
		f, err := sd.Get("exp_avg/w").Float32s()
		if err != nil {
			t.Fatal(err)
		}
		f[2] = bad

		o := newVecOptimizer(t, cfg, 4)
		err = o.Restore(sd, meta)
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "exp_avg/w[2]") {
			t.Fatalf("restore of a state with %v in exp_avg/w[2]: %v, want ErrInvalid naming it", bad, err)
		}
		if o.Steps() != 0 || o.NonFinite() != "" {
			t.Fatalf("a refused restore changed the optimizer: %d steps, non-finite %q", o.Steps(), o.NonFinite())
		}
	}
}
