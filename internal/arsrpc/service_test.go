package arsrpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// childEnv makes the test binary act as a worker process that takes one
// lease, says so on stdout and then hangs until it is killed.
const childEnv = "ARSRPC_TEST_HANGING_WORKER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(childEnv); addr != "" {
		os.Exit(hangingWorker(addr))
	}
	goleak.VerifyTestMain(m)
}

func hangingWorker(addr string) int {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 2
	}
	_, err = RunWorker(context.Background(), WorkerConfig{Conn: conn, Name: "doomed", MaxTasks: 4, Logger: testkit.Logger(),
		afterLease: func(l *pb.ARSLeaseResponse) {
			os.Stdout.WriteString("LEASED\n")
			select {} // hold the lease until killed
		}})
	if err != nil {
		return 3
	}
	return 0
}

type testHub struct {
	addr  string
	svc   *Service
	store store.Store
}

func startHub(t testing.TB, cfg Config) *testHub {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Logger = st, testkit.Logger()
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: drain, stop the server, close.
	t.Cleanup(func() { svc.Close(); st.Close() })
	addr := testkit.ServeGRPC(t, nil, svc.Register)
	t.Cleanup(svc.Drain)
	return &testHub{addr: addr, svc: svc, store: st}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// workers runs n in-process workers until stop is called.
func workers(t testing.TB, addr string, n int) (stop func() []WorkerStats) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stats := make([]WorkerStats, n)
	for i := range n {
		conn := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", MaxTasks: 3, Logger: testkit.Logger()})
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
			stats[i] = s
		}()
	}
	return func() []WorkerStats { cancel(); wg.Wait(); return stats }
}

// watch collects a run's progress until it ends.
func watch(t testing.TB, ctx context.Context, client pb.ARSClient, runID string) []*pb.ARSProgress {
	t.Helper()
	stream, err := client.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var out []*pb.ARSProgress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		out = append(out, p)
	}
}

func runSpec() *pb.ARSRunSpec {
	return &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 11, Version: "V2-t", Directions: 8, Top: 4,
		StepSize: 0.02, Noise: 0.03, EvalEvery: 2, EvalEpisodes: 3, MaxIterations: 6}
}

