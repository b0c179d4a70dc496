package arsrpc

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim/optimpb"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// coordinator is the pure state of every run and worker on a hub: task
// leases, results, and the ars.Trainer of each run. It has no goroutines
// and reads no clock (callers pass now); the Service's mutex guards it.
type coordinator struct {
	leaseTTL, straggle time.Duration
	maxHolders         int
	maxParams          int64 // bound on a run's policy parameters; 0: none
	maxEnded           int   // bound on len(ended); at least 1

	workers   map[string]*worker
	runs      map[string]*run // the live runs and the ended ones kept (ended)
	byRequest map[string]*run // StartRun idempotency keys of the runs in runs
	order     []*run          // live runs in start order: leases serve the oldest first
	// ended holds the newest maxEnded ended runs (done, failed or
	// stopped), oldest first: what WatchRun, StopRun, Stats and a StartRun
	// retry ask about them is answered from memory. An older one is
	// forgotten (Service answers it from DataDir, if any), so a
	// long-lived hub running thousands of short runs holds, and scans,
	// no more.
	ended      []*run
	nextWorker uint64
	nextRun    uint64
	// boot tells this coordinator's worker ids from an earlier hub
	// process's (a worker that outlived a restart must attach again).
	boot string
	// reassigned counts leases of a task someone else held before (after
	// its lease expired or its worker left, or as a straggler duplicate).
	reassigned int64
}

type worker struct {
	id, name string
	seen     time.Time
	// owner is the name of the token that attached it ("" without
	// tokens): only that token may lease, report or detach as it.
	owner string
}

type lease struct {
	worker string
	at     time.Time
}

type run struct {
	id, model string
	num       uint64         // N of run-N
	spec      *pb.ARSRunSpec // normalised: every default filled in
	requestID string         // the StartRun idempotency key ("" for none)
	tr        *ars.Trainer
	started   time.Time
	version   uint64 // store version of the current θ
	done      bool

	// The current iteration.
	tasks      []ars.Task
	pos        map[ars.Task]int
	results    []ars.Result
	have       []bool
	remaining  int
	leases     [][]lease // per task: who holds it since when
	leasedOnce []bool    // per task: leased at least once

	progress []*pb.ARSProgress // one per finished iteration
	logged   int               // progress entries already on disk (persister)
	// hasTrain, trainMean: the last finished iteration's mean shifted ±δ
	// return (iterations without directions leave it); read by Stats.
	hasTrain  bool
	trainMean float64
	// curve: the evaluations so far, oldest first, the newest
	// MaxCurvePoints at least (compacted as it grows); kept as progress
	// arrives so that Stats copies no more than a slice header per run.
	curve []CurvePoint
}

// addProgress appends p to r's progress and its evaluation to the curve.
func (r *run) addProgress(p *pb.ARSProgress) {
	r.progress = append(r.progress, p)
	if !p.HasEval {
		return
	}
	if len(r.curve) >= 2*MaxCurvePoints { // a fresh array: readers keep theirs
		r.curve = slices.Clone(r.curve[len(r.curve)-MaxCurvePoints+1:])
	}
	r.curve = append(r.curve, CurvePoint{Iteration: p.Iteration, Episodes: p.PolicyEpisodes, Steps: p.Steps,
		Elapsed: time.Duration(p.ElapsedSeconds * float64(time.Second)), EvalMean: p.EvalMean, EvalStd: p.EvalStd})
}

// withMaxParams bounds the policy size of every later run (0: none).
func (c *coordinator) withMaxParams(n int64) *coordinator {
	c.maxParams = n
	return c
}

// withMaxEnded bounds the ended runs kept in memory (at least 1: the run
// a report just ended is still read by the Service).
func (c *coordinator) withMaxEnded(n int) *coordinator {
	c.maxEnded = max(n, 1)
	return c
}

