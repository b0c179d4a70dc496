package arsrpc

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/store"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// reportIteration leases every task of the run's current iteration,
// computes honest results and reports them, until the iteration ends.
func reportIteration(t *testing.T, s *Service) {
	t.Helper()
	ctx := context.Background()
	w, err := s.Attach(ctx, &pb.ARSAttachRequest{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	iter0 := s.Stats().Runs[0].Iteration
	for s.Stats().Runs[0].Iteration == iter0 && !s.Stats().Runs[0].Done {
		lease, err := s.Lease(ctx, &pb.ARSLeaseRequest{WorkerId: w.WorkerId, MaxTasks: 1000})
		if err != nil || len(lease.Tasks) == 0 {
			t.Fatalf("lease: %v, %v", lease, err)
		}
		snap, err := s.cfg.Store.Get(ctx, lease.Model, lease.Version)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ars.DecodePolicy(snap.Blob)
		if err != nil {
			t.Fatal(err)
		}
		e, err := env.Make("CartPole-v1")
		if err != nil {
			t.Fatal(err)
		}
		ev := ars.NewEvaluator(e, &p.Arch)
		it := &ars.Iteration{Seed: p.Seed, Iteration: p.Iteration, Hyper: p.Hyper, Theta: p.Theta, Filter: p.Filter()}
		req := &pb.ARSReportRequest{WorkerId: w.WorkerId, RunId: lease.RunId, Iteration: lease.Iteration}
		for _, tk := range lease.Tasks {
			k := ars.KindDirection
			if tk.Kind == pb.ARSTaskKind_ARS_TASK_KIND_EVAL {
				k = ars.KindEval
			}
			req.Results = append(req.Results, toPB(ev.Run(it, ars.Task{Kind: k, Index: int(tk.Index)})))
		}
		if _, err := s.Report(ctx, req); err != nil {
			t.Fatalf("report: %v", err)
		}
	}
}

// watched is a WatchRun stream that keeps what it is sent.
type watched struct {
	grpc.ServerStream
	ctx context.Context
	got []*pb.ARSProgress
}

func (w *watched) Context() context.Context     { return w.ctx }
func (w *watched) Send(p *pb.ARSProgress) error { w.got = append(w.got, p); return nil }

// TestFailedSaveLogsItsEntriesOnce: a save that fails after appending
// the run's new progress entries (state.json cannot be written) left them
// in progress.log while counting them unlogged; the next save appended
// them again. A restart then read the iteration twice and lost the run's
// done entry, and WatchRun of the ended run never ended. The log is now
// cut back when the save fails, and each entry is logged once.
func TestFailedSaveLogsItsEntriesOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s1 := newSvc(t, st, dir)
	start, err := s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, start.RunId, "progress.log")
	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, start.RunId, "state.json.tmp")
	if err := os.Mkdir(blocker, 0o755); err != nil { // the next state.json cannot be written
		t.Fatal(err)
	}
	reportIteration(t, s1)
	if rs := s1.Stats().Runs[0]; !rs.Done {
		t.Fatalf("a run whose state could not be written goes on: %+v", rs)
	}
	if after, err := os.ReadFile(logPath); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("progress.log after the failed save: %d bytes, %v (want its %d bytes before)", len(after), err, len(before))
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.StopRun(ctx, &pb.ARSStopRunRequest{RunId: start.RunId}); err != nil {
		t.Fatal(err)
	}
	s1.Close()

	s2 := newSvc(t, st, dir)
	defer s2.Close()
	s2.mu.Lock()
	r := s2.c.runs[start.RunId]
	var iters []int64
	var done bool
	for _, p := range r.progress {
		if p.Done {
			done = true
		} else {
			iters = append(iters, int64(p.Iteration))
		}
	}
	s2.mu.Unlock()
	for i := 1; i < len(iters); i++ {
		if iters[i] <= iters[i-1] {
			t.Fatalf("restored progress logs iterations %v: one twice", iters)
		}
	}
	if !done {
		t.Fatal("the restored run has no done entry")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s2.WatchRun(&pb.ARSWatchRunRequest{RunId: start.RunId}, &watched{ctx: wctx}); err != nil {
		t.Fatalf("WatchRun of the ended run: %v", err)
	}
}
