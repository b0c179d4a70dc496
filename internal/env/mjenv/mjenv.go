// Package mjenv implements Gymnasium's MuJoCo locomotion tasks
// (HalfCheetah-v5, Hopper-v5, Swimmer-v5, Walker2d-v5, Ant-v5,
// Humanoid-v5) in Go on top of internal/mujoco, with Gymnasium 1.4's
// default parameters: observation, reward terms, healthy ranges and
// termination, reset noise, frame skip and the 1000-step time limit.
//
// The robot models are Gymnasium's own XML files, read at run time from
// the installed gymnasium package or from $RLHUB_MUJOCO_ASSETS (see
// AssetsDir); they are not part of this repository.
//
// Importing the package registers every task with env.Register, so
// env.Make("Hopper-v5") works in any binary that imports it. In a build
// without MuJoCo (no "mujoco" build tag) the package still compiles and
// registers the tasks, but constructing one returns an error wrapping
// mujoco.ErrNotInstalled that says how to install MuJoCo.
//
// Actions follow Gymnasium exactly: the action is written to the controls
// unchanged, MuJoCo clamps every (ctrllimited) actuator to its control
// range when applying it, and the control cost is computed on the action as
// given, so out-of-range actions cost more without acting more.
package mjenv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/mujoco"
)

// MaxEpisodeSteps is the time limit Gymnasium registers for every task here.
const MaxEpisodeSteps = 1000

type kind int

const (
	halfCheetah kind = iota
	hopper
	swimmer
	walker2d
	ant
	humanoid
)

// task holds one environment's Gymnasium v5 defaults.
type task struct {
	name      string
	kind      kind
	xml       string  // file in Gymnasium's envs/mujoco/assets
	frameSkip int     // MuJoCo steps per env step
	skipQpos  int     // leading qpos entries left out of the observation (x, or x and y)
	clipQvel  bool    // observed velocities clipped to [-10, 10] (Hopper, Walker2d)
	noise     float64 // reset_noise_scale
	gaussQvel bool    // qvel noise is noise·N(0,1) instead of U(-noise, noise)
	forward   float64 // forward_reward_weight
	ctrlCost  float64 // ctrl_cost_weight
	healthy   float64 // healthy_reward; 0 for tasks that never terminate
}

// tasks lists the v5 defaults, read from gymnasium/envs/mujoco/*_v5.py of
// Gymnasium 1.4.0.
var tasks = []task{
	{name: "HalfCheetah-v5", kind: halfCheetah, xml: "half_cheetah.xml", frameSkip: 5, skipQpos: 1,
		noise: 0.1, gaussQvel: true, forward: 1, ctrlCost: 0.1},
	{name: "Hopper-v5", kind: hopper, xml: "hopper.xml", frameSkip: 4, skipQpos: 1, clipQvel: true,
		noise: 5e-3, forward: 1, ctrlCost: 1e-3, healthy: 1},
	{name: "Swimmer-v5", kind: swimmer, xml: "swimmer.xml", frameSkip: 4, skipQpos: 2,
		noise: 0.1, forward: 1, ctrlCost: 1e-4},
	{name: "Walker2d-v5", kind: walker2d, xml: "walker2d_v5.xml", frameSkip: 4, skipQpos: 1, clipQvel: true,
		noise: 5e-3, forward: 1, ctrlCost: 1e-3, healthy: 1},
	{name: "Ant-v5", kind: ant, xml: "ant.xml", frameSkip: 5, skipQpos: 2,
		noise: 0.1, gaussQvel: true, forward: 1, ctrlCost: 0.5, healthy: 1},
	{name: "Humanoid-v5", kind: humanoid, xml: "humanoid.xml", frameSkip: 5, skipQpos: 2,
		noise: 1e-2, forward: 1.25, ctrlCost: 0.1, healthy: 5},
}

// Names lists the tasks this package provides.
func Names() []string {
	names := make([]string, len(tasks))
	for i, t := range tasks {
		names[i] = t.name
	}
	return names
}

func init() {
	for _, t := range tasks {
		name := t.name
		env.Register(name, func() (env.Env, error) { return New(name, Options{}) })
	}
}

// Options configures New. The zero value is Gymnasium's defaults with the
// models found by AssetsDir.
type Options struct {
	// AssetsDir is the directory holding Gymnasium's robot XMLs; empty
	// means AssetsDir().
	AssetsDir string
}

// Env is one instance of a task. It owns a MuJoCo model and simulation
// (freed by Close, or by the garbage collector when unreachable). Like every
// env.Env it is not safe for concurrent use.
type Env struct {
	t     *task
	spec  env.Spec
	model *mujoco.Model
	data  *mujoco.Data
	dt    float64

	initQpos, initQvel []float64 // Gymnasium's init_qpos / init_qvel
	obs                []float64 // returned by Reset/Step/SetState, owned by Env
	scratch            []float64 // qpos saved across forward
	bodyMass           []float64 // Humanoid: body_mass (aliases the model)
	totalMass          float64   // Humanoid: sum of body_mass

	steps   int
	started bool
}