func localReference(t *testing.T, spec *pb.ARSRunSpec) *ars.Trainer {
	t.Helper()
	_, cfg, err := Normalise(spec)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Make(spec.Env)
	tr, err := ars.RunLocal(cfg, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// distributed trains spec on a fresh hub with n workers and returns the
// final policy and the progress.
func distributed(t *testing.T, spec *pb.ARSRunSpec, n int, cfg Config) (*ars.Policy, []*pb.ARSProgress) {
	t.Helper()
	h := startHub(t, cfg)
	stop := workers(t, h.addr, n)
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	prog := watch(t, ctx, client, start.RunId)
	p, _, err := PullPolicy(ctx, client, start.RunId, 0)
	if err != nil {
		t.Fatal(err)
	}
	stats := stop()
	for i, s := range stats {
		if n > 1 && s.Tasks == 0 {
			t.Errorf("worker %d of %d ran no task", i, n)
		}
		if inlined := cfg.InlineMax >= 0; inlined != (s.Pulls == 0) {
			t.Errorf("worker %d pulled %d policies (inline limit %d)", i, s.Pulls, cfg.InlineMax)
		}
	}
	// The store holds the same newest version.
	snap, err := h.store.Get(ctx, start.Model, 0)
	if err != nil || snap.Version != prog[len(prog)-1].Version {
		t.Fatalf("store: %v, version %v, progress says %d", err, snap, prog[len(prog)-1].Version)
	}
	return p, prog
}

func TestBitIdenticalWithOneAndTwoWorkers(t *testing.T) {
	spec := runSpec()
	ref := localReference(t, spec)
	p1, prog1 := distributed(t, spec, 1, Config{})
	// Two workers, policies pulled by PullPolicy instead of inlined.
	p2, prog2 := distributed(t, spec, 2, Config{InlineMax: -1})
	for name, p := range map[string]*ars.Policy{"1 worker": p1, "2 workers": p2} {
		if !slices.Equal(p.Theta, ref.Theta()) || !slices.Equal(p.Stats.Mean, ref.Stats().Mean) ||
			!slices.Equal(p.Stats.M2, ref.Stats().M2) || p.Stats.Count != ref.Stats().Count {
			t.Errorf("%s: policy differs from the single-process run:\n%v\n%v", name, p.Theta, ref.Theta())
		}
	}
	if len(prog1) != 7 || len(prog1) != len(prog2) || !prog1[len(prog1)-1].Done {
		t.Fatalf("progress lengths %d, %d", len(prog1), len(prog2))
	}
	for i := range prog1 {
		a, b := prog1[i], prog2[i]
		if a.EvalMean != b.EvalMean || a.SigmaR != b.SigmaR || a.Steps != b.Steps || a.Version != b.Version {
			t.Errorf("iteration %d differs: %v vs %v", i, a, b)
		}
	}
	if last := prog1[len(prog1)-1]; last.Reason != "budget" || last.Version != 7 || last.Episodes != 6*16 {
		t.Errorf("last progress %v", last)
	}
}

// A worker process takes a lease and is killed mid-iteration; another
// worker completes the iteration with the reassigned directions, and the
// result is still the single-process one.
func TestKilledWorkerProcessTasksAreReassigned(t *testing.T) {
	h := startHub(t, Config{LeaseTTL: 1500 * time.Millisecond, StraggleAfter: time.Hour, MaxWait: 500 * time.Millisecond})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := runSpec()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.CommandContext(ctx, exe, "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+h.addr)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "LEASED" {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("child said %q, %v", line, err)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()

	stop := workers(t, h.addr, 1)
	prog := watch(t, ctx, client, start.RunId)
	stop()
	if ctx.Err() != nil {
		t.Fatal("the run did not finish within the deadline")
	}
	if h.svc.Reassigned() < 1 {
		t.Fatalf("reassigned %d tasks, want the killed worker's", h.svc.Reassigned())
	}
	p, _, err := PullPolicy(ctx, client, start.RunId, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ref := localReference(t, spec); !slices.Equal(p.Theta, ref.Theta()) || !prog[len(prog)-1].Done {
		t.Fatal("the run with a killed worker differs from the single-process run")
	}
}

func TestServiceErrors(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: &pb.ARSRunSpec{Env: "Nope-v0"}})
	if !errors.Is(grpcerr.FromStatus(err), errs.ErrInvalid) {
		t.Errorf("bad env: %v", err)
	}
	_, err = client.Lease(ctx, &pb.ARSLeaseRequest{WorkerId: "ghost"})
	if !errors.Is(grpcerr.FromStatus(err), errs.ErrNotFound) {
		t.Errorf("unknown worker: %v", err)
	}
	if _, _, err := PullPolicy(ctx, client, "run-404", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("unknown run: %v", err)
	}
	// A long poll with nothing to do returns empty after its wait.
	att, err := client.Attach(ctx, &pb.ARSAttachRequest{Name: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Lease(ctx, &pb.ARSLeaseRequest{WorkerId: att.WorkerId, WaitMs: 50})
	if err != nil || len(resp.Tasks) != 0 {
		t.Fatalf("idle lease: %v, %v", resp, err)
	}
	// StopRun ends a run and its watchers.
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: start.RunId}); err != nil {
		t.Fatal(err)
	}
	prog := watch(t, ctx, client, start.RunId)
	if len(prog) != 1 || !prog[0].Done || prog[0].Reason != "stopped" {
		t.Fatalf("stopped run progress %v", prog)
	}
}

// A Go worker leased tasks of a run whose environment it cannot make
// (served by Python workers) gives them back, skips that run and goes on
// serving the others.
func TestWorkerSkipsRunItCannotServe(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	foreign, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: &pb.ARSRunSpec{Env: "user/Grid-v0", Seed: 1,
		MaxIterations: 2, EnvSpec: &pb.ARSEnvSpec{ObsDim: 4, Discrete: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	spec := runSpec()
	mine, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	stop := workers(t, h.addr, 1) // fails the test if the worker returns an error
	prog := watch(t, ctx, client, mine.RunId)
	stop()
	p, _, err := PullPolicy(ctx, client, mine.RunId, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ref := localReference(t, spec); !slices.Equal(p.Theta, ref.Theta()) || !prog[len(prog)-1].Done {
		t.Fatal("the built-in run differs from the single-process run")
	}
	// The foreign run is untouched: no iteration finished, its tasks free.
	h.svc.mu.Lock()
	r := h.svc.c.runs[foreign.RunId]
	done, remaining, held := r.done, r.remaining, 0
	for _, ls := range r.leases {
		held += len(ls)
	}
	h.svc.mu.Unlock()
	if done || remaining != len(r.tasks) || held != 0 {
		t.Fatalf("foreign run: done %v, %d of %d tasks left, %d leases held", done, remaining, len(r.tasks), held)
	}
}
