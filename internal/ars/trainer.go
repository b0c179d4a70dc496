package ars

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
)

// Config describes one ARS run. Given the same Config a run produces
// bit-identical policies whatever the number of workers.
type Config struct {
	// Env is the environment name (env.Make) and Spec its spaces.
	Env  string
	Spec env.Spec
	// Seed selects the noise directions, episode seeds and MLP init.
	Seed  uint64
	Hyper Hyper
	// Update is how θ moves: the paper's step (the zero value) or an
	// optimizer on Machin's ARS gradient, an lr schedule, clipping.
	Update Update
	// Hidden are MLP hidden widths; empty means the paper's linear policy.
	Hidden []int
	// EvalEvery is K: the current policy is evaluated at iterations
	// 0, K, 2K, … (and once more at the end); 0 means 10.
	EvalEvery int
	// EvalEpisodes is E, episodes per evaluation; 0 means 10.
	EvalEpisodes int
	// Target stops the run once an evaluation's mean return reaches it;
	// used only when UseTarget.
	Target    float64
	UseTarget bool
	// ConfirmEpisodes: once an evaluation reaches Target, θ is evaluated
	// once more on this many fresh episodes (ConfirmBase + e) in a final
	// iteration, and that is the result the run reports; 0 means none.
	ConfirmEpisodes int
	// MaxEpisodes bounds training episodes (2N per iteration); 0 means no
	// episode bound.
	MaxEpisodes int64
	// MaxIterations bounds iterations; 0 means no iteration bound. At
	// least one of MaxEpisodes and MaxIterations must be set.
	MaxIterations int
}

// Validate fills defaults and rejects nonsense, wrapping errs.ErrInvalid.
func (c *Config) Validate() error {
	if err := c.Hyper.Validate(); err != nil {
		return err
	}
	if err := c.Update.validate(c.Hyper.StepSize); err != nil {
		return err
	}
	if c.Spec.ObsDim < 1 {
		return fmt.Errorf("%w: environment %q has observation dimension %d", errs.ErrInvalid, c.Env, c.Spec.ObsDim)
	}
	if err := ValidateObsKeys(c.Spec.ObsKeys, c.Spec.ObsDim); err != nil {
		return err
	}
	if c.Spec.Discrete == 0 && c.Spec.ActDim < 1 {
		return fmt.Errorf("%w: environment %q has no actions", errs.ErrInvalid, c.Env)
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = 10
	}
	if c.EvalEpisodes == 0 {
		c.EvalEpisodes = 10
	}
	if c.EvalEvery < 1 || c.EvalEpisodes < 1 || c.EvalEpisodes > 1<<20 {
		return fmt.Errorf("%w: eval every %d iterations over %d episodes", errs.ErrInvalid, c.EvalEvery, c.EvalEpisodes)
	}
	if c.ConfirmEpisodes < 0 || c.ConfirmEpisodes > 1<<20 {
		return fmt.Errorf("%w: confirm episodes %d", errs.ErrInvalid, c.ConfirmEpisodes)
	}
	if c.UseTarget && !finite(c.Target) {
		return fmt.Errorf("%w: target %v", errs.ErrInvalid, c.Target)
	}
	if c.MaxEpisodes < 0 || c.MaxIterations < 0 || (c.MaxEpisodes == 0 && c.MaxIterations == 0) {
		return fmt.Errorf("%w: need a budget: max episodes %d, max iterations %d", errs.ErrInvalid, c.MaxEpisodes, c.MaxIterations)
	}
	if c.MaxEpisodes > 0 && c.MaxEpisodes < int64(2*c.Hyper.Directions) {
		return fmt.Errorf("%w: max episodes %d is below one iteration's 2N = %d", errs.ErrInvalid, c.MaxEpisodes, 2*c.Hyper.Directions)
	}
	a := c.Arch()
	return a.Validate()
}

// Arch returns the policy architecture for the run.
func (c *Config) Arch() Arch {
	a := Arch{ObsDim: c.Spec.ObsDim, Hidden: c.Hidden}
	if c.Spec.Discrete > 0 {
		a.OutDim, a.Discrete = c.Spec.Discrete, true
	} else {
		a.OutDim = c.Spec.ActDim
	}
	return a
}