// policyParams counts the parameters of cfg's policy: a weight matrix and
// a bias per layer, obs → hidden… → outputs (an upper bound for a policy
// without biases). It saturates instead of overflowing.
func policyParams(cfg ars.Config) int64 {
	out := cfg.Spec.ActDim
	if cfg.Spec.Discrete > 0 {
		out = cfg.Spec.Discrete
	}
	dims := append(append([]int{cfg.Spec.ObsDim}, cfg.Hidden...), out)
	var n int64
	for i := 1; i < len(dims); i++ {
		a, b := int64(max(dims[i-1], 0)), int64(max(dims[i], 0))
		if a > 1<<31 || b > 1<<31 {
			return math.MaxInt64
		}
		n += a*b + b
		if n < 0 || n > 1<<62 {
			return math.MaxInt64
		}
	}
	return n
}

func newCoordinator(leaseTTL, straggle time.Duration, maxHolders int, boot string) *coordinator {
	return &coordinator{leaseTTL: leaseTTL, straggle: straggle, maxHolders: maxHolders, boot: boot, maxEnded: DefaultMaxEndedRuns,
		workers: map[string]*worker{}, runs: map[string]*run{}, byRequest: map[string]*run{}}
}

// Evaluation protocols (ARSRunSpec.protocol).
const (
	// ProtocolPaper evaluates every PaperEvalEvery iterations over
	// PaperEvalEpisodes episodes (filter frozen, shift 0), as Mania, Guy &
	// Recht's code does; the default.
	ProtocolPaper = "paper"
	// ProtocolFast takes ars.EnvDefaults' evaluation cadence: fewer,
	// smaller evaluations, an optimistic stopping rule.
	ProtocolFast = "fast"

	PaperEvalEvery    = 10
	PaperEvalEpisodes = 100
	// DefaultConfirmEpisodes is the size of the re-evaluation on fresh
	// episodes after a run stops at its target.
	DefaultConfirmEpisodes = 100
)

// truncate bounds text from the network before it goes into an error.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Normalise fills a spec's zero fields with the environment's defaults
// (ars.EnvDefaults) and builds the trainer configuration, exactly as the
// hub does on StartRun; clients call it to fail early. Errors wrap
// errs.ErrInvalid; in is not modified.
func Normalise(in *pb.ARSRunSpec) (*pb.ARSRunSpec, ars.Config, error) {
	if in == nil {
		return nil, ars.Config{}, fmt.Errorf("%w: missing run spec", errs.ErrInvalid)
	}
	espec, err := envSpec(in)
	if err != nil {
		return nil, ars.Config{}, err
	}
	d := ars.EnvDefaults(in.Env)
	s := &pb.ARSRunSpec{
		Env: in.Env, Seed: in.Seed, Version: in.Version, Directions: in.Directions, Top: in.Top,
		StepSize: in.StepSize, Noise: in.Noise, Shift: in.Shift, Hidden: in.Hidden,
		EvalEvery: in.EvalEvery, EvalEpisodes: in.EvalEpisodes, UseTarget: in.UseTarget, Target: in.Target,
		MaxEpisodes: in.MaxEpisodes, MaxIterations: in.MaxIterations, EnvSpec: in.EnvSpec,
		Protocol: in.Protocol, ConfirmEpisodes: in.ConfirmEpisodes, GradientMax: in.GradientMax,
	}
	if s.Version == "" {
		s.Version = d.Hyper.Version.String()
	}
	v, err := ars.ParseVersion(s.Version)
	if err != nil {
		return nil, ars.Config{}, err
	}
	if s.Directions == 0 {
		s.Directions = uint32(d.Hyper.Directions)
		if s.Top == 0 && v.Truncates() {
			s.Top = uint32(d.Hyper.Top) // 0 (all) when the default keeps all
		}
	}
	if s.StepSize == 0 {
		s.StepSize = d.Hyper.StepSize
	}
	if s.Noise == 0 {
		s.Noise = d.Hyper.Noise
	}
	if s.Shift == 0 {
		s.Shift = d.Hyper.Shift // a zero shift is "unset" on the wire
	}
	// The evaluation protocol: the paper's (every 10 iterations, 100
	// episodes, as the ARS authors' code) unless "fast" asks for the
	// per-environment defaults; explicit values override either.
	every, episodes := uint32(PaperEvalEvery), uint32(PaperEvalEpisodes)
	switch s.Protocol {
	case "":
		s.Protocol = ProtocolPaper
	case ProtocolPaper:
	case ProtocolFast:
		every, episodes = uint32(d.EvalEvery), uint32(d.EvalEpisodes)
	default:
		return nil, ars.Config{}, fmt.Errorf("%w: evaluation protocol %q: want %q or %q", errs.ErrInvalid, truncate(s.Protocol, 32), ProtocolPaper, ProtocolFast)
	}
	if s.EvalEvery == 0 {
		s.EvalEvery = every
	}
	if s.EvalEpisodes == 0 {
		s.EvalEpisodes = episodes
	}
	if s.ConfirmEpisodes == 0 {
		s.ConfirmEpisodes = DefaultConfirmEpisodes
	}
	if s.ConfirmEpisodes > 1<<20 {
		return nil, ars.Config{}, fmt.Errorf("%w: confirm episodes %d above 2^20", errs.ErrInvalid, s.ConfirmEpisodes)
	}
	if s.MaxEpisodes == 0 && s.MaxIterations == 0 {
		s.MaxEpisodes = d.MaxEpisodes
	}
	cfg := ars.Config{
		Env: s.Env, Spec: espec, Seed: s.Seed,
		Hyper: ars.Hyper{Version: v, Directions: int(s.Directions), Top: int(s.Top),
			StepSize: s.StepSize, Noise: s.Noise, Shift: s.Shift},
		EvalEvery: int(s.EvalEvery), EvalEpisodes: int(s.EvalEpisodes),
		UseTarget: s.UseTarget, Target: s.Target, ConfirmEpisodes: int(s.ConfirmEpisodes),
		MaxEpisodes: s.MaxEpisodes, MaxIterations: int(s.MaxIterations),
		Update: ars.Update{Optimizer: optimpb.FromProto(in.Optimizer), GradientMax: in.GradientMax},
	}
	for _, h := range s.Hidden {
		cfg.Hidden = append(cfg.Hidden, int(h))
	}
	if err := cfg.Validate(); err != nil {
		return nil, ars.Config{}, err
	}
	s.Top = uint32(cfg.Hyper.Top)
	// The optimizer with its defaults filled in; lr stays 0 on the wire
	// (step_size is the learning rate).
	o := cfg.Update.Optimizer
	o.LR = 0
	s.Optimizer = optimpb.ToProto(o)
	return s, cfg, nil
}

