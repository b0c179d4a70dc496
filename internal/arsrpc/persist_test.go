package arsrpc

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func persistSpec() *pb.ARSRunSpec {
	return &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 5, Directions: 4, Top: 2, MaxIterations: 6, EvalEvery: 2, EvalEpisodes: 2}
}

func newSvc(t *testing.T, st store.Store, dir string) *Service {
	t.Helper()
	s, err := New(Config{Store: st, DataDir: dir, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// drive plays a worker against s's handlers directly until runID has
// finished iterations more iterations (or ended).
func drive(t *testing.T, s *Service, runID string, iterations int) {
	t.Helper()
	ctx := context.Background()
	w, err := s.Attach(ctx, &pb.ARSAttachRequest{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Make("CartPole-v1")
	var ev *ars.Evaluator
	for finished := 0; finished < iterations; {
		lease, err := s.Lease(ctx, &pb.ARSLeaseRequest{WorkerId: w.WorkerId, MaxTasks: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(lease.Tasks) == 0 {
			return // the run ended
		}
		snap, err := s.cfg.Store.Get(ctx, lease.Model, lease.Version)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ars.DecodePolicy(snap.Blob)
		if err != nil {
			t.Fatal(err)
		}
		if ev == nil {
			ev = ars.NewEvaluator(e, &p.Arch)
		}
		it := &ars.Iteration{Seed: p.Seed, Iteration: p.Iteration, Hyper: p.Hyper, Theta: p.Theta, Filter: p.Filter()}
		req := &pb.ARSReportRequest{WorkerId: w.WorkerId, RunId: lease.RunId, Iteration: lease.Iteration}
		for _, tk := range lease.Tasks {
			k := ars.KindDirection
			if tk.Kind == pb.ARSTaskKind_ARS_TASK_KIND_EVAL {
				k = ars.KindEval
			}
			req.Results = append(req.Results, toPB(ev.Run(it, ars.Task{Kind: k, Index: int(tk.Index)})))
		}
		before := s.Stats().Runs[0].Iteration
		if _, err := s.Report(ctx, req); err != nil {
			t.Fatal(err)
		}
		if s.Stats().Runs[0].Iteration > before {
			finished++
		}
	}
}

func newest(t *testing.T, st store.Store, model string) *store.Snapshot {
	t.Helper()
	snap, err := st.Get(context.Background(), model, 0)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// A service closed mid-run and opened again on the same DataDir resumes
// the run and ends with the policy an uninterrupted service produces,
// also when the store missed the last version (the crash between the
// state write and the publish), which it publishes again.
func TestServiceResumesRunsFromDataDir(t *testing.T) {
	ctx := context.Background()
	ref, _ := store.NewMemory(store.Config{})
	rs := newSvc(t, ref, "")
	start, err := rs.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, rs, start.RunId, 100)
	rs.Close()
	want := newest(t, ref, start.Model).Blob

	dir := t.TempDir()
	st, _ := store.NewMemory(store.Config{})
	s1 := newSvc(t, st, dir)
	start, err = s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec(), RequestId: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s1, start.RunId, 3)
	s1.Close()
	v := newest(t, st, start.Model).Version

	// A store that lacks the newest version.
	st2, _ := store.NewMemory(store.Config{})
	for ver := uint64(max(v-2, 1)); ver < v; ver++ {
		snap, err := st.Get(ctx, start.Model, ver)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st2.Push(ctx, store.PushRequest{Name: start.Model, Version: ver, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
			t.Fatal(err)
		}
	}
	s2 := newSvc(t, st2, dir)
	defer s2.Close()
	if got := newest(t, st2, start.Model); got.Version != v || !bytes.Equal(got.Blob, newest(t, st, start.Model).Blob) {
		t.Fatalf("restored service republished version %d, want %d with the same bytes", got.Version, v)
	}
	// A retried StartRun with the same key is the same run.
	again, err := s2.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec(), RequestId: "k1"})
	if err != nil || again.RunId != start.RunId {
		t.Fatalf("StartRun retry: %v %v, want run %s", err, again, start.RunId)
	}
	if got := s2.Stats().Runs[0].Iteration; got != 3 {
		t.Fatalf("restored run at iteration %d, want 3", got)
	}
	drive(t, s2, start.RunId, 100)
	st2Stats := s2.Stats().Runs[0]
	if !st2Stats.Done || st2Stats.Reason != "budget" {
		t.Fatalf("resumed run: %+v", st2Stats)
	}
	if !bytes.Equal(newest(t, st2, start.Model).Blob, want) {
		t.Fatal("resumed run's final policy differs from the uninterrupted run's")
	}
	s2.mu.Lock()
	prog := s2.c.runs[start.RunId].progress
	s2.mu.Unlock()
	for i, p := range prog {
		if p.Iteration != uint64(i) {
			t.Fatalf("progress entry %d is iteration %d", i, p.Iteration)
		}
	}
}

// A run whose state cannot be read is not resumed (logged at ERROR) and
// its name is never reused; the log's extra or torn lines are dropped.
func TestServiceSkipsUnreadableRunState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, _ := store.NewMemory(store.Config{})
	s1 := newSvc(t, st, dir)
	a, err := s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s1, b.RunId, 0)
	s1.Close()
	if err := os.WriteFile(filepath.Join(dir, a.RunId, "state.json"), []byte(`{"format": 1, "id": `), 0o644); err != nil {
		t.Fatal(err)
	}
	// A torn line after the valid entries of run b.
	f, err := os.OpenFile(filepath.Join(dir, b.RunId, "progress.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("deadbeef {\"runId\":")
	f.Close()

	s2 := newSvc(t, st, dir)
	defer s2.Close()
	runs := s2.Stats().Runs
	if len(runs) != 1 || runs[0].ID != b.RunId {
		t.Fatalf("restored runs %+v, want only %s", runs, b.RunId)
	}
	c, err := s2.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil || c.RunId == a.RunId || c.RunId == b.RunId || !strings.HasPrefix(c.RunId, "run-") {
		t.Fatalf("new run %v %v reuses a name", c, err)
	}
}