// TaskKind tells a worker what to run.
type TaskKind int

const (
	// KindDirection: the two rollouts θ ± νδ_d of direction d.
	KindDirection TaskKind = iota + 1
	// KindEval: evaluation episode e of θ (shift 0, filter frozen).
	KindEval
)

// ConfirmBase offsets the evaluation episodes of the re-evaluation after a
// stop at the target: task (KindEval, ConfirmBase + e) runs on episode
// seeds no regular evaluation uses.
const ConfirmBase = 1 << 30

// Task is one unit of work within an iteration.
type Task struct {
	Kind  TaskKind
	Index int
}

// Result is a task's outcome.
type Result struct {
	Task
	// RPlus, RMinus: shifted returns of θ+νδ and θ−νδ (KindDirection).
	RPlus, RMinus float64
	// Return: unshifted return (KindEval).
	Return float64
	// Steps taken by the task's episodes.
	Steps int64
	// Stats of the states seen (KindDirection; nil for KindEval).
	Stats *Stats
}

// Iteration is everything a worker needs to run iteration Iteration's
// tasks. Theta and the filter are read-only.
type Iteration struct {
	Seed      uint64
	Iteration uint64
	Hyper     Hyper
	Theta     []float64
	Filter    Filter
}

// Report summarises a finished iteration.
type Report struct {
	Iteration uint64
	Episodes  int64 // training episodes so far
	// PolicyEpisodes: training episodes that produced this iteration's θ
	// (the one evaluated), i.e. before this iteration's directions.
	PolicyEpisodes int64
	EvalEpisodes   int64 // evaluation episodes so far
	Steps          int64 // environment steps so far (training and evaluation)
	IterSteps      int64 // steps of this iteration
	// TrainMean is the mean of the iteration's 2N shifted training returns
	// (0 for an evaluation-only iteration).
	TrainMean float64
	HasEval   bool
	EvalMean  float64
	EvalStd   float64
	Update    StepInfo
	Updated   bool // θ moved to a new version
	Done      bool
	Reason    string // why the run ended: "target" or "budget"
	// Confirm: this iteration was the re-evaluation on fresh episodes
	// after the target was reached; EvalMean/EvalStd are its result.
	Confirm bool
}

// Trainer is the pure ARS run state machine the coordinator drives: it
// lists an iteration's tasks, takes their results, updates θ and the
// filter statistics, and decides when to stop. It has no goroutines and is
// not safe for concurrent use.
type Trainer struct {
	cfg      Config
	arch     Arch
	iter     uint64
	theta    []float64
	stats    *Stats
	evalOnly bool // the current iteration only evaluates (the final one)
	// confirming: the current iteration re-evaluates θ on ConfirmEpisodes
	// fresh episodes after an evaluation reached the target.
	confirming bool
	rep        Report
	filter     Filter
	// opt is the optimizer of a non-plain Update (nil for the paper's
	// step); it has taken exactly iter steps.
	opt *optim.Optimizer
}

// NewTrainer starts a run at iteration 0 with θ_0 and empty statistics.
func NewTrainer(cfg Config) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Trainer{cfg: cfg, arch: cfg.Arch()}
	t.theta = t.arch.InitParams(cfg.Seed)
	t.stats = NewStats(cfg.Spec.ObsDim)
	var err error
	if t.opt, err = t.cfg.Update.newOptimizer(len(t.theta)); err != nil {
		return nil, err
	}
	t.freeze()
	return t, nil
}

func (t *Trainer) freeze() {
	if t.cfg.Hyper.Version.Normalises() {
		t.filter = t.stats.Freeze()
	} else {
		t.filter = Identity(t.cfg.Spec.ObsDim)
	}
}

// Config returns the validated run configuration.
func (t *Trainer) Config() Config { return t.cfg }

// Arch returns the policy architecture.
func (t *Trainer) Arch() Arch { return t.arch }

// Iter is the current iteration number.
func (t *Trainer) Iter() uint64 { return t.iter }

// Done reports whether the run has ended.
func (t *Trainer) Done() bool { return t.rep.Done }