// envSpec returns the spaces of a run's environment: the built-in one's
// (an env_spec given with it must match), or for an environment the hub
// cannot make (served by Python workers on Gymnasium) the spec's env_spec.
func envSpec(in *pb.ARSRunSpec) (env.Spec, error) {
	x := in.GetEnvSpec()
	e, err := env.Make(in.Env)
	if err == nil {
		defer env.Close(e) // made for its spec only
		s := e.Spec()
		if x != nil && len(x.ObsKeys) > 0 && !ars.SameObsKeys(obsKeys(x), s.ObsKeys) {
			return env.Spec{}, fmt.Errorf("%w: env_spec's observation keys do not match built-in %s's %v", errs.ErrInvalid, in.Env, s.ObsKeys)
		}
		if x != nil && (int(x.ObsDim) != s.ObsDim || int(x.Discrete) != s.Discrete || int(x.ActDim) != s.ActDim) {
			return env.Spec{}, fmt.Errorf("%w: env_spec (obs %d, discrete %d, act %d) does not match built-in %s (obs %d, discrete %d, act %d)",
				errs.ErrInvalid, x.ObsDim, x.Discrete, x.ActDim, in.Env, s.ObsDim, s.Discrete, s.ActDim)
		}
		return s, nil
	}
	if x == nil {
		return env.Spec{}, fmt.Errorf("%w: %v; an environment only Python workers run needs env_spec (its spaces)", errs.ErrInvalid, err)
	}
	const maxDim = 1 << 16 // as ars.PolicyFromStateDict
	if in.Env == "" || x.ObsDim < 1 || x.ObsDim > maxDim || x.Discrete > maxDim || x.ActDim > maxDim ||
		(x.Discrete > 0) == (x.ActDim > 0) {
		return env.Spec{}, fmt.Errorf("%w: environment %q with env_spec obs %d, discrete %d, act %d: need a name, 1 ≤ obs ≤ %d and exactly one of discrete, act in [1, %d]",
			errs.ErrInvalid, in.Env, x.ObsDim, x.Discrete, x.ActDim, maxDim, maxDim)
	}
	if len(x.ObsKeys) > ars.MaxObsKeys {
		return env.Spec{}, fmt.Errorf("%w: env_spec has %d observation keys, at most %d", errs.ErrInvalid, len(x.ObsKeys), ars.MaxObsKeys)
	}
	keys := obsKeys(x)
	if err := ars.ValidateObsKeys(keys, int(x.ObsDim)); err != nil {
		return env.Spec{}, err
	}
	return env.Spec{Name: in.Env, ObsDim: int(x.ObsDim), Discrete: int(x.Discrete), ActDim: int(x.ActDim), ObsKeys: keys}, nil
}

