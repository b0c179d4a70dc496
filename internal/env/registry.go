package env

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// StateSetter is implemented by every built-in environment. It exposes the
// internal (unobserved) state, as Gymnasium's env.unwrapped.state does, so
// tests can replay reference trajectories from a known state and tools can
// start an episode anywhere.
type StateSetter interface {
	// State returns a copy of the internal state vector.
	State() []float64
	// SetState replaces the internal state and returns the observation for
	// it (owned by the Env, as Reset's). It does not touch the step count of
	// the time limit, so the usual pattern is Reset then SetState. A state of
	// the wrong length is an error and leaves the Env unchanged.
	SetState(state []float64) ([]float64, error)
}

var registry = map[string]func() Env{
	"CartPole-v1":              func() Env { return NewCartPole() },
	"Pendulum-v1":              func() Env { return NewPendulum() },
	"MountainCarContinuous-v0": func() Env { return NewMountainCarContinuous() },
	"Acrobot-v1":               func() Env { return NewAcrobot() },
	"LQR":                      func() Env { return NewLQR() },
}

// Names lists the environments Make knows, sorted: the built-in ones and
// those registered by other packages (register.go).
func Names() []string {
	names := append(builtinNames(), RegisteredNames()...)
	slices.Sort(names)
	return names
}

// builtinNames lists this package's own environments, sorted.
func builtinNames() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Make returns a new instance of the named environment (with its default
// parameters), or an error naming the known environments.
func Make(name string) (Env, error) {
	mk, ok := registry[name]
	if !ok {
		if ctor, ok := Lookup(name); ok {
			return ctor()
		}
		return nil, fmt.Errorf("env: unknown environment %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return mk(), nil
}

// timeLimit is Gymnasium's TimeLimit wrapper (plus its OrderEnforcing check):
// the step that brings the count to max truncates, and so does every later
// one until Reset.
type timeLimit struct {
	steps, max int
	started    bool
}

func (t *timeLimit) reset() { t.steps, t.started = 0, true }

// tick counts one step and reports truncation. Stepping before Reset is a
// programming error and panics, as Gymnasium raises ResetNeeded.
func (t *timeLimit) tick(name string) bool {
	if !t.started {
		panic("env: " + name + ": Step called before Reset")
	}
	t.steps++
	return t.steps >= t.max
}

// discreteAction validates and returns action[0] as an index in [0, n).
// Misuse (wrong length, non-integer or out-of-range index) is a programming
// error in the caller's policy code and panics with a precise message, as
// Gymnasium's action_space.contains assertion does.
func discreteAction(name string, action []float64, n int) int {
	if len(action) != 1 {
		panic(fmt.Sprintf("env: %s: discrete action must have length 1 (the index), got %d", name, len(action)))
	}
	a := action[0]
	if a != math.Trunc(a) || a < 0 || a >= float64(n) {
		panic(fmt.Sprintf("env: %s: action index %v outside {0..%d}", name, a, n-1))
	}
	return int(a)
}

// continuousAction checks the length of a continuous action.
func continuousAction(name string, action []float64, dim int) {
	if len(action) != dim {
		panic(fmt.Sprintf("env: %s: action must have length %d, got %d", name, dim, len(action)))
	}
}

// uniform draws from [low, high) the way numpy's Generator.uniform does:
// low + (high-low)*u with u uniform in [0, 1).
func uniform(rng *rand.Rand, low, high float64) float64 {
	return low + float64((high-low)*rng.Float64())
}
