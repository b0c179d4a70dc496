package env_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/rlhub/rlhub/internal/env"
)

// A rollout: Reset with an injected rng, Step until terminated or truncated.
// Observations belong to the environment; copy them to keep them.
func ExampleMake() {
	e, err := env.Make("CartPole-v1")
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	obs := e.Reset(rng)
	total, steps := 0.0, 0
	for {
		a := 0.0
		if obs[2]+0.5*obs[3] > 0 { // push toward the side the pole leans
			a = 1
		}
		var r float64
		var terminated, truncated bool
		obs, r, terminated, truncated = e.Step([]float64{a})
		total += r
		steps++
		if terminated || truncated {
			fmt.Printf("return %.0f after %d steps, truncated=%v\n", total, steps, truncated)
			return
		}
	}
	// Output: return 500 after 500 steps, truncated=true
}

// The LQR task's Riccati optimum and the relative cost of another gain.
func ExampleLQRAverageCost() {
	m := []float64{-0.5, 0, 0, 0, -0.5, 0, 0, 0, -0.5} // u = -0.5 x
	c, err := env.LQRAverageCost(m)
	if err != nil {
		panic(err)
	}
	opt := env.LQROptimalCost()
	fmt.Printf("optimal average cost %.6f, this gain %.6f, relative cost %.3f\n", opt, c, c/opt-1)
	// Output: optimal average cost 0.137287, this gain 1.018147, relative cost 6.416
}
