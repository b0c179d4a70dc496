// Package dictreach is DictReach-v0, rlhub's small environment with a
// Dict observation space (a Gymnasium spaces.Dict of three Boxes): a point
// mass in the plane pushed towards a goal. It exists to exercise ARS's
// per-key observation filters (Machin's MeanStdFilter per state key) on a
// built-in env; python/tests/dict_env.py is the same env for Gymnasium.
// Importing the package registers it with internal/env.
package dictreach

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rlhub/rlhub/internal/env"
)

// Name is the environment's id.
const Name = "DictReach-v0"

func init() {
	env.Register(Name, func() (env.Env, error) { return New(), nil })
}

const (
	dt       = 0.1
	maxSpeed = 2.0
	maxSteps = 100
)

// Env is DictReach-v0. The observation is the Dict {goal, position,
// velocity} (2 each), flattened in that (sorted-key) order; the action is
// a force in [-1, 1]²; the reward per step is −dt·‖position − goal‖ −
// 0.01·‖action‖². Episodes are truncated after 100 steps and never
// terminate. Reset draws the goal uniformly from [-3, 3]² and the position
// from [-0.5, 0.5]², at rest. The keys' scales differ on purpose, so each
// key's filter matters.
type Env struct {
	goal, pos, vel [2]float64
	obs            [6]float64
	steps          int
}

// New returns a DictReach-v0 that must be Reset before stepping.
func New() *Env { return &Env{} }

// Spec implements env.Env.
func (e *Env) Spec() env.Spec {
	return env.Spec{Name: Name, ObsDim: 6, ActDim: 2, ActLow: []float64{-1, -1}, ActHigh: []float64{1, 1},
		MaxEpisodeSteps: maxSteps,
		ObsKeys:         []env.ObsKey{{Name: "goal", Dim: 2}, {Name: "position", Dim: 2}, {Name: "velocity", Dim: 2}}}
}

func uniform(rng *rand.Rand, lo, hi float64) float64 { return lo + float64((hi-lo)*rng.Float64()) }

// Reset implements env.Env.
func (e *Env) Reset(rng *rand.Rand) []float64 {
	for i := range 2 {
		e.goal[i] = uniform(rng, -3, 3)
	}
	for i := range 2 {
		e.pos[i] = uniform(rng, -0.5, 0.5)
	}
	e.vel = [2]float64{}
	e.steps = 0
	return e.observe()
}

// Step implements env.Env; the action is clipped to its bounds.
func (e *Env) Step(action []float64) ([]float64, float64, bool, bool) {
	if len(action) != 2 {
		panic(fmt.Sprintf("env: %s takes 2 action values, got %d", Name, len(action)))
	}
	if e.steps >= maxSteps {
		panic("env: " + Name + " stepped after its time limit: Reset first")
	}
	var cost float64
	for i := range 2 {
		a := math.Max(-1, math.Min(1, action[i]))
		cost += float64(0.01 * a * a)
		e.vel[i] = math.Max(-maxSpeed, math.Min(maxSpeed, e.vel[i]+float64(2*dt*a)))
		e.pos[i] += float64(dt * e.vel[i])
	}
	dx, dy := e.pos[0]-e.goal[0], e.pos[1]-e.goal[1]
	e.steps++
	return e.observe(), -float64(dt*math.Sqrt(float64(dx*dx)+float64(dy*dy))) - cost, false, e.steps >= maxSteps
}

func (e *Env) observe() []float64 {
	e.obs = [6]float64{e.goal[0], e.goal[1], e.pos[0], e.pos[1], e.vel[0], e.vel[1]}
	return e.obs[:]
}
