package env

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Acrobot is Gymnasium's Acrobot-v1 (classic_control/acrobot.py, Gymnasium
// 1.4.0): the "book" dynamics of Sutton & Barto, one rk4 step of dt = 0.2 s
// per action, no torque noise, and the TimeLimit of 500 steps.
//
// Actions 0, 1, 2 apply torque -1, 0, +1 on the joint between the links.
// The reward is -1 per step and 0 on the step that reaches the goal
// (-cos θ1 - cos(θ2 + θ1) > 1), which terminates. Reset draws each state
// variable uniform in [-0.1, 0.1) and rounds it to float32, as Gymnasium
// does; the dynamics run in float64; observations
// [cos θ1, sin θ1, cos θ2, sin θ2, θ̇1, θ̇2] are rounded to float32.
type Acrobot struct {
	state [4]float64 // theta1, theta2, dtheta1, dtheta2
	obs   [6]float64
	clock timeLimit
}

// Acrobot constants, as float64 variables so every expression rounds at
// each operation in numpy's order.
var (
	acDt      = 0.2
	acL1      = 1.0
	acM1      = 1.0
	acM2      = 1.0
	acLC1     = 0.5
	acLC2     = 0.5
	acMOI     = 1.0
	acG       = 9.8
	acMaxVel1 = 4 * pi64
	acMaxVel2 = 9 * pi64
	acTorque  = [3]float64{-1, 0, 1}
)

// NewAcrobot returns an Acrobot-v1 that must be Reset before stepping.
func NewAcrobot() *Acrobot { return &Acrobot{clock: timeLimit{max: 500}} }

// Spec implements Env.
func (a *Acrobot) Spec() Spec {
	return Spec{Name: "Acrobot-v1", ObsDim: 6, Discrete: 3, MaxEpisodeSteps: 500}
}

// Reset implements Env.
func (a *Acrobot) Reset(rng *rand.Rand) []float64 {
	for i := range a.state {
		a.state[i] = float64(float32(uniform(rng, -0.1, 0.1)))
	}
	a.clock.reset()
	return a.observe()
}

// Step implements Env.
func (a *Acrobot) Step(action []float64) ([]float64, float64, bool, bool) {
	idx := discreteAction("Acrobot-v1", action, 3)
	truncated := a.clock.tick("Acrobot-v1")
	ns := acrobotRK4(a.state, acTorque[idx])
	ns[0] = wrap(ns[0], -pi64, pi64)
	ns[1] = wrap(ns[1], -pi64, pi64)
	ns[2] = bound(ns[2], -acMaxVel1, acMaxVel1)
	ns[3] = bound(ns[3], -acMaxVel2, acMaxVel2)
	a.state = ns
	terminated := -math.Cos(ns[0])-math.Cos(ns[1]+ns[0]) > 1.0
	reward := -1.0
	if terminated {
		reward = 0
	}
	return a.observe(), reward, terminated, truncated
}

// acrobotRK4 is Gymnasium's rk4 over t = [0, dt] on the state augmented with
// the torque (whose derivative is 0), evaluated in the same order.
func acrobotRK4(y0 [4]float64, torque float64) [4]float64 {
	dt := acDt - 0
	dt2 := dt / 2.0
	k1 := acrobotDsdt(y0, torque)
	var y [4]float64
	for i := range y {
		y[i] = y0[i] + dt2*k1[i]
	}
	k2 := acrobotDsdt(y, torque)
	for i := range y {
		y[i] = y0[i] + dt2*k2[i]
	}
	k3 := acrobotDsdt(y, torque)
	for i := range y {
		y[i] = y0[i] + dt*k3[i]
	}
	k4 := acrobotDsdt(y, torque)
	var out [4]float64
	for i := range out {
		out[i] = y0[i] + dt/6.0*(k1[i]+2*k2[i]+2*k3[i]+k4[i])
	}
	return out
}

// acrobotDsdt is Gymnasium's _dsdt with book_or_nips = "book".
func acrobotDsdt(s [4]float64, a float64) [4]float64 {
	m1, m2, l1, lc1, lc2, i1, i2, g := acM1, acM2, acL1, acLC1, acLC2, acMOI, acMOI, acG
	theta1, theta2, dtheta1, dtheta2 := s[0], s[1], s[2], s[3]
	d1 := float64(m1*(lc1*lc1)) + float64(m2*(float64(l1*l1)+float64(lc2*lc2)+float64(2*l1*lc2*math.Cos(theta2)))) + i1 + i2
	d2 := float64(m2*(float64(lc2*lc2)+float64(l1*lc2*math.Cos(theta2)))) + i2
	phi2 := float64(m2 * lc2 * g * math.Cos(theta1+theta2-pi64/2.0))
	phi1 := float64(-m2*l1*lc2*(dtheta2*dtheta2)*math.Sin(theta2)) -
		float64(2*m2*l1*lc2*dtheta2*dtheta1*math.Sin(theta2)) +
		float64((float64(m1*lc1)+float64(m2*l1))*g*math.Cos(theta1-pi64/2)) +
		phi2
	ddtheta2 := (a + float64(d2/d1*phi1) - float64(m2*l1*lc2*(dtheta1*dtheta1)*math.Sin(theta2)) - phi2) /
		(float64(m2*(lc2*lc2)) + i2 - (d2*d2)/d1)
	ddtheta1 := -(float64(d2*ddtheta2) + phi1) / d1
	return [4]float64{dtheta1, dtheta2, ddtheta1, ddtheta2}
}

// wrap is Gymnasium's wrap: shift x by whole periods M-m into [m, M].
func wrap(x, m, M float64) float64 {
	diff := M - m
	for x > M {
		x = x - diff
	}
	for x < m {
		x = x + diff
	}
	return x
}

// bound is Gymnasium's bound: min(max(x, m), M) with Python's builtins.
func bound(x, m, M float64) float64 {
	if m > x {
		x = m
	}
	if M < x {
		x = M
	}
	return x
}

// State implements StateSetter: theta1, theta2, dtheta1, dtheta2.
func (a *Acrobot) State() []float64 { return append([]float64(nil), a.state[:]...) }

// SetState implements StateSetter, like assigning env.unwrapped.state.
func (a *Acrobot) SetState(s []float64) ([]float64, error) {
	if len(s) != len(a.state) {
		return nil, fmt.Errorf("env: Acrobot-v1 state has %d values (theta1, theta2, dtheta1, dtheta2), got %d", len(a.state), len(s))
	}
	copy(a.state[:], s)
	return a.observe(), nil
}

func (a *Acrobot) observe() []float64 {
	s := a.state
	a.obs = [6]float64{
		float64(float32(math.Cos(s[0]))), float64(float32(math.Sin(s[0]))),
		float64(float32(math.Cos(s[1]))), float64(float32(math.Sin(s[1]))),
		float64(float32(s[2])), float64(float32(s[3])),
	}
	return a.obs[:]
}
