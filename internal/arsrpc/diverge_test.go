package arsrpc

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// oneWorker runs one in-process worker; done receives RunWorker's error
// when it returns, stop cancels it and waits.
func oneWorker(t *testing.T, addr string) (done <-chan error, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	conn := dial(t, addr)
	go func() {
		_, err := RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", MaxTasks: 8, Logger: testkit.Logger()})
		ch <- err
	}()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-ch })
		return err
	}
	t.Cleanup(func() { stop() })
	return ch, stop
}

// failsDiverged starts spec, follows it to its end with one worker and
// checks that it ended with a reason naming divergence while the worker
// stayed up; then the same worker serves a healthy run to its end.
func failsDiverged(t *testing.T, spec *pb.ARSRunSpec) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	done, stop := oneWorker(t, h.addr)
	prog := watch(t, ctx, client, start.RunId)
	last := prog[len(prog)-1]
	if !last.Done || !strings.Contains(last.Reason, "diverged") {
		t.Fatalf("run ended with %+v, want a reason naming divergence", last)
	}
	t.Logf("run ended: %s", last.Reason)
	// Every version the hub published decodes (θ stayed finite).
	if _, _, err := PullPolicy(ctx, client, start.RunId, 0); err != nil {
		t.Fatalf("newest published policy: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the worker exited: %v", err)
	default:
	}
	next, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
	if err != nil {
		t.Fatal(err)
	}
	if prog := watch(t, ctx, client, next.RunId); prog[len(prog)-1].Reason != "budget" {
		t.Fatalf("the next run ended with %+v", prog[len(prog)-1])
	}
	if err := stop(); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// LQR with --noise 0.5 (a legitimate value): the perturbed gains are
// unstable and the episodes' returns pass the hub's ±1e100 bound. The
// hub fails the run as diverged (it used to refuse the report as
// InvalidArgument, on which every worker that leased the task exited,
// so the run never ended).
func TestDivergingEpisodeFailsRunWorkerCarriesOn(t *testing.T) {
	failsDiverged(t, &pb.ARSRunSpec{Env: "LQR", Seed: 1, Version: "V1", Directions: 4, StepSize: 0.005, Noise: 0.5,
		EvalEvery: 1, EvalEpisodes: 1, MaxIterations: 2})
}

// --step-size 1e308 passes validation; the first update makes θ infinite.
// The trainer refuses to publish it and the run fails as diverged (it
// used to publish it; workers refused to decode it and exited).
func TestHugeStepSizeFailsRunAsDiverged(t *testing.T) {
	failsDiverged(t, &pb.ARSRunSpec{Env: "MountainCarContinuous-v0", Seed: 1, Version: "V1", Directions: 4, StepSize: 1e308,
		Noise: 0.03, EvalEvery: 10, EvalEpisodes: 1, MaxIterations: 3})
}

// refusingReports is a hub that leases one run's task and refuses every
// report of it as InvalidArgument; it records whether a later lease
// request skips that run.
type refusingReports struct {
	pb.UnimplementedARSServer
	policy   []byte
	attached atomic.Int64
	reports  atomic.Int64
	skipped  atomic.Bool
}

func (s *refusingReports) Attach(context.Context, *pb.ARSAttachRequest) (*pb.ARSAttachResponse, error) {
	s.attached.Add(1)
	return &pb.ARSAttachResponse{WorkerId: "w"}, nil
}

func (s *refusingReports) Detach(context.Context, *pb.ARSDetachRequest) (*pb.ARSDetachResponse, error) {
	return &pb.ARSDetachResponse{}, nil
}

func (s *refusingReports) Lease(ctx context.Context, req *pb.ARSLeaseRequest) (*pb.ARSLeaseResponse, error) {
	if slices.Contains(req.SkipRuns, "bad") {
		s.skipped.Store(true)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		return &pb.ARSLeaseResponse{}, nil
	}
	return &pb.ARSLeaseResponse{RunId: "bad", Spec: &pb.ARSRunSpec{Env: "CartPole-v1"}, Model: "ars/bad", Version: 1,
		Policy: s.policy, Tasks: []*pb.ARSTask{{Kind: pb.ARSTaskKind_ARS_TASK_KIND_EVAL}}}, nil
}

func (s *refusingReports) Report(context.Context, *pb.ARSReportRequest) (*pb.ARSReportResponse, error) {
	s.reports.Add(1)
	return nil, status.Error(codes.InvalidArgument, "refused by the test")
}

// A worker whose report of a run is refused as InvalidArgument (a
// disagreement about that run) skips the run and goes on asking for
// others; it used to exit.
func TestWorkerSkipsRunWhoseReportIsRefused(t *testing.T) {
	blob := cartPolePolicy(t)
	srv := &refusingReports{policy: blob}
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { pb.RegisterARSServer(g, srv) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", Logger: testkit.Logger()})
		done <- err
	}()
	testkit.Eventually(t, 30*time.Second, "a lease request skipping the refused run", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the worker exited: %v", err)
		default:
		}
		return srv.skipped.Load()
	})
	if n := srv.reports.Load(); n != 1 {
		t.Fatalf("%d reports of the refused run, want 1", n)
	}
	cancel()
	if err := testkit.Recv(t, done, 30*time.Second, "the worker to stop"); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// cartPolePolicy is the encoded first policy of a one-iteration CartPole
// run (seed 1): what a test hub leases to a worker.
func cartPolePolicy(t *testing.T) []byte {
	t.Helper()
	_, cfg, err := Normalise(&pb.ARSRunSpec{Env: "CartPole-v1", Seed: 1, MaxIterations: 1})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ars.NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := tr.PolicyOf().Encode()
	if err != nil {
		t.Fatal(err)
	}
	return blob
}