// Last returns the report of the last finished iteration.
func (t *Trainer) Last() Report { return t.rep }

// Current describes the current iteration. It shares θ with the trainer:
// callers must not modify it, and it is valid until the next Finish.
func (t *Trainer) Current() *Iteration {
	return &Iteration{Seed: t.cfg.Seed, Iteration: t.iter, Hyper: t.cfg.Hyper, Theta: t.theta, Filter: t.filter}
}

// Theta returns θ of the current iteration (read-only).
func (t *Trainer) Theta() []float64 { return t.theta }

// Stats returns the filter statistics θ is paired with (read-only).
func (t *Trainer) Stats() *Stats { return t.stats }

func (t *Trainer) evaluates() bool {
	return t.confirming || t.evalOnly || t.iter%uint64(t.cfg.EvalEvery) == 0
}

// evalTasks is the current iteration's evaluation episodes: their count
// and the first task index.
func (t *Trainer) evalTasks() (n, base int) {
	switch {
	case t.confirming:
		return t.cfg.ConfirmEpisodes, ConfirmBase
	case t.evaluates():
		return t.cfg.EvalEpisodes, 0
	}
	return 0, 0
}

// Confirming reports whether the current iteration is the re-evaluation
// after the target was reached (results of the iteration before it, same
// number, are then stale, not invalid).
func (t *Trainer) Confirming() bool { return t.confirming }

// Tasks lists the current iteration's tasks: directions 0..N−1 (unless this
// is the final evaluation-only iteration), then evaluation episodes
// 0..E−1 when the iteration evaluates. Finish takes results in this order.
func (t *Trainer) Tasks() []Task {
	if t.rep.Done {
		return nil
	}
	var ts []Task
	if !t.evalOnly && !t.confirming {
		for d := 0; d < t.cfg.Hyper.Directions; d++ {
			ts = append(ts, Task{KindDirection, d})
		}
	}
	n, base := t.evalTasks()
	for e := 0; e < n; e++ {
		ts = append(ts, Task{KindEval, base + e})
	}
	return ts
}

// Check validates a result that arrived from a worker for the current
// iteration: a task of this iteration, finite returns, sane steps and
// statistics of the right dimension. It changes nothing. Every error
// wraps errs.ErrInvalid; one about the values only (returns or
// statistics non-finite or past the bounds, which a diverging policy or
// environment produces) also matches ErrDiverged: the run cannot go on,
// whoever computes the task.
func (t *Trainer) Check(r *Result) error {
	// The shape first: a result malformed in any way is refused as such,
	// even when its values have diverged too.
	switch r.Kind {
	case KindDirection:
		if t.evalOnly || t.confirming || r.Index < 0 || r.Index >= t.cfg.Hyper.Directions {
			return fmt.Errorf("%w: no direction %d in iteration %d", errs.ErrInvalid, r.Index, t.iter)
		}
		if r.Stats == nil {
			return fmt.Errorf("%w: direction %d result without filter statistics", errs.ErrInvalid, r.Index)
		}
		if len(r.Stats.Mean) != t.cfg.Spec.ObsDim || len(r.Stats.M2) != t.cfg.Spec.ObsDim {
			return fmt.Errorf("%w: direction %d: filter statistics of dimension %d/%d, want %d", errs.ErrInvalid, r.Index, len(r.Stats.Mean), len(r.Stats.M2), t.cfg.Spec.ObsDim)
		}
		if r.Stats.Count != float64(r.Steps) {
			return fmt.Errorf("%w: direction %d saw %v states in %d steps", errs.ErrInvalid, r.Index, r.Stats.Count, r.Steps)
		}
	case KindEval:
		if n, base := t.evalTasks(); r.Index < base || r.Index >= base+n {
			return fmt.Errorf("%w: no evaluation episode %d in iteration %d", errs.ErrInvalid, r.Index, t.iter)
		}
	default:
		return fmt.Errorf("%w: unknown task kind %d", errs.ErrInvalid, r.Kind)
	}
	if limit := t.maxSteps(r.Kind); r.Steps < 1 || r.Steps > limit {
		return fmt.Errorf("%w: task %v/%d took %d steps (1 to %d)", errs.ErrInvalid, r.Kind, r.Index, r.Steps, limit)
	}
	// Then the values.
	if r.Kind == KindEval {
		if !sane(r.Return) {
			return diverged("evaluation episode %d of iteration %d returned %v (finite, |r| ≤ %g)", r.Index, t.iter, r.Return, maxReturn)
		}
		return nil
	}
	if !sane(r.RPlus) || !sane(r.RMinus) {
		return diverged("direction %d of iteration %d returned r+ = %v, r− = %v (finite, |r| ≤ %g)", r.Index, t.iter, r.RPlus, r.RMinus, maxReturn)
	}
	if err := r.Stats.check(t.cfg.Spec.ObsDim, taskStats); err != nil {
		if d := (*divergedError)(nil); errors.As(err, &d) {
			return diverged("direction %d of iteration %d: %s", r.Index, t.iter, d.msg)
		}
		return fmt.Errorf("direction %d: %w", r.Index, err)
	}
	return nil
}

