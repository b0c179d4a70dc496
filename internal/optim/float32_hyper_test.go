package optim

import (
	"errors"
	"math"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

// TestHyperParametersOutOfFloat32Range: the steps run in float32, so a
// hyper-parameter that rounds to 0 or ±Inf there (an eps "tiny but
// positive" such as 1e-50, an lr of 1e39) must be refused by New rather
// than turn a finite gradient (zeros: a parameter that got no gradient)
// into NaN or Inf weights.
func TestHyperParametersOutOfFloat32Range(t *testing.T) {
	cfgs := []Config{
		{Kind: Adam, LR: 0.01, Eps: 1e-50},
		{Kind: AdamW, LR: 0.01, Eps: 1e-50},
		{Kind: RMSprop, LR: 0.01, Eps: 1e-50},
		{Kind: Adagrad, LR: 0.01, Eps: 1e-50},
		{Kind: Adamax, LR: 0.01, Eps: 1e-50},
		{Kind: NAdam, LR: 0.01, Eps: 1e-50},
		{Kind: RAdam, LR: 0.01, Eps: 1e-50},
		{Kind: SGD, LR: 1e39},
		{Kind: SGD, LR: 0.1, Momentum: 0.9, WeightDecay: 1e39},
	}
	for _, cfg := range cfgs {
		params := &tensor.StateDict{}
		if err := params.Add(tensor.FromFloat32s("w", []int64{9}, []float32{1, -2, 3, 0.5, -0.25, 4, 1, 1, 2})); err != nil {
			t.Fatal(err)
		}
		o, err := New(cfg, params)
		if errors.Is(err, errs.ErrInvalid) {
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		grads := &tensor.StateDict{}
		if err := grads.Add(tensor.NewF32("w", 9)); err != nil {
			t.Fatal(err)
		}
	steps:
		for k := range 10 {
			if err := o.Step(params, grads); err != nil {
				t.Fatal(err)
			}
			w, _ := params.Get("w").Float32s()
			for i, v := range w {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Errorf("%s (lr %g, weight_decay %g, eps %g) accepted; step %d of a zero gradient made w[%d] = %v",
						cfg.Kind, cfg.LR, cfg.WeightDecay, cfg.Eps, k+1, i, v)
					break steps
				}
			}
		}
	}
}