// obsKeys converts a Dict space's keys from the wire.
func obsKeys(x *pb.ARSEnvSpec) []env.ObsKey {
	var out []env.ObsKey
	for _, k := range x.GetObsKeys() {
		out = append(out, env.ObsKey{Name: k.GetName(), Dim: int(k.GetDim())})
	}
	return out
}

// prepareRun validates spec and builds a run named by the next run number,
// without adding it; the caller publishes the returned θ_0 blob and then
// calls addRun (or discards the run when the name is taken).
func (c *coordinator) prepareRun(spec *pb.ARSRunSpec, now time.Time) (*run, []byte, error) {
	s, cfg, err := Normalise(spec)
	if err != nil {
		return nil, nil, err
	}
	if n := policyParams(cfg); c.maxParams > 0 && n > c.maxParams {
		return nil, nil, fmt.Errorf("%w: a policy of %d parameters (obs %d, hidden %v) exceeds this hub's limit of %d (rlhub serve --max-policy-params)",
			errs.ErrInvalid, n, cfg.Spec.ObsDim, cfg.Hidden, c.maxParams)
	}
	tr, err := ars.NewTrainer(cfg)
	if err != nil {
		return nil, nil, err
	}
	c.nextRun++
	id := fmt.Sprintf("run-%d", c.nextRun)
	r := &run{id: id, num: c.nextRun, model: "ars/" + id, spec: s, tr: tr, started: now, version: 1}
	blob, err := tr.PolicyOf().Encode()
	if err != nil {
		return nil, nil, err
	}
	return r, blob, nil
}

func (c *coordinator) addRun(r *run) {
	c.runs[r.id] = r
	if r.requestID != "" {
		c.byRequest[r.requestID] = r
	}
	if r.done { // restored ended
		c.keepEnded(r)
		return
	}
	c.order = append(c.order, r)
	r.startIteration()
}

// retire moves r, just ended, from the live runs to the ended ones kept.
func (c *coordinator) retire(r *run) {
	if i := slices.Index(c.order, r); i >= 0 {
		c.order = slices.Delete(c.order, i, i+1)
	}
	c.keepEnded(r)
}

// keepEnded adds r to the ended runs kept and forgets the oldest beyond
// maxEnded.
func (c *coordinator) keepEnded(r *run) {
	c.ended = append(c.ended, r)
	if n := len(c.ended) - c.maxEnded; n > 0 {
		for _, old := range c.ended[:n] {
			delete(c.runs, old.id)
			if c.byRequest[old.requestID] == old {
				delete(c.byRequest, old.requestID)
			}
		}
		c.ended = slices.Delete(c.ended, 0, n) // clears the tail: no stale pointers
	}
}

