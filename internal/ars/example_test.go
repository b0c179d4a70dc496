package ars_test

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
)

// Training CartPole in one process: the reference every distributed run
// reproduces bit for bit.
func ExampleRunLocal() {
	e, err := env.Make("CartPole-v1")
	if err != nil {
		panic(err)
	}
	cfg := ars.Config{
		Env: "CartPole-v1", Spec: e.Spec(), Seed: 1,
		Hyper:     ars.Hyper{Version: ars.V2t, Directions: 16, Top: 8, StepSize: 0.02, Noise: 0.03},
		EvalEvery: 1, EvalEpisodes: 10,
		UseTarget: true, Target: 475, MaxEpisodes: 20000,
	}
	tr, err := ars.RunLocal(cfg, e, func(r ars.Report) {
		fmt.Printf("iteration %d: eval %.1f\n", r.Iteration, r.EvalMean)
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(tr.Last().Reason)
	// Output:
	// iteration 0: eval 9.2
	// iteration 1: eval 496.1
	// target
}
