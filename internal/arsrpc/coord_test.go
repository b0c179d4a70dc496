package arsrpc

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testSpec() *pb.ARSRunSpec {
	return &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 5, Version: "V2-t", Directions: 4, Top: 2,
		StepSize: 0.02, Noise: 0.03, EvalEvery: 2, EvalEpisodes: 2, MaxIterations: 3}
}

func newTestRun(t *testing.T, c *coordinator) *run {
	t.Helper()
	r, blob, err := c.prepareRun(testSpec(), t0)
	if err != nil || len(blob) == 0 {
		t.Fatal(err)
	}
	c.addRun(r)
	return r
}

// compute runs tasks the way a worker does.
func compute(t *testing.T, r *run, tasks []ars.Task) []*pb.ARSTaskResult {
	t.Helper()
	e, _ := env.Make(r.spec.Env)
	arch := r.tr.Arch()
	ev := ars.NewEvaluator(e, &arch)
	var out []*pb.ARSTaskResult
	for _, task := range tasks {
		out = append(out, toPB(ev.Run(r.tr.Current(), task)))
	}
	return out
}

func TestLeaseSharesExpiryAndStragglers(t *testing.T) {
	c := newCoordinator(10*time.Second, 2*time.Second, 2, "")
	r := newTestRun(t, c)
	a, b := c.attach("a", t0), c.attach("b", t0)
	// 6 tasks (4 directions, 2 evals), 2 workers: shares of ⌈6/4⌉ = 2.
	_, ga, _ := c.lease(a.id, 8, nil, t0)
	_, gb, _ := c.lease(b.id, 8, nil, t0)
	if len(ga) != 2 || len(gb) != 2 || ga[0] != (ars.Task{Kind: ars.KindDirection, Index: 0}) || gb[0].Index != 2 {
		t.Fatalf("leases %v / %v", ga, gb)
	}
	// b finishes its tasks; a is slow.
	if out, err := c.report(b.id, r.id, 0, compute(t, r, gb), t0.Add(time.Second)); err != nil || out.accepted != 2 {
		t.Fatalf("report: %+v %v", out, err)
	}
	_, gb2, _ := c.lease(b.id, 8, nil, t0.Add(time.Second))
	if len(gb2) != 2 || gb2[0].Kind != ars.KindEval {
		t.Fatalf("second lease %v", gb2)
	}
	// Nothing unleased and a's lease is younger than the threshold: nothing.
	if _, g, _ := c.lease(b.id, 8, nil, t0.Add(1500*time.Millisecond)); g != nil {
		t.Fatalf("got %v before the straggler threshold", g)
	}
	// Past it, b gets duplicates of a's tasks (but never its own).
	_, dup, _ := c.lease(b.id, 8, nil, t0.Add(2500*time.Millisecond))
	if len(dup) != 2 || dup[0] != ga[0] || c.reassigned != 2 {
		t.Fatalf("straggler lease %v, reassigned %d", dup, c.reassigned)
	}
	if _, g, _ := c.lease(b.id, 8, nil, t0.Add(2600*time.Millisecond)); g != nil {
		t.Fatalf("a task went to a third holder or twice to b: %v", g)
	}
	// a reports late: its results win, b's copies become duplicates.
	res := compute(t, r, ga)
	if out, _ := c.report(a.id, r.id, 0, res, t0.Add(3*time.Second)); out.accepted != 2 {
		t.Fatalf("a's report %+v", out)
	}
	if out, _ := c.report(b.id, r.id, 0, res, t0.Add(3*time.Second)); out.duplicates != 2 || out.accepted != 0 {
		t.Fatalf("b's duplicate report %+v", out)
	}
	// a went silent past the TTL: forgotten, its leases freed.
	c.expire(t0.Add(14 * time.Second))
	if _, ok := c.workers[a.id]; ok {
		t.Fatal("silent worker kept")
	}
	if _, _, err := c.lease(a.id, 1, nil, t0.Add(14*time.Second)); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("lease by a forgotten worker: %v", err)
	}
}

func TestExpiredLeaseIsReassigned(t *testing.T) {
	c := newCoordinator(time.Second, time.Hour, 2, "")
	r := newTestRun(t, c)
	a := c.attach("a", t0)
	_, ga, _ := c.lease(a.id, 3, nil, t0)
	b := c.attach("b", t0.Add(500*time.Millisecond))
	_, gb, _ := c.lease(b.id, 8, nil, t0.Add(500*time.Millisecond))
	_, gb2, _ := c.lease(b.id, 8, nil, t0.Add(600*time.Millisecond))
	if len(ga)+len(gb)+len(gb2) != 6 {
		t.Fatalf("leases %v %v %v", ga, gb, gb2)
	}
	// a dies; after the TTL its tasks go to b.
	_, again, _ := c.lease(b.id, 8, nil, t0.Add(1600*time.Millisecond))
	if len(again) != 3 || again[0] != ga[0] {
		t.Fatalf("after expiry b got %v, want %v", again, ga)
	}
	_ = r
}

