package ars

import (
	"math/rand/v2"

	"github.com/rlhub/rlhub/internal/env"
)

// Rollout runs one episode of policy (arch, theta) with frozen filter flt.
// Every reward has shift subtracted (pass 0 for evaluation). When stats is
// non-nil every observation the policy acts on is pushed into it (the raw,
// unnormalised state). The episode ends on termination or truncation (the
// environment's time limit). It returns the summed shifted reward and the
// number of steps.
func Rollout(e env.Env, fw *Forward, theta []float64, flt Filter, shift float64, rng *rand.Rand, stats *Stats) (ret float64, steps int64) {
	ret, steps, _ = rollout(e, fw, theta, flt, shift, rng, stats, nil)
	return ret, steps
}

// stopEvery is how many steps an episode runs between two calls of its
// stop check (Evaluator.RunUntil).
const stopEvery = 256

// rollout is Rollout that calls stop (when non-nil) before every
// stopEvery-th step and, when it returns true, ends the episode there
// with stopped set (its return and steps are then partial). The checks
// change nothing else: an episode never stopped is Rollout's.
func rollout(e env.Env, fw *Forward, theta []float64, flt Filter, shift float64, rng *rand.Rand, stats *Stats, stop func() bool) (ret float64, steps int64, stopped bool) {
	obs := e.Reset(rng)
	for {
		if stop != nil && steps%stopEvery == 0 && stop() {
			return ret, steps, true
		}
		if stats != nil {
			stats.Push(obs)
		}
		a := fw.Act(theta, flt, obs)
		var r float64
		var term, trunc bool
		obs, r, term, trunc = e.Step(a)
		ret += r - shift
		steps++
		if term || trunc {
			return ret, steps, false
		}
	}
}

// episodeRNG returns the environment RNG of episode stream index.
func episodeRNG(seed, index uint64) *rand.Rand {
	s1, s2 := EpisodeSeed(seed, index)
	return rand.New(rand.NewPCG(s1, s2))
}

// Episode stream indices: both rollouts of direction d at iteration j start
// from the same environment seed (common random numbers), index
// j·2³² + d; evaluation episode e of iteration j uses j·2³² + 2³¹ + e.
func trainEpisodeIndex(iter uint64, d int) uint64 { return iter<<32 | uint64(d) }
func evalEpisodeIndex(iter uint64, e int) uint64  { return iter<<32 | 1<<31 | uint64(e) }

// Evaluator runs a worker's tasks: it owns one environment and scratch
// space, so it is used by one goroutine at a time.
type Evaluator struct {
	env   env.Env
	fw    *Forward
	delta []float64
	pert  []float64
}

// Env is the environment the evaluator runs.
func (e *Evaluator) Env() env.Env { return e.env }

// NewEvaluator prepares an evaluator for arch on environment e.
func NewEvaluator(e env.Env, arch *Arch) *Evaluator {
	n := arch.NumParams()
	return &Evaluator{env: e, fw: NewForward(arch), delta: make([]float64, n), pert: make([]float64, n)}
}

// Run computes the result of one task of iteration it.Iteration.
func (ev *Evaluator) Run(it *Iteration, t Task) Result {
	res, _ := ev.RunUntil(it, t, nil)
	return res
}

// RunUntil is Run that checks stop (when non-nil) before each episode
// and every 256 steps within one; once stop returns true it abandons the
// task and returns ok false (the result is then partial: drop it). A
// task it finishes is exactly Run's.
func (ev *Evaluator) RunUntil(it *Iteration, t Task, stop func() bool) (res Result, ok bool) {
	res = Result{Task: t}
	var stopped bool
	switch t.Kind {
	case KindDirection:
		Direction(ev.delta, it.Seed, it.Iteration*uint64(it.Hyper.Directions)+uint64(t.Index))
		res.Stats = NewStats(len(it.Filter.Mean))
		idx := trainEpisodeIndex(it.Iteration, t.Index)
		var n int64
		Perturb(ev.pert, it.Theta, ev.delta, it.Hyper.Noise, +1)
		res.RPlus, n, stopped = rollout(ev.env, ev.fw, ev.pert, it.Filter, it.Hyper.Shift, episodeRNG(it.Seed, idx), res.Stats, stop)
		res.Steps += n
		if stopped {
			return res, false
		}
		Perturb(ev.pert, it.Theta, ev.delta, it.Hyper.Noise, -1)
		res.RMinus, n, stopped = rollout(ev.env, ev.fw, ev.pert, it.Filter, it.Hyper.Shift, episodeRNG(it.Seed, idx), res.Stats, stop)
		res.Steps += n
	case KindEval:
		res.Return, res.Steps, stopped = rollout(ev.env, ev.fw, it.Theta, it.Filter, 0, episodeRNG(it.Seed, evalEpisodeIndex(it.Iteration, t.Index)), nil, stop)
	}
	return res, !stopped
}

// Evaluate runs episodes of policy p with its frozen filter and no shift
// and returns their returns. Episode i's environment seed is stream
// (seed, 2⁶³ + i), a range training never uses.
func Evaluate(e env.Env, p *Policy, seed uint64, episodes int) []float64 {
	fw := NewForward(&p.Arch)
	flt := p.Filter()
	out := make([]float64, episodes)
	for i := range out {
		out[i], _ = Rollout(e, fw, p.Theta, flt, 0, episodeRNG(seed, 1<<63|uint64(i)), nil)
	}
	return out
}
