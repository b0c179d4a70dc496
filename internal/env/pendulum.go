package env

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Pendulum is Gymnasium's Pendulum-v1 (classic_control/pendulum.py,
// Gymnasium 1.4.0, g = 10) with the TimeLimit of 200 steps. It never
// terminates; every episode is truncated.
//
// Arithmetic follows Gymnasium's numpy dtypes: the state (theta, theta_dot)
// is float64; the action is a float32 (the dtype of its Box action space)
// clipped to [-2, 2], so the u² cost term and 3·u are computed in float32
// before joining float64 sums; observations [cos θ, sin θ, θ̇] are rounded to
// float32.
type Pendulum struct {
	state [2]float64 // theta, theta_dot
	obs   [3]float64
	clock timeLimit
}

var (
	pdMaxSpeed  = 8.0
	pdMaxTorque = float32(2.0)
	pdDt        = 0.05
	pdG         = 10.0
	pdM         = 1.0
	pdL         = 1.0
)

// NewPendulum returns a Pendulum-v1 that must be Reset before stepping.
func NewPendulum() *Pendulum { return &Pendulum{clock: timeLimit{max: 200}} }

// Spec implements Env.
func (p *Pendulum) Spec() Spec {
	return Spec{Name: "Pendulum-v1", ObsDim: 3, ActDim: 1,
		ActLow: []float64{-2}, ActHigh: []float64{2}, MaxEpisodeSteps: 200}
}

// Reset implements Env: theta uniform in [-π, π), theta_dot in [-1, 1).
func (p *Pendulum) Reset(rng *rand.Rand) []float64 {
	p.state[0] = uniform(rng, -pi64, pi64)
	p.state[1] = uniform(rng, -1, 1)
	p.clock.reset()
	return p.observe()
}

// Step implements Env. The reward is -(θ_n² + 0.1·θ̇² + 0.001·u²) with θ_n
// the angle normalised to [-π, π).
func (p *Pendulum) Step(action []float64) ([]float64, float64, bool, bool) {
	continuousAction("Pendulum-v1", action, 1)
	truncated := p.clock.tick("Pendulum-v1")
	th, thdot := p.state[0], p.state[1]
	u := clip32(float32(action[0]), -pdMaxTorque, pdMaxTorque)
	an := angleNormalize(th)
	costs := float64(an*an) + float64(0.1*(thdot*thdot)) + float64(float32(0.001)*(u*u))
	newthdot := thdot + float64((float64(3*pdG/(2*pdL)*math.Sin(th))+float64(float32(3.0/(pdM*pdL*pdL))*u))*pdDt)
	newthdot = clip64(newthdot, -pdMaxSpeed, pdMaxSpeed)
	newth := th + float64(newthdot*pdDt)
	p.state = [2]float64{newth, newthdot}
	return p.observe(), -costs, false, truncated
}

// State implements StateSetter: theta, theta_dot.
func (p *Pendulum) State() []float64 { return append([]float64(nil), p.state[:]...) }

// SetState implements StateSetter, like assigning env.unwrapped.state.
func (p *Pendulum) SetState(s []float64) ([]float64, error) {
	if len(s) != len(p.state) {
		return nil, fmt.Errorf("env: Pendulum-v1 state has %d values (theta, theta_dot), got %d", len(p.state), len(s))
	}
	copy(p.state[:], s)
	return p.observe(), nil
}

func (p *Pendulum) observe() []float64 {
	th := p.state[0]
	p.obs[0] = float64(float32(math.Cos(th)))
	p.obs[1] = float64(float32(math.Sin(th)))
	p.obs[2] = float64(float32(p.state[1]))
	return p.obs[:]
}

// angleNormalize is Gymnasium's ((x + π) mod 2π) - π with numpy's floored
// modulo (the result takes the divisor's sign).
func angleNormalize(x float64) float64 {
	return pyMod(x+pi64, 2*pi64) - pi64
}

// pyMod is numpy's float remainder (npy_divmod): fmod corrected to the sign
// of b, with a zero result carrying b's sign.
func pyMod(a, b float64) float64 {
	m := math.Mod(a, b)
	if m != 0 {
		if (b < 0) != (m < 0) {
			m += b
		}
	} else {
		m = math.Copysign(0, b)
	}
	return m
}

// clip64 and clip32 are np.clip: NaN passes through.
func clip64(x, lo, hi float64) float64 {
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}

func clip32(x, lo, hi float32) float32 {
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}