var (
	_ env.Env         = (*Env)(nil)
	_ env.StateSetter = (*Env)(nil)
)

// New makes the named task. It fails with a clear message when the name is
// unknown, MuJoCo is not compiled in (wrapping mujoco.ErrNotInstalled), or
// the robot model cannot be found or compiled.
func New(name string, opt Options) (*Env, error) {
	var t *task
	for i := range tasks {
		if tasks[i].name == name {
			t = &tasks[i]
		}
	}
	if t == nil {
		return nil, fmt.Errorf("mjenv: unknown task %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if !mujoco.Available {
		return nil, fmt.Errorf("mjenv: %s needs MuJoCo: %w: %s", name, mujoco.ErrNotInstalled, mujoco.InstallHint)
	}
	path, err := modelPath(opt.AssetsDir, t.xml)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	model, err := mujoco.LoadXML(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	data, err := mujoco.NewData(model)
	if err != nil {
		model.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	e := &Env{t: t, model: model, data: data, dt: model.Timestep() * float64(t.frameSkip)}
	e.initQpos = append([]float64(nil), data.QPos()...)
	e.initQvel = append([]float64(nil), data.QVel()...)
	lo, hi := model.CtrlRange()
	e.spec = env.Spec{Name: name, ObsDim: e.obsDim(), ActDim: model.Nu, ActLow: lo, ActHigh: hi,
		MaxEpisodeSteps: MaxEpisodeSteps}
	e.obs = make([]float64, e.spec.ObsDim)
	if t.kind == humanoid {
		e.bodyMass = model.BodyMass()
		for _, m := range e.bodyMass {
			e.totalMass += m
		}
	}
	return e, nil
}

// Close frees the MuJoCo memory now rather than at garbage collection. The
// Env must not be used afterwards. Calling Close twice is safe.
func (e *Env) Close() {
	e.data.Close()
	e.model.Close()
}

// Spec describes the task's spaces; ActLow/ActHigh are the actuators'
// control ranges (float64, where Gymnasium's Box is float32).
func (e *Env) Spec() env.Spec { return e.spec }

// Dt is the duration of one env step (timestep × frame skip).
func (e *Env) Dt() float64 { return e.dt }

// Reset starts an episode as Gymnasium's reset_model does: the reference
// pose plus U(-s, s) noise on every qpos, and U(-s, s) (or s·N(0,1) for
// HalfCheetah and Ant) on every qvel, s being the task's reset noise scale.
func (e *Env) Reset(rng *rand.Rand) []float64 {
	e.data.Reset()
	s := e.t.noise
	qpos, qvel := e.data.QPos(), e.data.QVel()
	for i := range qpos {
		qpos[i] = e.initQpos[i] + (-s + float64(2*s*rng.Float64()))
	}
	for i := range qvel {
		if e.t.gaussQvel {
			qvel[i] = e.initQvel[i] + float64(s*rng.NormFloat64())
		} else {
			qvel[i] = e.initQvel[i] + (-s + float64(2*s*rng.Float64()))
		}
	}
	e.forward()
	e.steps, e.started = 0, true
	e.observe()
	runtime.KeepAlive(e)
	return e.obs
}

// State returns a copy of (qpos, qvel), Gymnasium's state_vector().
func (e *Env) State() []float64 {
	s := append(append([]float64(nil), e.data.QPos()...), e.data.QVel()...)
	runtime.KeepAlive(e)
	return s
}

// SetState sets (qpos, qvel) as Gymnasium's set_state does (then
// mj_forward) and returns the observation. Contact forces in the
// observation stay those of the last step until the next Step, as in
// Gymnasium.
func (e *Env) SetState(state []float64) ([]float64, error) {
	nq, nv := e.model.Nq, e.model.Nv
	if len(state) != nq+nv {
		return nil, fmt.Errorf("mjenv: %s: state has length %d, want nq+nv = %d", e.t.name, len(state), nq+nv)
	}
	copy(e.data.QPos(), state[:nq])
	copy(e.data.QVel(), state[nq:])
	e.forward()
	e.observe()
	runtime.KeepAlive(e)
	return e.obs, nil
}

// Step applies action for frame-skip MuJoCo steps and returns Gymnasium's
// observation, reward, termination (leaving the healthy range) and
// truncation (the 1000-step limit). A wrong action length, or Step before
// the first Reset, is a programming error and panics.
func (e *Env) Step(action []float64) (obs []float64, reward float64, terminated, truncated bool) {
	if !e.started {
		panic("mjenv: " + e.t.name + ": Step called before Reset")
	}
	if len(action) != e.spec.ActDim {
		panic(fmt.Sprintf("mjenv: %s: action must have length %d, got %d", e.t.name, e.spec.ActDim, len(action)))
	}
	x0 := e.xPosition()
	copy(e.data.Ctrl(), action)
	e.data.Step(e.t.frameSkip)
	e.data.RNEPostConstraint()
	x1 := e.xPosition()
	xVel := (x1 - x0) / e.dt
	e.observe()

	forward := float64(e.t.forward * xVel)
	ctrlCost := 0.0
	for _, a := range action {
		ctrlCost += float64(a * a)
	}
	ctrlCost = float64(ctrlCost * e.t.ctrlCost)
	healthyReward := 0.0
	if e.t.healthy != 0 {
		healthy := e.isHealthy()
		if healthy {
			healthyReward = e.t.healthy
		}
		terminated = !healthy
	}
	reward = (forward + healthyReward) - (ctrlCost + e.contactCost())

	e.steps++
	truncated = e.steps >= MaxEpisodeSteps
	runtime.KeepAlive(e)
	return e.obs, reward, terminated, truncated
}

// forward runs mj_forward on a state just written, keeping qpos as
// written. MuJoCo 2.2.2's mj_forward normalizes free-joint quaternions in
// qpos in place; the MuJoCo releases Gymnasium runs on (2.3.1 to 4.0.0
// were checked) do not, so Gymnasium's reset observation of Ant and
// Humanoid shows the noisy, unnormalized quaternion. Restoring qpos gives
// the same observation; the dynamics use the normalized quaternion either
// way, and the next integration step normalizes qpos in every version.
func (e *Env) forward() {
	qpos := e.data.QPos()
	e.scratch = append(e.scratch[:0], qpos...)
	e.data.Forward()
	copy(qpos, e.scratch)
}

// xPosition is the x coordinate whose change is the forward velocity: the
// root slider for planar robots, the torso body (Ant's main_body 1), or the
// mass centre (Humanoid).
func (e *Env) xPosition() float64 {
	switch e.t.kind {
	case ant:
		return e.data.XPos()[3*1]
	case humanoid:
		xipos := e.data.XIPos()
		x := 0.0
		for b, m := range e.bodyMass {
			x += m * xipos[3*b]
		}
		return x / e.totalMass
	default:
		return e.data.QPos()[0]
	}
}

// isHealthy is each task's is_healthy property.
func (e *Env) isHealthy() bool {
	qpos := e.data.QPos()
	switch e.t.kind {
	case hopper:
		z, angle := qpos[1], qpos[2]
		for _, v := range qpos[2:] {
			if !(-100 < v && v < 100) {
				return false
			}
		}
		for _, v := range e.data.QVel() {
			if !(-100 < v && v < 100) {
				return false
			}
		}
		return 0.7 < z && z < math.Inf(1) && -0.2 < angle && angle < 0.2
	case walker2d:
		z, angle := qpos[1], qpos[2]
		return 0.8 < z && z < 2 && -1 < angle && angle < 1
	case ant:
		for _, v := range qpos {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return false
			}
		}
		for _, v := range e.data.QVel() {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return false
			}
		}
		return 0.2 <= qpos[2] && qpos[2] <= 1
	case humanoid:
		return 1 < qpos[2] && qpos[2] < 2
	}
	return true
}

// contactCost is Ant's (weight 5e-4, forces clipped to [-1, 1]) and
// Humanoid's (weight 5e-7, cost capped at 10) contact cost over every
// body's cfrc_ext; 0 for the other tasks.
func (e *Env) contactCost() float64 {
	switch e.t.kind {
	case ant:
		s := 0.0
		for _, f := range e.data.CFrcExt() {
			f = clip(f, -1, 1)
			s += float64(f * f)
		}
		return float64(5e-4 * s)
	case humanoid:
		s := 0.0
		for _, f := range e.data.CFrcExt() {
			s += float64(f * f)
		}
		return min(float64(5e-7*s), 10)
	}
	return 0
}

func (e *Env) obsDim() int {
	m := e.model
	n := m.Nq - e.t.skipQpos + m.Nv
	switch e.t.kind {
	case ant:
		n += 6 * (m.Nbody - 1)
	case humanoid:
		n += (10 + 6 + 6) * (m.Nbody - 1)
		n += m.Nv - 6
	}
	return n
}

// observe fills e.obs with the task's observation.
func (e *Env) observe() {
	o := e.obs[:0]
	o = append(o, e.data.QPos()[e.t.skipQpos:]...)
	if e.t.clipQvel {
		for _, v := range e.data.QVel() {
			o = append(o, clip(v, -10, 10))
		}
	} else {
		o = append(o, e.data.QVel()...)
	}
	switch e.t.kind {
	case ant:
		for _, f := range e.data.CFrcExt()[6:] {
			o = append(o, clip(f, -1, 1))
		}
	case humanoid:
		o = append(o, e.data.CInert()[10:]...)
		o = append(o, e.data.CVel()[6:]...)
		o = append(o, e.data.QFrcActuator()[6:]...)
		o = append(o, e.data.CFrcExt()[6:]...)
	}
	if len(o) != len(e.obs) {
		panic(fmt.Sprintf("mjenv: %s: observation has %d values, spec says %d", e.t.name, len(o), len(e.obs)))
	}
}

// clip is numpy.clip for one value (NaN passes through).
func clip(v, lo, hi float64) float64 {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}
