package ars

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/optim"
)

// machinVectors is testdata/machin_update.json
// (scripts/gen_ars_machin_vectors.py): Machin's ARS update with real torch
// optimizers, schedulers and clip_grad_norm_ on given rewards.
type machinVectors struct {
	Cases []struct {
		Name        string  `json:"name"`
		StepSize    float64 `json:"step_size"`
		Noise       float64 `json:"noise"`
		Directions  int     `json:"directions"`
		Top         int     `json:"top"`
		GradientMax float64 `json:"gradient_max"`
		Seed        uint64  `json:"seed"`
		ObsDim      int     `json:"obs_dim"`
		ActDim      int     `json:"act_dim"`
		Optimizer   struct {
			Kind     optim.Kind     `json:"kind"`
			Momentum float64        `json:"momentum"`
			Schedule optim.Schedule `json:"schedule"`
		} `json:"optimizer"`
		Theta0     []float64 `json:"theta0"`
		Iterations []struct {
			RPlus  []float64 `json:"rplus"`
			RMinus []float64 `json:"rminus"`
			Theta  []float64 `json:"theta"`
		} `json:"iterations"`
	} `json:"cases"`
}

// rlhub's update options against Machin's: SGD, Adam with warm-up + cosine
// and clipping, RMSprop with momentum, step decay and clipping on float32
// θ to float32 rounding (Machin averages the gradient in float32, rlhub
// sums in float64 and rounds once); the paper's step with a schedule and
// clipping against Machin's SGD at lr α/ν on a float64 actor to 1e-12.
// Every case has an iteration with σ_R = 0 (a zero gradient).
func TestUpdateMatchesMachin(t *testing.T) {
	raw, err := os.ReadFile("testdata/machin_update.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec machinVectors
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	if len(vec.Cases) < 4 {
		t.Fatalf("%d cases", len(vec.Cases))
	}
	for _, c := range vec.Cases {
		t.Run(c.Name, func(t *testing.T) {
			version := V1
			if c.Top < c.Directions {
				version = V1t
			}
			cfg := Config{Env: "machin", Spec: env.Spec{Name: "machin", ObsDim: c.ObsDim, ActDim: c.ActDim}, Seed: c.Seed,
				Hyper: Hyper{Version: version, Directions: c.Directions, Top: c.Top, StepSize: c.StepSize, Noise: c.Noise},
				Update: Update{Optimizer: optim.Config{Kind: c.Optimizer.Kind, Momentum: c.Optimizer.Momentum, Schedule: c.Optimizer.Schedule},
					GradientMax: c.GradientMax},
				MaxIterations: len(c.Iterations)}
			tr, err := NewTrainer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			copy(tr.theta, c.Theta0)
			rtol, atol := 2e-5, 1e-6
			if tr.cfg.Update.Plain() {
				rtol, atol = 1e-12, 1e-14
			}
			worst, worstAbs := 0.0, 0.0
			for it, want := range c.Iterations {
				tr.update(want.RPlus, want.RMinus, int64(it))
				tr.iter++
				for i, w := range want.Theta {
					d := math.Abs(tr.theta[i] - w)
					if d > atol+rtol*math.Abs(w) {
						t.Fatalf("iteration %d θ[%d] = %v, Machin %v", it, i, tr.theta[i], w)
					}
					worst, worstAbs = max(worst, d/max(math.Abs(w), 1e-30)), max(worstAbs, d)
				}
			}
			t.Logf("largest difference from Machin over %d iterations: %.2g relative, %.2g absolute", len(c.Iterations), worst, worstAbs)
		})
	}
}
