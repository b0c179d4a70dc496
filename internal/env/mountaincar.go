package env

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// MountainCarContinuous is Gymnasium's MountainCarContinuous-v0
// (classic_control/continuous_mountain_car.py, Gymnasium 1.4.0) with the
// TimeLimit of 999 steps.
//
// Gymnasium mixes numpy dtypes here and this port reproduces them: the
// action is float32 (its Box dtype); after Reset the state is a float64
// array [position, 0], after any Step a float32 array, and numpy 2's
// promotion rules (NEP 50: a Python float joins a float32 operand as
// float32) decide in which precision each operation of the next step runs.
// The f32 field tracks which case applies. The reward uses the unclipped
// action: 100 on reaching the goal minus 0.1·a².
type MountainCarContinuous struct {
	pos, vel float64 // exact float32 values when f32 is set
	f32      bool    // state is a float32 array (set by Step, cleared by Reset/SetState)
	obs      [2]float64
	clock    timeLimit
}

// MountainCarContinuous constants as float32 where numpy compares or adds
// them to float32 values.
const (
	mcMinPos  = -1.2
	mcMaxPos  = 0.6
	mcMaxSpd  = 0.07
	mcGoalPos = 0.45
	mcPower   = 0.0015
)

// NewMountainCarContinuous returns a MountainCarContinuous-v0 that must be
// Reset before stepping.
func NewMountainCarContinuous() *MountainCarContinuous {
	return &MountainCarContinuous{clock: timeLimit{max: 999}}
}

// Spec implements Env.
func (m *MountainCarContinuous) Spec() Spec {
	return Spec{Name: "MountainCarContinuous-v0", ObsDim: 2, ActDim: 1,
		ActLow: []float64{-1}, ActHigh: []float64{1}, MaxEpisodeSteps: 999}
}

// Reset implements Env: position uniform in [-0.6, -0.4), velocity 0.
func (m *MountainCarContinuous) Reset(rng *rand.Rand) []float64 {
	m.pos, m.vel, m.f32 = uniform(rng, -0.6, -0.4), 0, false
	m.clock.reset()
	return m.observe()
}

// Step implements Env.
func (m *MountainCarContinuous) Step(action []float64) ([]float64, float64, bool, bool) {
	continuousAction("MountainCarContinuous-v0", action, 1)
	truncated := m.clock.tick("MountainCarContinuous-v0")
	a := float32(action[0])

	// force = min(max(a, -1.0), 1.0): Python's builtins return the Python
	// float bound when they clip, the float32 action otherwise.
	var t1f32 float32
	var t1f64 float64
	forceIsF32 := true
	switch {
	case a < -1:
		forceIsF32, t1f64 = false, -1.0*mcPower
	case a > 1:
		forceIsF32, t1f64 = false, 1.0*mcPower
	default:
		t1f32 = a * float32(mcPower)
	}
	// 0.0025 * math.cos(3 * position): 3*position is float32 when the
	// state is; math.cos returns a Python float.
	var cos3 float64
	if m.f32 {
		cos3 = math.Cos(float64(3 * float32(m.pos)))
	} else {
		cos3 = math.Cos(3 * m.pos)
	}
	t2 := 0.0025 * cos3

	// rhs = force*power - t2, then velocity += rhs.
	vel := m.vel
	velIsF32 := m.f32
	if forceIsF32 {
		rhs := t1f32 - float32(t2)
		if m.f32 {
			vel = float64(float32(vel) + rhs)
		} else {
			vel = vel + float64(rhs)
		}
	} else {
		rhs := t1f64 - t2
		if m.f32 {
			vel = float64(float32(vel) + float32(rhs))
		} else {
			vel = vel + rhs
		}
	}
	// Clamp velocity; a clamped value becomes the Python float ±0.07.
	velIsPy := false
	if gt(vel, mcMaxSpd, velIsF32) {
		vel, velIsPy = mcMaxSpd, true
	}
	if lt(vel, -mcMaxSpd, velIsF32 && !velIsPy) {
		vel, velIsPy = -mcMaxSpd, true
	}
	velIsF32 = velIsF32 && !velIsPy

	// position += velocity keeps the position's dtype.
	pos := m.pos
	if m.f32 {
		pos = float64(float32(pos) + float32(vel))
	} else {
		pos = pos + vel
	}
	posIsF32 := m.f32
	if gt(pos, mcMaxPos, posIsF32) {
		pos, posIsF32 = mcMaxPos, false
	}
	if lt(pos, mcMinPos, posIsF32) {
		pos, posIsF32 = mcMinPos, false
	}
	if eq(pos, mcMinPos, posIsF32) && lt(vel, 0, velIsF32) {
		vel = 0
	}
	terminated := ge(pos, mcGoalPos, posIsF32) && vel >= 0

	reward := 0.0
	if terminated {
		reward = 100.0
	}
	// math.pow(action[0], 2): the square of a float32 is exact in float64,
	// so a plain product equals it.
	reward -= float64(a) * float64(a) * 0.1

	// self.state = np.array([position, velocity], dtype=np.float32)
	m.pos, m.vel, m.f32 = float64(float32(pos)), float64(float32(vel)), true
	return m.observe(), reward, terminated, truncated
}

// Comparisons of a value with a Python float constant: in float32 when the
// value is a numpy float32 (NEP 50), else in float64.
func gt(x, c float64, isF32 bool) bool {
	if isF32 {
		return float32(x) > float32(c)
	}
	return x > c
}

func lt(x, c float64, isF32 bool) bool {
	if isF32 {
		return float32(x) < float32(c)
	}
	return x < c
}

func ge(x, c float64, isF32 bool) bool {
	if isF32 {
		return float32(x) >= float32(c)
	}
	return x >= c
}

func eq(x, c float64, isF32 bool) bool {
	if isF32 {
		return float32(x) == float32(c)
	}
	return x == c
}

// State implements StateSetter: position, velocity.
func (m *MountainCarContinuous) State() []float64 { return []float64{m.pos, m.vel} }

// SetState implements StateSetter, like assigning env.unwrapped.state a
// float64 array (the dtype Reset leaves).
func (m *MountainCarContinuous) SetState(s []float64) ([]float64, error) {
	if len(s) != 2 {
		return nil, fmt.Errorf("env: MountainCarContinuous-v0 state has 2 values (position, velocity), got %d", len(s))
	}
	m.pos, m.vel, m.f32 = s[0], s[1], false
	return m.observe(), nil
}

func (m *MountainCarContinuous) observe() []float64 {
	m.obs[0] = float64(float32(m.pos))
	m.obs[1] = float64(float32(m.vel))
	return m.obs[:]
}