// Bounds on what a worker reports for one task, far past any real
// episode, so that the iteration's sums, σ_R and the filter's moments
// stay finite and the run's counters never overflow: a report of 2^63
// steps made the run's step count negative, which a restart refused (the
// run was lost), and returns of ±1e308 made θ NaN, which its state could
// not be written with.
const (
	maxTaskSteps = 1 << 32
	maxReturn    = 1e100
)

// maxSteps is the most steps a task of kind k can take: its episodes
// (two for a direction, one for an evaluation) each end by the
// environment's time limit; maxTaskSteps for an environment whose limit
// the hub does not know (one only Python workers run).
func (t *Trainer) maxSteps(k TaskKind) int64 {
	h := int64(t.cfg.Spec.MaxEpisodeSteps)
	if h <= 0 {
		return maxTaskSteps
	}
	if k == KindDirection {
		h *= 2
	}
	return min(h, maxTaskSteps)
}

// ErrDiverged marks numbers that left the range a run can go on with: a
// result whose returns or observation statistics are non-finite or past
// the bounds (Trainer.Check), or an update that made θ (or the
// optimizer's state) non-finite (Trainer.Finish, which then keeps the
// previous θ). The errors also match errs.ErrInvalid; their text starts
// with "diverged: ".
var ErrDiverged = errors.New("diverged")

type divergedError struct{ msg string }

func (e *divergedError) Error() string { return "diverged: " + e.msg }

// Is makes errors.Is(e, ErrDiverged) and errors.Is(e, errs.ErrInvalid)
// true.
func (e *divergedError) Is(target error) bool {
	return target == ErrDiverged || target == errs.ErrInvalid
}

func diverged(format string, args ...any) error {
	return &divergedError{msg: fmt.Sprintf(format, args...)}
}

// sane reports whether v is a return a task may report: finite and
// within ±maxReturn.
func sane(v float64) bool { return finite(v) && math.Abs(v) <= maxReturn }

