package env

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// CartPole is Gymnasium's CartPole-v1 (classic_control/cartpole.py, Gymnasium
// 1.4.0) with the TimeLimit of 500 steps that gymnasium.make adds.
//
// Arithmetic follows Gymnasium: the state is float64, the Euler update is
// evaluated in the same order, and observations are the state rounded to
// float32 (returned widened to float64). Reward is 1 per step, including the
// step that terminates; steps taken after termination without a Reset earn 0,
// as in Gymnasium. Actions: 0 pushes left, 1 pushes right.
type CartPole struct {
	state [4]float64 // x, x_dot, theta, theta_dot
	obs   [4]float64
	clock timeLimit
	// stepsBeyondTerminated is -1 until the episode has terminated
	// (Gymnasium's steps_beyond_terminated = None).
	stepsBeyondTerminated int
}

// CartPole constants, computed at run time in Gymnasium's float64 order
// (Go would fold constant expressions exactly, which can differ in the last
// bit).
var (
	cpGravity        = 9.8
	cpMassCart       = 1.0
	cpMassPole       = 0.1
	cpTotalMass      = cpMassPole + cpMassCart
	cpLength         = 0.5 // half the pole's length
	cpPoleMassLength = cpMassPole * cpLength
	cpForceMag       = 10.0
	cpTau            = 0.02
	cpThetaThreshold = 12 * 2 * pi64 / 360
	cpXThreshold     = 2.4
)

// pi64 is math.Pi as a float64 variable, so expressions using it round at
// each operation like numpy's do.
var pi64 = math.Pi

// NewCartPole returns a CartPole-v1 that must be Reset before stepping.
func NewCartPole() *CartPole {
	return &CartPole{clock: timeLimit{max: 500}, stepsBeyondTerminated: -1}
}

// Spec implements Env.
func (c *CartPole) Spec() Spec {
	return Spec{Name: "CartPole-v1", ObsDim: 4, Discrete: 2, MaxEpisodeSteps: 500}
}

// Reset implements Env: each state variable uniform in [-0.05, 0.05).
func (c *CartPole) Reset(rng *rand.Rand) []float64 {
	for i := range c.state {
		c.state[i] = uniform(rng, -0.05, 0.05)
	}
	c.stepsBeyondTerminated = -1
	c.clock.reset()
	return c.observe()
}

// Step implements Env. action[0] must be 0 or 1; anything else panics.
func (c *CartPole) Step(action []float64) ([]float64, float64, bool, bool) {
	a := discreteAction("CartPole-v1", action, 2)
	truncated := c.clock.tick("CartPole-v1")
	x, xDot, theta, thetaDot := c.state[0], c.state[1], c.state[2], c.state[3]
	force := -cpForceMag
	if a == 1 {
		force = cpForceMag
	}
	cosTheta := math.Cos(theta)
	sinTheta := math.Sin(theta)
	temp := (force + float64(cpPoleMassLength*(thetaDot*thetaDot)*sinTheta)) / cpTotalMass
	thetaAcc := (float64(cpGravity*sinTheta) - float64(cosTheta*temp)) /
		(cpLength * (4.0/3.0 - cpMassPole*(cosTheta*cosTheta)/cpTotalMass))
	xAcc := temp - float64(cpPoleMassLength*thetaAcc*cosTheta/cpTotalMass)
	// Euler integrator (Gymnasium's default kinematics_integrator).
	x = x + float64(cpTau*xDot)
	xDot = xDot + float64(cpTau*xAcc)
	theta = theta + float64(cpTau*thetaDot)
	thetaDot = thetaDot + float64(cpTau*thetaAcc)
	c.state = [4]float64{x, xDot, theta, thetaDot}

	terminated := x < -cpXThreshold || x > cpXThreshold ||
		theta < -cpThetaThreshold || theta > cpThetaThreshold
	reward := 1.0
	if terminated {
		if c.stepsBeyondTerminated < 0 {
			c.stepsBeyondTerminated = 0
		} else {
			c.stepsBeyondTerminated++
			reward = 0
		}
	}
	return c.observe(), reward, terminated, truncated
}

// State implements StateSetter: x, x_dot, theta, theta_dot.
func (c *CartPole) State() []float64 { return append([]float64(nil), c.state[:]...) }

// SetState implements StateSetter, like assigning env.unwrapped.state.
func (c *CartPole) SetState(s []float64) ([]float64, error) {
	if len(s) != len(c.state) {
		return nil, fmt.Errorf("env: CartPole-v1 state has %d values (x, x_dot, theta, theta_dot), got %d", len(c.state), len(s))
	}
	copy(c.state[:], s)
	return c.observe(), nil
}

func (c *CartPole) observe() []float64 {
	for i, v := range c.state {
		c.obs[i] = float64(float32(v))
	}
	return c.obs[:]
}
