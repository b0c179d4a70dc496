package run

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// An interrupt (SIGINT/SIGTERM of `train ars`: ctx cancelled) after some
// iterations finished still writes the outputs, as Run promises: the
// final policy pull and the writes run under a bounded context of their
// own (they used to run under the cancelled one and fail at once).
func TestInterruptedRunWritesOutputs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	ictx, stop := context.WithCancel(ctx)
	sum, err := Run(ictx, Config{Spec: cartPole(7, 50), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger(),
		Observer: ObserverFunc(func(it Iteration) {
			if it.Iteration == 2 {
				stop()
			}
		})})
	stop()
	t.Logf("Run: summary run id %q, reason %q, err %v", sum.RunID, sum.Reason, err)
	if err == nil {
		t.Error("an interrupted run returned no error")
	}
	for _, f := range []string{"curve.csv", "curve.png", "policy.safetensors", "summary.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("after 3 finished iterations and an interrupt: %v", err)
		}
	}
	if sum.RunID == "" || sum.Reason != "interrupted" || sum.Iterations < 3 {
		t.Errorf("summary %+v, want the run's, stop reason \"interrupted\"", sum)
	}
}

// An LQR run whose gain ends unstable (two iterations from seed 1) has an
// infinite average cost, which JSON cannot hold: summary.json is still
// written, saying the gain is unstable (the run failed at its very end on
// "json: unsupported value: +Inf" before).
func TestUnstableLQRGainStillWritesTheSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	spec := &pb.ARSRunSpec{Env: "LQR", Seed: 1, MaxIterations: 2, EvalEvery: 2, EvalEpisodes: 1}
	sum, err := Run(ctx, Config{Spec: spec, Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger()})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	read, err := ReadSummary(dir)
	if err != nil {
		t.Fatalf("summary.json: %v", err)
	}
	if !sum.LQRUnstable || !read.LQRUnstable || read.LQRRelativeCost != nil {
		t.Fatalf("summary: unstable %v (read back %v), relative cost %v; want an unstable gain after 2 iterations from seed 1", sum.LQRUnstable, read.LQRUnstable, read.LQRRelativeCost)
	}
}
