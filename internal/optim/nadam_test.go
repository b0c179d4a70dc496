package optim

import (
	"fmt"
	"testing"

	"github.com/rlhub/rlhub/internal/tensor"
)

// NAdam's mu_product underflows to 0 in float32 within a few hundred steps
// (as in torch). 0 also meant "not computed yet": from then on every step
// replayed the product from step 1, once per parameter tensor, and a step
// cost grew with the step count (10 steps of 8 tiny tensors at step
// 100 000 took 3.2 s). After the first step past a restore, a step
// replays nothing.
func TestNAdamDoesNotReplayMuProductEachStep(t *testing.T) {
	replays := 0
	orig := nadamMuProduct
	nadamMuProduct = func(c *Config, s int64) float32 { replays++; return orig(c, s) }
	t.Cleanup(func() { nadamMuProduct = orig })

	params := &tensor.StateDict{}
	for i := range 8 {
		if err := params.Add(tensor.NewF32(fmt.Sprintf("p%d", i), 4)); err != nil {
			t.Fatal(err)
		}
	}
	o, err := New(Config{Kind: NAdam, LR: 0.01}, params)
	if err != nil {
		t.Fatal(err)
	}
	if orig(&o.cfg, 1000) != 0 {
		t.Fatal("mu_product has not underflowed after 1000 steps; the test needs it to")
	}
	grads := params.Clone()
	for _, g := range grads.Tensors() {
		f, _ := g.Float32s()
		for i := range f {
			f[i] = 0.5
		}
	}
	if err := o.Step(params, grads); err != nil {
		t.Fatal(err)
	}
	// A checkpoint far into training: the first step after it may replay
	// the product once.
	st, meta := o.State()
	meta["optim.steps"] = "100000"
	if err := o.Restore(st, meta); err != nil {
		t.Fatal(err)
	}
	if err := o.Step(params, grads); err != nil {
		t.Fatal(err)
	}
	replays = 0
	for range 10 {
		if err := o.Step(params, grads); err != nil {
			t.Fatal(err)
		}
	}
	if replays != 0 {
		t.Fatalf("10 NAdam steps of 8 tensors at step 100 000 replayed mu_product %d times, want 0", replays)
	}
}