// Finish completes the current iteration with results in Tasks() order
// (each already passed Check). In order it: evaluates (mean and population
// std of the returns); stops at the target without updating θ (θ is the
// policy that reached it); otherwise applies Step, merges the directions'
// statistics in direction order, freezes the new filter and advances. When
// a budget runs out, one evaluation-only iteration follows unless θ was
// just evaluated. On a malformed results slice nothing changes; nor when
// the update would leave θ or the optimizer non-finite, which fails with
// ErrDiverged (θ is never made one no worker can decode).
func (t *Trainer) Finish(results []Result) (Report, error) {
	tasks := t.Tasks()
	if t.rep.Done {
		return t.rep, fmt.Errorf("%w: the run has ended", errs.ErrInvalid)
	}
	if len(results) != len(tasks) {
		return t.rep, fmt.Errorf("%w: %d results for %d tasks", errs.ErrInvalid, len(results), len(tasks))
	}
	for i := range tasks {
		if results[i].Task != tasks[i] {
			return t.rep, fmt.Errorf("%w: result %d is %v, want %v", errs.ErrInvalid, i, results[i].Task, tasks[i])
		}
		if err := t.Check(&results[i]); err != nil {
			return t.rep, err
		}
	}
	rep := t.rep
	rep.Iteration = t.iter
	rep.HasEval, rep.Updated, rep.Update, rep.IterSteps, rep.TrainMean, rep.Confirm = false, false, StepInfo{}, 0, 0, t.confirming
	n := t.cfg.Hyper.Directions
	var rplus, rminus []float64
	if !t.evalOnly && !t.confirming {
		rplus, rminus = make([]float64, n), make([]float64, n)
		var sum float64
		for _, r := range results[:n] {
			rplus[r.Index], rminus[r.Index] = r.RPlus, r.RMinus
			rep.IterSteps += r.Steps
			sum += r.RPlus + r.RMinus
		}
		rep.TrainMean = sum / float64(2*n)
		rep.Episodes += int64(2 * n)
	}
	if ne, _ := t.evalTasks(); ne > 0 {
		evals := results[len(results)-ne:]
		var sum float64
		for _, r := range evals {
			sum += r.Return
			rep.IterSteps += r.Steps
		}
		mean := sum / float64(len(evals))
		var ss float64
		for _, r := range evals {
			ss += float64((r.Return - mean) * (r.Return - mean))
		}
		rep.HasEval, rep.EvalMean, rep.EvalStd = true, mean, math.Sqrt(ss/float64(len(evals)))
		rep.EvalEpisodes += int64(len(evals))
	}
	rep.Steps += rep.IterSteps
	rep.PolicyEpisodes = t.rep.Episodes
	if t.confirming {
		rep.PolicyEpisodes = t.rep.PolicyEpisodes // the same θ as the evaluation it confirms
	}

	switch {
	case t.confirming:
		// The re-evaluation is the result, whatever it says.
		rep.Done, rep.Reason = true, "target"
	case rep.HasEval && t.cfg.UseTarget && rep.EvalMean >= t.cfg.Target && t.cfg.ConfirmEpisodes > 0:
		// Stop training; θ (unchanged) is evaluated once more on fresh
		// episodes under the same iteration number.
		t.confirming = true
	case rep.HasEval && t.cfg.UseTarget && rep.EvalMean >= t.cfg.Target:
		rep.Done, rep.Reason = true, "target"
	case t.evalOnly:
		rep.Done, rep.Reason = true, "budget"
	default:
		states := t.stats.Count
		for _, r := range results[:n] {
			states += r.Stats.Count
		}
		if states > maxRunStates {
			return t.rep, fmt.Errorf("%w: the run's filter statistics would pass %d states", errs.ErrInvalid, int64(maxRunStates))
		}
		// A step that leaves θ (or the optimizer) non-finite is refused:
		// θ, the optimizer and the statistics stay as they were.
		old := slices.Clone(t.theta)
		ost := optimState(t.opt)
		rep.Update = t.update(rplus, rminus, int64(t.iter))
		if err := t.checkUpdate(); err != nil {
			copy(t.theta, old)
			if ost != nil {
				if rerr := restoreOptim(t.opt, ost, len(t.theta)); rerr != nil {
					// Not expected (the state is the optimizer's own), and
					// not a reason to take the hub down: the run fails
					// with both reasons.
					err = errors.Join(err, fmt.Errorf("restoring the optimizer's state: %w", rerr))
				}
			}
			return t.rep, err
		}
		rep.Updated = true
		for _, r := range results[:n] {
			if err := t.stats.Merge(r.Stats); err != nil {
				panic(err) // unreachable: Check validated every result
			}
		}
		t.iter++
		t.freeze()
		if (t.cfg.MaxEpisodes > 0 && rep.Episodes+int64(2*n) > t.cfg.MaxEpisodes) ||
			(t.cfg.MaxIterations > 0 && t.iter >= uint64(t.cfg.MaxIterations)) {
			// The budget allows no further training iteration: evaluate
			// the new θ once more, then stop.
			t.evalOnly = true
		}
	}
	t.rep = rep
	return rep, nil
}

