package arsrpc

import (
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/ars"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// ARS with Adam, a warm-up + cosine schedule and gradient clipping gives
// the single-process policy bit for bit with 1, 2 and 3 workers.
func TestOptimizerRunBitIdenticalAcrossWorkerCounts(t *testing.T) {
	spec := runSpec()
	spec.Optimizer = &pb.ReducerOptimizer{Kind: "adam", Schedule: "cosine", TMax: 5, WarmupSteps: 2}
	spec.GradientMax = 0.5
	ref := localReference(t, spec)
	plain := localReference(t, runSpec())
	if slices.Equal(ref.Theta(), plain.Theta()) {
		t.Fatal("adam gave the paper step's θ")
	}
	for n := 1; n <= 3; n++ {
		p, prog := distributed(t, spec, n, Config{})
		if !slices.Equal(p.Theta, ref.Theta()) || !slices.Equal(p.Stats.M2, ref.Stats().M2) {
			t.Errorf("%d workers: policy differs from the single-process run", n)
		}
		if !prog[len(prog)-1].Done {
			t.Errorf("%d workers: run did not end", n)
		}
	}
	// The hub normalised the optimizer (defaults filled, lr left to step_size).
	s, _, err := Normalise(spec)
	if err != nil || s.Optimizer.Kind != "adam" || s.Optimizer.Beta2 != 0.999 || s.Optimizer.Lr != 0 {
		t.Fatalf("normalised optimizer %v, %v", s.GetOptimizer(), err)
	}
	d, _, _ := Normalise(runSpec())
	if d.Optimizer.GetKind() != string(ars.PaperStep) {
		t.Fatalf("default optimizer %v", d.GetOptimizer())
	}
	bad := runSpec()
	bad.Optimizer = &pb.ReducerOptimizer{Kind: "adam", Lr: 3}
	if _, _, err := Normalise(bad); err == nil {
		t.Fatal("an optimizer lr apart from step_size was accepted")
	}
}
