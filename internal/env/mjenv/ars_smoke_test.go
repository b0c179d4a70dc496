//go:build mujoco && arssmoke

package mjenv

import (
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
)

// TestARSSmoke trains ARS (internal/ars, one process) on Swimmer-v5 and
// HalfCheetah-v5 with seed 1, logging evaluations. It is an experiment, not
// a test: it asserts nothing, takes ~10 minutes, and is compiled only with
// the arssmoke tag:
//
//	GOEXPERIMENT=simd go test -tags 'mujoco arssmoke' -run ARSSmoke -v -timeout 30m ./internal/env/mjenv
//
// The hyperparameters are what this author took to be the ARS paper's
// (Mania et al. 2018) Table 9 values; the ARS command line, once it exists,
// owns them and supersedes this file.
func TestARSSmoke(t *testing.T) {
	for _, c := range []struct {
		name   string
		h      ars.Hyper
		target float64
		maxEp  int64
	}{
		{"Swimmer-v5", ars.Hyper{Version: ars.V1, Directions: 1, StepSize: 0.02, Noise: 0.01}, 325, 2000},
		{"HalfCheetah-v5", ars.Hyper{Version: ars.V2t, Directions: 32, Top: 4, StepSize: 0.02, Noise: 0.03}, 3430, 4000},
	} {
		e, err := env.Make(c.name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := ars.Config{Env: c.name, Spec: e.Spec(), Seed: 1, Hyper: c.h, EvalEvery: 5, EvalEpisodes: 5,
			Target: c.target, UseTarget: true, MaxEpisodes: c.maxEp}
		start := time.Now()
		_, err = ars.RunLocal(cfg, e, func(r ars.Report) {
			if r.HasEval {
				t.Logf("%s it %d episodes %d (policy %d) steps %d eval %.1f ± %.1f  %.0fs", c.name, r.Iteration, r.Episodes, r.PolicyEpisodes, r.Steps, r.EvalMean, r.EvalStd, time.Since(start).Seconds())
			}
			if r.Done {
				t.Logf("%s done: %s after %d episodes", c.name, r.Reason, r.PolicyEpisodes)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
