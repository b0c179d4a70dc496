package ars

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/env"
)

func TestZZTune(t *testing.T) {
	if os.Getenv("TUNE") == "" {
		t.Skip()
	}
	for _, h := range []Hyper{
		{Version: V2t, Directions: 8, Top: 4, StepSize: 0.02, Noise: 0.03},
		{Version: V2t, Directions: 8, Top: 4, StepSize: 0.05, Noise: 0.1},
		{Version: V1t, Directions: 8, Top: 4, StepSize: 0.05, Noise: 0.1},
		{Version: V2, Directions: 4, StepSize: 0.05, Noise: 0.1},
	} {
		for seed := uint64(1); seed <= 10; seed++ {
			e, _ := env.Make("CartPole-v1")
			cfg := Config{Env: "CartPole-v1", Spec: e.Spec(), Seed: seed, Hyper: h, EvalEvery: 1, EvalEpisodes: 10, UseTarget: true, Target: 475, MaxEpisodes: 20000}
			st := time.Now()
			tr, err := RunLocal(cfg, e, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := tr.Last()
			fmt.Printf("%v N%d b%d a%g nu%g seed %d: %s it %d ep %d eval %.1f steps %d %v\n", h.Version, h.Directions, h.Top, h.StepSize, h.Noise, seed, r.Reason, r.Iteration, r.Episodes, r.EvalMean, r.Steps, time.Since(st).Round(time.Millisecond))
		}
	}
}
