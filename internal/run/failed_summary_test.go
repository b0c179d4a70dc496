package run

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A run that ends on a failure (here: diverged in iteration 1) writes
// policy.safetensors = θ after iteration 0's update, trained on that
// iteration's 2N episodes. summary.json must say so: one finished
// iteration and policy_training_episodes = the policy's episodes. The
// coordinator's failure entry (Iteration = the unfinished one,
// PolicyEpisodes unset) is summarised as if it were a finished iteration:
// iterations 2, policy_training_episodes 0.
func TestFailedRunSummaryDescribesThePolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	spec := &pb.ARSRunSpec{Env: "LQR", Seed: 1, StepSize: 1e300, MaxIterations: 5, EvalEvery: 1, EvalEpisodes: 2}
	sum, err := Run(ctx, Config{Spec: spec, Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger()})
	if err == nil || !strings.HasPrefix(sum.Reason, "diverged") {
		t.Fatalf("want a diverged run, got reason %q, err %v", sum.Reason, err)
	}
	blob, err := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := ars.DecodePolicy(blob)
	if err != nil {
		t.Fatal(err)
	}
	// θ after iteration pol.Iteration-1's update: pol.Iteration updates of 2N episodes each.
	trained := int64(pol.Iteration) * 2 * int64(pol.Hyper.Directions)
	read, _ := ReadSummary(dir)
	if read.PolicyEpisodes != trained {
		t.Errorf("summary policy_training_episodes %d; the written policy (%d updates, N = %d) was trained on %d episodes", read.PolicyEpisodes, pol.Iteration, pol.Hyper.Directions, trained)
	}
	if read.Iterations != pol.Iteration {
		t.Errorf("summary iterations %d; %d iteration(s) finished before the failure", read.Iterations, pol.Iteration)
	}
}
