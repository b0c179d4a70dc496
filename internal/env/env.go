// Package env holds rlhub's built-in environments, written in Go to match
// Gymnasium's definitions (dynamics, reward, termination, time limit,
// observation and action bounds), plus the paper's LQR task.
package env

import (
	"math/rand/v2"
)

// Spec describes an environment's spaces.
type Spec struct {
	// Name is the Gymnasium id, e.g. "CartPole-v1".
	Name string
	// ObsDim is the length of an observation.
	ObsDim int
	// Discrete is the number of actions of a discrete action space, 0 for
	// a continuous (Box) one.
	Discrete int
	// ActDim is the length of a continuous action (0 when Discrete > 0).
	ActDim int
	// ActLow and ActHigh bound a continuous action (len ActDim).
	ActLow, ActHigh []float64
	// MaxEpisodeSteps is the time limit; reaching it truncates an episode.
	MaxEpisodeSteps int
	// ObsKeys describes a Dict observation space (Gymnasium spaces.Dict):
	// its keys in the space's order with their flattened lengths. The
	// observation is their concatenation in that order (what Gymnasium's
	// spaces.flatten gives), so the lengths sum to ObsDim. Empty for a flat
	// (Box) observation.
	ObsKeys []ObsKey
}

// ObsKey is one key of a Dict observation space.
type ObsKey struct {
	Name string
	Dim  int
}

// Env is one environment instance. It is not safe for concurrent use; run
// one per goroutine.
//
// The observation slices returned by Reset and Step are owned by the Env
// and valid until the next call on it; copy to keep them.
type Env interface {
	Spec() Spec
	// Reset starts an episode with an initial state drawn from rng.
	Reset(rng *rand.Rand) []float64
	// Step applies an action. For a discrete space action[0] is the action
	// index (0 ≤ index < Discrete); for a continuous one len(action) is
	// ActDim and values are clipped to the bounds as Gymnasium does.
	// truncated is set when the time limit ends the episode.
	Step(action []float64) (obs []float64, reward float64, terminated, truncated bool)
}

// Close frees what e holds outside Go's heap (a MuJoCo model and its
// simulation data, some MiB of C memory each), if it holds any. Go's
// collector would free it eventually, but an env's Go side is a few KB,
// so it runs too seldom: environments made and dropped (one per run the
// hub validates, one per run a worker serves) grew the process by GBs.
// Safe on any Env, and twice.
func Close(e Env) {
	if c, ok := e.(interface{ Close() }); ok {
		c.Close()
	}
}
