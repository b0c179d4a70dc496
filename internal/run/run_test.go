package run

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

const workerEnv = "RLHUB_RUN_TEST_WORKER"

// TestMain doubles as the worker process: Run starts this test binary
// with workerEnv set and `… worker ars --hub ADDR --name N --retry-for D`,
// and it runs arsrpc.RunWorker as `rlhub worker ars` does (without the
// CLI, which this package's tests do not use).
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(workerMain())
	}
	goleak.VerifyTestMain(testkit.Main(m))
}

func workerMain() int {
	args := os.Args
	for i, a := range args {
		if a == "ars" {
			args = args[i+1:]
			break
		}
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	addr := fs.String("hub", "", "")
	name := fs.String("name", "", "")
	retry := fs.Duration("retry-for", 30*time.Second, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 1
	}
	defer conn.Close()
	if _, err := arsrpc.RunWorker(ctx, arsrpc.WorkerConfig{Conn: conn, Name: *name, RetryFor: *retry, Logger: testkit.Logger()}); err != nil {
		os.Stderr.WriteString("worker: " + err.Error() + "\n")
		return 1
	}
	return 0
}

// workerCommand makes Run start this test binary as its workers.
func workerCommand(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(workerEnv, "1")
	return []string{exe, "-test.run=^$", "--", "--log-level", "warn"}
}

func cartPole(seed uint64, iters uint32) *pb.ARSRunSpec {
	return &pb.ARSRunSpec{Env: "CartPole-v1", Seed: seed, MaxIterations: iters, EvalEvery: 2, EvalEpisodes: 3}
}

func readCurve(t *testing.T, dir string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "curve.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// A run on an embedded hub writes every output, the observer sees each
// iteration once and in order, and a progress writer that is not a
// terminal gets one line per iteration.
func TestRunOutputsObserverAndProgressLines(t *testing.T) {
	dir := t.TempDir()
	var seen []Iteration
	var prog testkit.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sum, err := Run(ctx, Config{Spec: cartPole(3, 4), Workers: 2, WorkerCommand: workerCommand(t), Out: dir,
		Progress: &prog, Logger: testkit.Logger(), Observer: ObserverFunc(func(it Iteration) { seen = append(seen, it) })})
	if err != nil {
		t.Fatal(err)
	}
	// 4 training iterations, then the final evaluation of θ_4.
	if sum.Iterations != 5 || sum.Reason != "budget" || sum.Protocol != "paper" || sum.EvalEvery != 2 || sum.EvalEpisodesEach != 3 || sum.FinalEvalMean == nil {
		t.Fatalf("summary %+v", sum)
	}
	if len(seen) != 5 {
		t.Fatalf("observer saw %d iterations, want 5", len(seen))
	}
	for i, it := range seen {
		if it.Iteration != uint64(i) || it.Protocol != "paper" {
			t.Fatalf("observer call %d: %+v", i, it)
		}
		if want := i%2 == 0 || i == 4; it.HasEval != want {
			t.Errorf("iteration %d: HasEval %v", i, it.HasEval)
		}
		if want := i < 4; it.HasTrain != want || (want && it.TrainReturn == 0) {
			t.Errorf("iteration %d: HasTrain %v, train return %v", i, it.HasTrain, it.TrainReturn)
		}
	}
	lines := strings.Split(strings.TrimSpace(prog.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ars it 0 |") || strings.Contains(prog.String(), "\r") || !strings.Contains(lines[0], "paper protocol") {
		t.Fatalf("progress %q", prog.String())
	}
	if recs := readCurve(t, dir); len(recs) != 6 || recs[0][0] != "iteration" {
		t.Fatalf("curve.csv has %d rows, want header + 5", len(recs))
	}
	for _, n := range []string{"policy.safetensors", "summary.json", "curve.png", "run.json"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Error(err)
		}
	}
	blob, err := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ars.DecodePolicy(blob); err != nil || p.Iteration != 4 {
		t.Fatalf("policy %v %+v", err, p)
	}
	if got, err := ReadSummary(dir); err != nil || got.RunID != sum.RunID {
		t.Fatalf("ReadSummary %v %+v", err, got)
	}
}

// An output directory that holds a run is refused and left alone; with
// OutOverwrite it is replaced; OutResume needs a run record.
func TestRunOutNeverSilentlyOverwritten(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := Run(ctx, Config{Spec: cartPole(1, 1), Workers: 1, WorkerCommand: []string{"/bin/false"}, Out: dir, Logger: testkit.Logger()})
	if err == nil || !strings.Contains(err.Error(), "earlier run") || !strings.Contains(err.Error(), "--overwrite") {
		t.Fatalf("fresh run into a used directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "summary.json")); string(b) != "{}" {
		t.Fatalf("refused run changed summary.json: %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "run.json")); !os.IsNotExist(err) {
		t.Fatalf("refused run wrote run.json: %v", err)
	}
	_, err = Run(ctx, Config{Spec: cartPole(1, 1), Workers: 1, WorkerCommand: []string{"/bin/false"}, Out: t.TempDir(), OutMode: OutResume, Logger: testkit.Logger()})
	if err == nil || !strings.Contains(err.Error(), "no run to continue") {
		t.Fatalf("resume without a record: %v", err)
	}
	sum, err := Run(ctx, Config{Spec: cartPole(1, 1), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, OutMode: OutOverwrite, Logger: testkit.Logger()})
	if err != nil || sum.Iterations != 2 {
		t.Fatalf("overwrite: %v %+v", err, sum)
	}
	if got, err := ReadSummary(dir); err != nil || got.RunID == "" {
		t.Fatalf("overwritten summary: %v %+v", err, got)
	}
}

// A hub that refuses connections fails the start at once, not after the
// start timeout.
func TestRunFailsFastOnDeadHub(t *testing.T) {
	addr := testkit.FreeAddr(t) // nothing listens there; below the ephemeral range, no source port either
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Run(ctx, Config{Spec: cartPole(1, 1), Hub: addr, Out: t.TempDir(), StartTimeout: time.Hour, Logger: testkit.Logger()})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err %v, want ErrUnreachable", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for the test's deadline instead of failing fast")
	}
}

func TestRunConfigRejectsNonsense(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]Config{
		"no spec":         {Out: t.TempDir()},
		"no out":          {Spec: cartPole(1, 1), Workers: 1},
		"unknown env":     {Spec: &pb.ARSRunSpec{Env: "Nope-v0", MaxIterations: 1}, Workers: 1, Out: t.TempDir()},
		"no workers":      {Spec: cartPole(1, 1), Out: t.TempDir()},
		"bad hyper":       {Spec: &pb.ARSRunSpec{Env: "CartPole-v1", Version: "V2", Directions: 8, Top: 4, MaxIterations: 1}, Workers: 1, Out: t.TempDir()},
		"python env here": {Spec: &pb.ARSRunSpec{Env: "user/Grid-v0", MaxIterations: 1, EnvSpec: &pb.ARSEnvSpec{ObsDim: 3, Discrete: 2}}, Workers: 1, Out: t.TempDir()},
	} {
		if _, err := Run(ctx, cfg); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}

// A run on the embedded hub interrupted after a few iterations continues
// with OutResume (the hub reopened on OUT/hub) and ends with the policy
// and curve an uninterrupted run of the same spec produces.
func TestRunResumeAfterInterrupt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ref := t.TempDir()
	refSum, err := Run(ctx, Config{Spec: cartPole(7, 8), Workers: 1, WorkerCommand: workerCommand(t), Out: ref, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ictx, stop := context.WithCancel(ctx)
	_, err = Run(ictx, Config{Spec: cartPole(7, 8), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger(),
		Observer: ObserverFunc(func(it Iteration) {
			if it.Iteration == 2 {
				stop()
			}
		})})
	stop()
	if err == nil {
		t.Fatal("interrupted run returned no error")
	}
	if _, err := Run(ctx, Config{Spec: cartPole(7, 8), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger()}); err == nil {
		t.Fatal("a fresh run into the interrupted run's directory was accepted")
	}
	sum, err := Run(ctx, Config{Spec: cartPole(7, 8), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, OutMode: OutResume, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Iterations != refSum.Iterations || sum.RunID != refSum.RunID {
		t.Fatalf("resumed %+v, reference %+v", sum, refSum)
	}
	a, _ := os.ReadFile(filepath.Join(ref, "policy.safetensors"))
	b, _ := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatal("resumed policy differs from the uninterrupted run's")
	}
	if recs := readCurve(t, dir); uint64(len(recs)) != refSum.Iterations+1 {
		t.Fatalf("curve.csv has %d rows, want header + %d", len(recs), refSum.Iterations)
	}
}

// A run that stops at its target re-evaluates θ on ConfirmEpisodes (100)
// fresh episodes in the same run, and that is the number the summary
// reports: recomputed here from the policy file on the same episodes.
func TestRunReEvaluatesOnFreshEpisodesAtTarget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	spec := &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 2, EvalEvery: 2, EvalEpisodes: 5, UseTarget: true, Target: 150, MaxEpisodes: 20000}
	sum, err := Run(ctx, Config{Spec: spec, Workers: 2, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if !sum.ReachedTarget || sum.TargetHeld == nil || sum.ConfirmEpisodes != 100 || sum.FinalEvalMean == nil {
		t.Fatalf("summary %+v", sum)
	}
	recs := readCurve(t, dir)
	last := recs[len(recs)-1]
	reached := recs[len(recs)-2]
	if last[len(last)-1] != "true" || last[8] != formatG(*sum.FinalEvalMean) || last[2] != reached[2] || last[0] != reached[0] ||
		strconv.FormatInt(sum.PolicyEpisodes, 10) != reached[2] {
		t.Fatalf("last curve row %v, summary eval %v", last, *sum.FinalEvalMean)
	}
	blob, err := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ars.DecodePolicy(blob)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Make("CartPole-v1")
	ev := ars.NewEvaluator(e, &p.Arch)
	it := &ars.Iteration{Seed: p.Seed, Iteration: p.Iteration, Hyper: p.Hyper, Theta: p.Theta, Filter: p.Filter()}
	var total float64
	for i := range 100 {
		total += ev.Run(it, ars.Task{Kind: ars.KindEval, Index: ars.ConfirmBase + i}).Return
	}
	if mean := total / 100; mean != *sum.FinalEvalMean {
		t.Fatalf("100 fresh episodes of the policy give %v, the summary reports %v", mean, *sum.FinalEvalMean)
	}
	if held := *sum.FinalEvalMean >= 150; held != *sum.TargetHeld {
		t.Fatalf("target_held %v for %v", *sum.TargetHeld, *sum.FinalEvalMean)
	}
}
