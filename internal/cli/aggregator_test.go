package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// The example learner attaches to a served hub and `aggregator status`
// lists it.
func TestAggregatorStatusListsExampleLearner(t *testing.T) {
	addr := serveCLI(t)
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	type res struct {
		code int
		out  string
	}
	learnerDone := make(chan res, 1)
	go func() {
		code, out, _ := run(t, lctx, "--log-level", "error", "learner", "example", "--hub", addr, "--id", "ex1", "--batch-size", "4")
		learnerDone <- res{code, out}
	}()
	var out string
	testkit.Eventually(t, 60*time.Second, "aggregator status to list the learner ex1", func() bool {
		_, out, _ = run(t, context.Background(), "aggregator", "status", "--hub", addr, "--timeout", "20s")
		return strings.Contains(out, "ex1")
	})
	if !strings.Contains(out, "LEASE LEFT") || !strings.Contains(out, "kind=example") || !strings.Contains(out, "learners attached 1") {
		t.Errorf("status output %q", out)
	}
	lcancel()
	r := <-learnerDone
	if r.code != 0 || !strings.Contains(r.out, "attached ex1") {
		t.Errorf("learner exited %d with output %q", r.code, r.out)
	}
}

func TestAggregatorStatusNoHubFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "aggregator", "status", "--hub", freeAddr(t), "--timeout", "300ms")
	if code == 0 || !strings.Contains(errOut, "aggregator status") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}