func TestReportRejectsBadResultsAndCountsStale(t *testing.T) {
	c := newCoordinator(time.Second, time.Second, 2, "")
	r := newTestRun(t, c)
	w := c.attach("w", t0)
	_, tasks, _ := c.lease(w.id, 8, nil, t0)
	good := compute(t, r, tasks)
	for name, mutate := range map[string]func(*pb.ARSTaskResult){
		"kind":      func(p *pb.ARSTaskResult) { p.Task.Kind = 7 },
		"index":     func(p *pb.ARSTaskResult) { p.Task.Index = 99 },
		"stats dim": func(p *pb.ARSTaskResult) { p.Stats.Mean = p.Stats.Mean[:1] },
		"no task":   func(p *pb.ARSTaskResult) { p.Task = nil },
		// Past the bounds that keep the run's counters finite: a step
		// count of 2^63 made the run's steps negative (a restart then
		// refused the run).
		"steps past 2^32": func(p *pb.ARSTaskResult) { p.Steps = 1 << 33; p.Stats.Count = float64(p.Steps) },
		"steps of 2^63-1": func(p *pb.ARSTaskResult) { p.Steps = math.MaxInt64; p.Stats.Count = float64(p.Steps) },
		"negative M2":     func(p *pb.ARSTaskResult) { p.Stats.M2[0] = -1 },
	} {
		bad := compute(t, r, tasks)
		mutate(bad[len(bad)-1])
		if _, err := c.report(w.id, r.id, 0, bad, t0); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		if r.remaining != len(r.tasks) {
			t.Fatalf("%s: a rejected report changed the run", name)
		}
	}
	// Values past the bounds that keep the run's sums finite (returns of
	// ±1e308 made θ NaN, whose state could not be written) are what a
	// diverging run produces, whoever computes the task: the run fails,
	// with a reason naming the divergence, and the report is stale.
	for name, mutate := range map[string]func(*pb.ARSTaskResult){
		"nan":               func(p *pb.ARSTaskResult) { p.RPlus = math.NaN() },
		"returns of 1e308":  func(p *pb.ARSTaskResult) { p.RPlus, p.RMinus = 1e308, -1e308 },
		"filter mean 1e200": func(p *pb.ARSTaskResult) { p.Stats.Mean[0] = 1e200 },
		"filter M2 1e300":   func(p *pb.ARSTaskResult) { p.Stats.M2[0] = 1e300 },
		"filter mean NaN":   func(p *pb.ARSTaskResult) { p.Stats.Mean[0] = math.NaN() },
	} {
		c := newCoordinator(time.Second, time.Second, 2, "")
		r := newTestRun(t, c)
		w := c.attach("w", t0)
		_, tasks, _ := c.lease(w.id, 8, nil, t0)
		bad := compute(t, r, tasks)
		mutate(bad[len(bad)-1])
		out, err := c.report(w.id, r.id, 0, bad, t0)
		if err != nil || out.accepted != 0 || out.stale != len(bad) || !out.finished {
			t.Errorf("%s: %+v, %v; want the report stale and the run ended", name, out, err)
		}
		if last := r.progress[len(r.progress)-1]; !r.done || !last.Done || !strings.HasPrefix(last.Reason, "diverged: ") {
			t.Errorf("%s: run done %v, last progress %+v; want failed as diverged", name, r.done, last)
		}
	}
	if _, err := c.report(w.id, "nope", 0, good, t0); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("unknown run: %v", err)
	}
	if out, err := c.report(w.id, r.id, 1, good, t0); err != nil || out.stale != len(good) {
		t.Errorf("other iteration: %+v %v", out, err)
	}
	if out, err := c.report(w.id, r.id, 0, good, t0); err != nil || out.accepted != len(good) {
		t.Errorf("good report: %+v %v", out, err)
	}
}

func TestNormaliseFillsDefaultsAndRejects(t *testing.T) {
	s, cfg, err := Normalise(&pb.ARSRunSpec{Env: "CartPole-v1", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := ars.EnvDefaults("CartPole-v1")
	if s.Version != d.Hyper.Version.String() || int(s.Directions) != d.Hyper.Directions || int(s.Top) != d.Hyper.Top || cfg.MaxEpisodes != d.MaxEpisodes {
		t.Fatalf("normalised %+v", s)
	}
	// Asking for V2 on an environment whose default is V2-t keeps every
	// direction; V1-t without b keeps the default b.
	if s, _, err := Normalise(&pb.ARSRunSpec{Env: "CartPole-v1", Version: "V2"}); err != nil || s.Top != s.Directions {
		t.Fatalf("V2: %+v, %v", s, err)
	}
	if s, _, err := Normalise(&pb.ARSRunSpec{Env: "CartPole-v1", Version: "V1-t"}); err != nil || int(s.Top) != d.Hyper.Top {
		t.Fatalf("V1-t: %+v, %v", s, err)
	}
	for name, spec := range map[string]*pb.ARSRunSpec{
		"nil":     nil,
		"env":     {Env: "NoSuchEnv-v0"},
		"version": {Env: "CartPole-v1", Version: "V9"},
		"top":     {Env: "CartPole-v1", Directions: 4, Top: 5},
		"noise":   {Env: "CartPole-v1", Noise: -1},
		"V2 top":  {Env: "CartPole-v1", Version: "V2", Directions: 8, Top: 4},
	} {
		if _, _, err := Normalise(spec); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestLeaseSkipsRunsTheWorkerCannotServe(t *testing.T) {
	c := newCoordinator(10*time.Second, 2*time.Second, 2, "")
	first, second := newTestRun(t, c), newTestRun(t, c)
	w := c.attach("w", t0)
	if r, _, _ := c.lease(w.id, 2, []string{first.id}, t0); r != second {
		t.Fatalf("leased from %v, want the second run", r)
	}
	if r, g, _ := c.lease(w.id, 2, []string{first.id, second.id}, t0); r != nil || g != nil {
		t.Fatalf("leased %v from %v though both runs are skipped", g, r)
	}
}
