package arsrpc

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
)

// Stats is the ARS coordinator's one picture: every run it keeps (the
// live ones and the newest Config.MaxEndedRuns ended ones) with its
// progress and evaluation curve, and the workers attached. The metrics adapter and
// the dashboard read it.
type Stats struct {
	// Runs in start order.
	Runs []RunStats
	// Workers attached now.
	Workers int
	// Reassigned counts leases of a task someone else held before.
	Reassigned int64
}

// RunStats is one run.
type RunStats struct {
	ID, Env, Model string
	// Iteration is the number of finished iterations; Version the store
	// version of the current policy.
	Iteration, Version uint64
	// Episodes (training), EvalEpisodes and Steps (environment steps,
	// training and evaluation) so far.
	Episodes, EvalEpisodes, Steps int64
	// Elapsed is hub time since the run started (until it ended, for a
	// finished run).
	Elapsed time.Duration
	// HasEval tells whether EvalMean/EvalStd hold the last evaluation.
	HasEval           bool
	EvalMean, EvalStd float64
	// TrainMean is the mean shifted return of the last iteration's ±δ
	// episodes (ars.Result.RPlus and RMinus); HasTrain says there is one.
	HasTrain  bool
	TrainMean float64
	// Done and Reason: the run ended and why.
	Done   bool
	Reason string
	// Curve holds the evaluations, oldest first: at most MaxCurvePoints,
	// the newest kept.
	Curve []CurvePoint
}

// CurvePoint is one evaluation of a run's policy.
type CurvePoint struct {
	Iteration uint64
	Episodes  int64 // training episodes that produced the evaluated policy
	Steps     int64
	Elapsed   time.Duration
	EvalMean  float64
	EvalStd   float64
}

// MaxCurvePoints bounds RunStats.Curve.
const MaxCurvePoints = 2000

// Stats returns the progress and curve of every run kept. It holds the
// coordinator lock for O(runs kept): each run's curve is kept as progress
// arrives, and RunStats.Curve shares it (read-only, clipped).
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.c
	now := s.cfg.Now()
	kept := slices.SortedFunc(maps.Values(c.runs), func(a, b *run) int { return cmp.Compare(a.num, b.num) })
	st := Stats{Reassigned: c.reassigned, Runs: make([]RunStats, 0, len(kept))}
	for _, w := range c.workers {
		// Workers are forgotten when someone leases; until then, one
		// silent for a lease TTL is not attached.
		if now.Sub(w.seen) <= c.leaseTTL {
			st.Workers++
		}
	}
	for _, r := range kept {
		rs := RunStats{ID: r.id, Env: r.spec.GetEnv(), Model: r.model, Version: r.version}
		if n := len(r.progress); n > 0 {
			p := r.progress[n-1]
			rs.Iteration = p.Iteration + 1
			rs.Episodes, rs.EvalEpisodes, rs.Steps = p.Episodes, p.EvalEpisodes, p.Steps
			rs.Elapsed = time.Duration(p.ElapsedSeconds * float64(time.Second))
			rs.Done, rs.Reason = p.Done, p.Reason
		}
		if !rs.Done {
			rs.Elapsed = now.Sub(r.started)
		}
		rs.HasTrain, rs.TrainMean = r.hasTrain, r.trainMean
		if n := len(r.curve); n > 0 {
			last := r.curve[n-1]
			rs.HasEval, rs.EvalMean, rs.EvalStd = true, last.EvalMean, last.EvalStd
			rs.Curve = slices.Clip(r.curve[max(0, n-MaxCurvePoints):])
		}
		st.Runs = append(st.Runs, rs)
	}
	return st
}

// trainMean is the mean of the direction tasks' shifted returns, and
// whether there were any.
func trainMean(results []ars.Result) (float64, bool) {
	var sum float64
	n := 0
	for _, r := range results {
		if r.Kind == ars.KindDirection {
			sum += r.RPlus + r.RMinus
			n += 2
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// WorkerCounters are a worker's counters while it runs (WorkerConfig.Live):
// atomics the metrics adapter reads at scrape time.
type WorkerCounters struct {
	Tasks, Steps, Pulls atomic.Int64
	// Iteration is the iteration of the last lease.
	Iteration atomic.Uint64
}