// checkUpdate refuses a θ or an optimizer state that left the finite
// range (ErrDiverged).
func (t *Trainer) checkUpdate() error {
	for i, v := range t.theta {
		if !finite(v) {
			return diverged("iteration %d's update made θ[%d] = %v (step size %g); θ stays at iteration %d's", t.iter, i, v, t.cfg.Hyper.StepSize, t.iter)
		}
	}
	if t.opt != nil {
		sd, _ := t.opt.State()
		for _, ts := range sd.Tensors() {
			f, _ := ts.Float32s()
			for i, v := range f {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return diverged("iteration %d's update made the optimizer's %s[%d] = %v; θ stays at iteration %d's", t.iter, ts.Name, i, v, t.iter)
				}
			}
		}
	}
	return nil
}

// TrainerState is everything a Trainer holds between iterations: with the
// Config it was made from, RestoreTrainer rebuilds a trainer that
// continues exactly as this one would (the filter is derived from Stats).
// The slices are copies owned by whoever holds the state.
type TrainerState struct {
	Iter     uint64    `json:"iter"`
	Theta    []float64 `json:"theta"`
	Stats    *Stats    `json:"stats"`
	EvalOnly bool      `json:"eval_only"`
	Confirm  bool      `json:"confirming,omitempty"`
	Last     Report    `json:"last"`
	// Optim is the optimizer's state (nil for the paper's step): it has
	// taken Iter steps.
	Optim *OptimState `json:"optim,omitempty"`
}

// State returns a copy of the trainer's state after its last finished
// iteration (before any results of the current one).
func (t *Trainer) State() TrainerState {
	return TrainerState{Iter: t.iter, Theta: append([]float64(nil), t.theta...), Stats: t.stats.Clone(), EvalOnly: t.evalOnly, Confirm: t.confirming, Last: t.rep, Optim: optimState(t.opt)}
}

// RestoreTrainer rebuilds a trainer from cfg and a State taken from a
// trainer made with the same cfg. It validates the state's shapes and
// values (it may come from a file) and wraps errs.ErrInvalid.
func RestoreTrainer(cfg Config, st TrainerState) (*Trainer, error) {
	t, err := NewTrainer(cfg)
	if err != nil {
		return nil, err
	}
	if len(st.Theta) != len(t.theta) {
		return nil, fmt.Errorf("%w: restored θ has %d parameters, the run's architecture %d", errs.ErrInvalid, len(st.Theta), len(t.theta))
	}
	for i, v := range st.Theta {
		if !finite(v) {
			return nil, fmt.Errorf("%w: restored θ[%d] = %v", errs.ErrInvalid, i, v)
		}
	}
	if st.Stats == nil {
		return nil, fmt.Errorf("%w: restored state without filter statistics", errs.ErrInvalid)
	}
	if err := st.Stats.check(cfg.Spec.ObsDim, runStats); err != nil {
		return nil, err
	}
	if st.Last.Episodes < 0 || st.Last.Steps < 0 || st.Last.EvalEpisodes < 0 {
		return nil, fmt.Errorf("%w: restored counters are negative", errs.ErrInvalid)
	}
	switch {
	case t.opt == nil && st.Optim != nil:
		return nil, fmt.Errorf("%w: restored state holds an optimizer; the run takes the paper's step", errs.ErrInvalid)
	case t.opt != nil && st.Optim == nil && st.Iter > 0:
		return nil, fmt.Errorf("%w: restored state at iteration %d has no optimizer state for %s", errs.ErrInvalid, st.Iter, t.cfg.Update.Optimizer.Kind)
	case t.opt != nil && st.Optim != nil:
		if err := restoreOptim(t.opt, st.Optim, len(t.theta)); err != nil {
			return nil, err
		}
		if uint64(t.opt.Steps()) != st.Iter {
			return nil, fmt.Errorf("%w: restored optimizer took %d steps, the run is at iteration %d", errs.ErrInvalid, t.opt.Steps(), st.Iter)
		}
	}
	t.iter, t.evalOnly, t.confirming, t.rep = st.Iter, st.EvalOnly, st.Confirm, st.Last
	copy(t.theta, st.Theta)
	t.stats = st.Stats.Clone()
	t.freeze()
	return t, nil
}
