package arsrpc

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A result that is malformed (statistics missing or of another dimension,
// a step count the statistics disagree with, no steps) is a disagreement
// between hub and worker even when its returns are also non-finite: the
// report is refused with InvalidArgument and the run goes on, rather than
// ending as diverged on the word of one bad worker.
func TestMalformedResultWithNaNIsRefusedNotDiverged(t *testing.T) {
	for name, mutate := range map[string]func(*pb.ARSTaskResult){
		"no statistics":       func(p *pb.ARSTaskResult) { p.Stats = nil },
		"statistics of dim 2": func(p *pb.ARSTaskResult) { p.Stats.Mean, p.Stats.M2 = p.Stats.Mean[:2], p.Stats.M2[:2] },
		"count is not steps":  func(p *pb.ARSTaskResult) { p.Stats.Count++ },
		"no steps": func(p *pb.ARSTaskResult) {
			p.Steps, p.Stats = 0, &pb.ARSFilterStats{Mean: make([]float64, 4), M2: make([]float64, 4)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := startHub(t, Config{})
			client := pb.NewARSClient(dial(t, h.addr))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
			if err != nil {
				t.Fatal(err)
			}
			id, lease, res := leaseAndRun(t, ctx, client)
			res.RPlus = math.NaN()
			mutate(res)
			_, err = client.Report(ctx, &pb.ARSReportRequest{WorkerId: id, RunId: lease.RunId, Iteration: lease.Iteration, Results: []*pb.ARSTaskResult{res}})
			if err = grpcerr.FromStatus(err); !errors.Is(err, errs.ErrInvalid) || errors.Is(err, ars.ErrDiverged) {
				t.Errorf("report of a malformed result with r+ = NaN: %v; want InvalidArgument", err)
			}
			if done, reason := runEnded(h, start.RunId); done {
				t.Errorf("one malformed result ended the run: %q", reason)
			}
		})
	}
}

// leaseAndRun attaches a worker, leases one direction task of runSpec's
// run and computes its true result.
func leaseAndRun(t *testing.T, ctx context.Context, client pb.ARSClient) (workerID string, lease *pb.ARSLeaseResponse, res *pb.ARSTaskResult) {
	t.Helper()
	att, err := client.Attach(ctx, &pb.ARSAttachRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	lease, err = client.Lease(ctx, &pb.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1})
	if err != nil || len(lease.Tasks) != 1 || lease.Tasks[0].Kind != pb.ARSTaskKind_ARS_TASK_KIND_DIRECTION {
		t.Fatalf("lease: %v, %v", lease, err)
	}
	p, err := ars.DecodePolicy(lease.Policy)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Make(lease.Spec.Env)
	defer env.Close(e)
	it := &ars.Iteration{Seed: p.Seed, Iteration: p.Iteration, Hyper: p.Hyper, Theta: p.Theta, Filter: p.Filter()}
	return att.WorkerId, lease, toPB(ars.NewEvaluator(e, &p.Arch).Run(it, ars.Task{Kind: ars.KindDirection, Index: int(lease.Tasks[0].Index)}))
}

// runEnded reports whether the hub's run ended, and why.
func runEnded(h *testHub, runID string) (bool, string) {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	r := h.svc.c.runs[runID]
	reason := ""
	if n := len(r.progress); n > 0 {
		reason = r.progress[n-1].Reason
	}
	return r.done, reason
}

// A diverged result for a task the hub already holds a finite result of
// is a late duplicate that contradicts the accepted one (a task is a
// deterministic function of its index): it is counted as a duplicate and
// ignored, rather than ending the run on one worker's word.
func TestDivergedDuplicateOfADoneTaskIsIgnored(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
	if err != nil {
		t.Fatal(err)
	}
	id, lease, res := leaseAndRun(t, ctx, client)
	report := func(p *pb.ARSTaskResult) *pb.ARSReportResponse {
		t.Helper()
		resp, err := client.Report(ctx, &pb.ARSReportRequest{WorkerId: id, RunId: lease.RunId, Iteration: lease.Iteration, Results: []*pb.ARSTaskResult{p}})
		if err != nil {
			t.Fatalf("report: %v", err)
		}
		return resp
	}
	if resp := report(res); resp.Accepted != 1 {
		t.Fatalf("the true result: %+v", resp)
	}
	res.RPlus = math.NaN()
	if resp := report(res); resp.Duplicates != 1 {
		t.Errorf("a diverged duplicate of a done task: %+v, want 1 duplicate", resp)
	}
	if done, reason := runEnded(h, start.RunId); done {
		t.Errorf("a diverged duplicate of a done task ended the run: %q", reason)
	}
}

// A task cannot take more steps than its episodes allow (CartPole: 500 a
// rollout, two a direction): a result claiming 2^32 steps, with
// statistics to match, is refused with InvalidArgument and changes
// nothing; it used to be taken, multiplying the filter's state count and
// the run's step total on one worker's word.
func TestStepsPastTheEnvironmentsTimeLimitAreRefused(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
	if err != nil {
		t.Fatal(err)
	}
	id, lease, res := leaseAndRun(t, ctx, client)
	res.Steps, res.Stats.Count = 1<<32, 1<<32
	_, err = client.Report(ctx, &pb.ARSReportRequest{WorkerId: id, RunId: lease.RunId, Iteration: lease.Iteration, Results: []*pb.ARSTaskResult{res}})
	if err = grpcerr.FromStatus(err); !errors.Is(err, errs.ErrInvalid) || errors.Is(err, ars.ErrDiverged) {
		t.Errorf("report of a direction of 2^32 CartPole steps: %v; want InvalidArgument", err)
	}
	h.svc.mu.Lock()
	taken := h.svc.c.runs[start.RunId].remaining != len(h.svc.c.runs[start.RunId].tasks)
	h.svc.mu.Unlock()
	if taken {
		t.Error("the hub took a direction of 2^32 CartPole steps")
	}
	if done, reason := runEnded(h, start.RunId); done {
		t.Errorf("the run ended: %q", reason)
	}
}