// forgotten reports whether runID names a run this coordinator numbered
// (started, or found on disk) but no longer keeps: an ended run
// keepEnded dropped, or one whose state could not be read.
func (c *coordinator) forgotten(runID string) bool {
	m := runDirName.FindStringSubmatch(runID)
	if m == nil {
		return false
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	_, kept := c.runs[runID]
	return err == nil && n <= c.nextRun && !kept
}

// end marks r done and drops what only a live run needs: its trainer (θ,
// the observation statistics, the noise) and the iteration's tasks and
// results. What stays is the spec, the progress log and the store's
// versions, so a stopped run holds no policy-sized memory.
func (r *run) end() {
	r.done = true
	r.tr = nil
	r.tasks, r.pos, r.results, r.have, r.leases, r.leasedOnce = nil, nil, nil, nil, nil, nil
}

// released reports whether end dropped r's trainer (tests).
func (r *run) released() bool { return r.tr == nil }

func (r *run) startIteration() {
	r.tasks = r.tr.Tasks()
	r.pos = make(map[ars.Task]int, len(r.tasks))
	for i, t := range r.tasks {
		r.pos[t] = i
	}
	r.results = make([]ars.Result, len(r.tasks))
	r.have = make([]bool, len(r.tasks))
	r.leases = make([][]lease, len(r.tasks))
	r.leasedOnce = make([]bool, len(r.tasks))
	r.remaining = len(r.tasks)
}

func (c *coordinator) attach(name string, now time.Time) *worker {
	c.nextWorker++
	w := &worker{id: fmt.Sprintf("w%d%s", c.nextWorker, c.boot), name: name, seen: now}
	c.workers[w.id] = w
	return w
}

// detach forgets a worker and releases its leases at once.
func (c *coordinator) detach(id string) {
	delete(c.workers, id)
	for _, r := range c.order {
		for i, ls := range r.leases {
			r.leases[i] = dropWorker(ls, id)
		}
	}
}

func dropWorker(ls []lease, id string) []lease {
	out := ls[:0]
	for _, l := range ls {
		if l.worker != id {
			out = append(out, l)
		}
	}
	return out
}

// expire forgets workers silent for a lease TTL and drops expired leases.
func (c *coordinator) expire(now time.Time) {
	for id, w := range c.workers {
		if now.Sub(w.seen) > c.leaseTTL {
			c.detach(id)
		}
	}
	for _, r := range c.order {
		for i, ls := range r.leases {
			out := ls[:0]
			for _, l := range ls {
				if now.Sub(l.at) <= c.leaseTTL {
					out = append(out, l)
				}
			}
			r.leases[i] = out
		}
	}
}

// nextEvent is the earliest time at which expiry or the straggler rule can
// change what lease would return (zero when nothing is outstanding).
func (c *coordinator) nextEvent() time.Time {
	var t time.Time
	earliest := func(u time.Time) {
		if t.IsZero() || u.Before(t) {
			t = u
		}
	}
	for _, w := range c.workers {
		earliest(w.seen.Add(c.leaseTTL))
	}
	for _, r := range c.order {
		if r.done {
			continue
		}
		for i, ls := range r.leases {
			if r.have[i] {
				continue
			}
			for _, l := range ls {
				earliest(l.at.Add(c.straggle))
				earliest(l.at.Add(c.leaseTTL))
			}
		}
	}
	return t
}

var errNoWorker = fmt.Errorf("%w: unknown worker (attach again)", errs.ErrNotFound)

// lease hands worker id up to maxTasks tasks of the oldest run with work: first
// tasks nobody holds, in task order; when none are left, tasks whose every
// holder has had them longer than the straggler threshold (at most
// maxHolders holders each). Runs named in skip are passed over. A share is
// at most ⌈tasks / (2·workers)⌉ so
// every live worker gets some. It returns nil when there is nothing to do.
func (c *coordinator) lease(id string, maxTasks int, skip []string, now time.Time) (*run, []ars.Task, error) {
	w, ok := c.workers[id]
	if !ok {
		return nil, nil, errNoWorker
	}
	w.seen = now
	c.expire(now)
	if maxTasks < 1 {
		maxTasks = 1
	}
	for _, r := range c.order {
		if r.done || slices.Contains(skip, r.id) {
			continue
		}
		share := (len(r.tasks) + 2*len(c.workers) - 1) / (2 * len(c.workers))
		n := min(maxTasks, max(share, 1))
		var got []ars.Task
		for i := range r.tasks {
			if len(got) == n {
				break
			}
			if !r.have[i] && len(r.leases[i]) == 0 {
				if r.leasedOnce[i] {
					c.reassigned++
				}
				r.leases[i] = append(r.leases[i], lease{id, now})
				r.leasedOnce[i] = true
				got = append(got, r.tasks[i])
			}
		}
		for i := range r.tasks {
			if len(got) == n {
				break
			}
			if r.have[i] || len(r.leases[i]) == 0 || len(r.leases[i]) >= c.maxHolders {
				continue
			}
			straggling := true
			for _, l := range r.leases[i] {
				if l.worker == id || now.Sub(l.at) < c.straggle {
					straggling = false
				}
			}
			if straggling {
				c.reassigned++
				r.leases[i] = append(r.leases[i], lease{id, now})
				got = append(got, r.tasks[i])
			}
		}
		if len(got) > 0 {
			return r, got, nil
		}
	}
	return nil, nil, nil
}

// publish is a version the caller must push to the store.
type publish struct {
	model   string
	version uint64
	blob    []byte
}

type reportOutcome struct {
	accepted, duplicates, stale int
	pub                         *publish // non-nil when a new version must be pushed
	finished                    bool     // an iteration finished, or the run failed
}

// report records results from a worker. All results are validated before
// any is applied: one bad result rejects the request and changes nothing,
// except that a result whose values diverged (ars.ErrDiverged: returns or
// statistics non-finite or past the bounds) ends the run, failed with that
// reason, and the request is answered as stale; unless the task is done
// already: such a result is a duplicate.
// Results for another iteration are stale; results for a task already
// done are duplicates; both are counted and ignored. Workers unknown to
// the hub (expired) may still report: a result is a deterministic function
// of its task, whoever computed it. A worker attached to another hub
// process may not (errNoWorker): the run it computed for may be another
// run of the same id, on a hub that kept no state.
func (c *coordinator) report(id, runID string, iter uint64, in []*pb.ARSTaskResult, now time.Time) (reportOutcome, error) {
	var out reportOutcome
	if w, ok := c.workers[id]; ok {
		w.seen = now
	} else if !strings.HasSuffix(id, c.boot) {
		return out, errNoWorker
	}
	r, ok := c.runs[runID]
	if !ok && c.forgotten(runID) {
		out.stale = len(in) // a late report of a run that ended long ago
		return out, nil
	}
	if !ok {
		return out, fmt.Errorf("%w: run %s", errs.ErrNotFound, errs.Quote(runID))
	}
	if r.done || iter != r.tr.Iter() {
		out.stale = len(in)
		return out, nil
	}
	res := make([]ars.Result, 0, len(in))
	var diverged error // the first result whose values diverged
	for _, p := range in {
		x, err := fromPB(p)
		if err != nil {
			return reportOutcome{}, err
		}
		if _, ok := r.pos[x.Task]; !ok {
			if r.tr.Confirming() && x.Index < ars.ConfirmBase {
				// A late result of the iteration the re-evaluation
				// confirms (it has the same number).
				out.stale++
				continue
			}
			return reportOutcome{}, fmt.Errorf("%w: iteration %d has no task %v %d", errs.ErrInvalid, iter, x.Kind, x.Index)
		}
		if err := r.tr.Check(&x); err != nil {
			if errors.Is(err, ars.ErrDiverged) {
				if r.have[r.pos[x.Task]] {
					// A late duplicate contradicting the finite result
					// already taken: ignored like any duplicate.
					out.duplicates++
					continue
				}
				// Values past the bounds: the task is deterministic, so
				// whoever computes it gets the same. The run ends here
				// (below) rather than refusing a report no worker can
				// ever get accepted.
				if diverged == nil {
					diverged = err
				}
				continue
			}
			return reportOutcome{}, err
		}
		res = append(res, x)
	}
	if diverged != nil {
		c.fail(r, diverged, now)
		out.stale, out.finished = len(in), true
		return out, nil
	}
	for _, x := range res {
		i := r.pos[x.Task]
		if r.have[i] {
			out.duplicates++
			continue
		}
		r.have[i], r.results[i], r.leases[i] = true, x, nil
		r.remaining--
		out.accepted++
	}
	if r.remaining == 0 {
		out.finished = true
		pub, err := r.finish(now)
		if err != nil {
			c.fail(r, err, now)
			return out, nil
		}
		if r.done {
			c.retire(r)
		}
		out.pub = pub
	}
	return out, nil
}

// fromPB converts a result from the wire; Trainer.Check validates the
// values (including the statistics' dimensions).
func fromPB(p *pb.ARSTaskResult) (ars.Result, error) {
	var r ars.Result
	if p.GetTask() == nil {
		return r, fmt.Errorf("%w: result without a task", errs.ErrInvalid)
	}
	switch p.Task.Kind {
	case pb.ARSTaskKind_ARS_TASK_KIND_DIRECTION:
		r.Kind = ars.KindDirection
	case pb.ARSTaskKind_ARS_TASK_KIND_EVAL:
		r.Kind = ars.KindEval
	default:
		return r, fmt.Errorf("%w: task kind %v", errs.ErrInvalid, p.Task.Kind)
	}
	if p.Task.Index > math.MaxInt32 {
		return r, fmt.Errorf("%w: task index %d", errs.ErrInvalid, p.Task.Index)
	}
	r.Index = int(p.Task.Index)
	r.RPlus, r.RMinus, r.Return, r.Steps = p.RPlus, p.RMinus, p.Return, p.Steps
	if s := p.GetStats(); s != nil {
		r.Stats = &ars.Stats{Count: s.Count, Mean: s.Mean, M2: s.M2}
	}
	return r, nil
}

func toPB(r ars.Result) *pb.ARSTaskResult {
	k := pb.ARSTaskKind_ARS_TASK_KIND_DIRECTION
	if r.Kind == ars.KindEval {
		k = pb.ARSTaskKind_ARS_TASK_KIND_EVAL
	}
	p := &pb.ARSTaskResult{Task: &pb.ARSTask{Kind: k, Index: uint32(r.Index)}, RPlus: r.RPlus, RMinus: r.RMinus, Return: r.Return, Steps: r.Steps}
	if r.Stats != nil {
		p.Stats = &pb.ARSFilterStats{Count: r.Stats.Count, Mean: r.Stats.Mean, M2: r.Stats.M2}
	}
	return p
}

func taskPB(t ars.Task) *pb.ARSTask {
	k := pb.ARSTaskKind_ARS_TASK_KIND_DIRECTION
	if t.Kind == ars.KindEval {
		k = pb.ARSTaskKind_ARS_TASK_KIND_EVAL
	}
	return &pb.ARSTask{Kind: k, Index: uint32(t.Index)}
}

// finish completes the current iteration and, unless the run ended,
// starts the next. It returns the version to publish when θ moved.
func (r *run) finish(now time.Time) (*publish, error) {
	rep, err := r.tr.Finish(r.results)
	if err != nil {
		return nil, err
	}
	if m, ok := trainMean(r.results); ok {
		r.hasTrain, r.trainMean = true, m
	}
	var pub *publish
	if rep.Updated {
		blob, err := r.tr.PolicyOf().Encode()
		if err != nil {
			return nil, err
		}
		r.version++
		pub = &publish{model: r.model, version: r.version, blob: blob}
	}
	r.addProgress(&pb.ARSProgress{
		RunId: r.id, Iteration: rep.Iteration, Version: r.version, Episodes: rep.Episodes,
		EvalEpisodes: rep.EvalEpisodes, Steps: rep.Steps, IterationSteps: rep.IterSteps,
		HasEval: rep.HasEval, EvalMean: rep.EvalMean, EvalStd: rep.EvalStd, SigmaR: rep.Update.SigmaR,
		Done: rep.Done, Reason: rep.Reason, Model: r.model, ElapsedSeconds: now.Sub(r.started).Seconds(),
		PolicyEpisodes: rep.PolicyEpisodes, TrainReturn: rep.TrainMean, Confirm: rep.Confirm,
	})
	if rep.Done {
		r.end()
		return pub, nil
	}
	r.startIteration()
	return pub, nil
}

// fail ends a run with an error reason.
func (c *coordinator) fail(r *run, err error, now time.Time) {
	if r.done {
		return
	}
	last, iter := r.tr.Last(), r.tr.Iter()
	r.end()
	c.retire(r)
	r.addProgress(&pb.ARSProgress{
		RunId: r.id, Iteration: iter, Version: r.version, Episodes: last.Episodes,
		EvalEpisodes: last.EvalEpisodes, Steps: last.Steps, Done: true, Reason: err.Error(),
		Model: r.model, ElapsedSeconds: now.Sub(r.started).Seconds(),
	})
}
