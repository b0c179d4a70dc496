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
	// The learner's stdout is read while it runs: the aggregator lists a
	// learner on its Hello, before the learner has the Welcome and prints
	// "attached", so cancelling as soon as status lists it could stop the
	// learner between the two.
	var lout, lerr testkit.Buffer
	learnerDone := make(chan int, 1)
	go func() {
		learnerDone <- Run(lctx, []string{"--log-level", "error", "learner", "example", "--hub", addr, "--id", "ex1", "--batch-size", "4"}, &lout, &lerr)
	}()
	var out string
	testkit.Eventually(t, 60*time.Second, "aggregator status to list the learner ex1", func() bool {
		_, out, _ = run(t, context.Background(), "aggregator", "status", "--hub", addr, "--timeout", "20s")
		return strings.Contains(out, "ex1")
	})
	if !strings.Contains(out, "LEASE LEFT") || !strings.Contains(out, "kind=example") || !strings.Contains(out, "learners attached 1") {
		t.Errorf("status output %q", out)
	}
	testkit.Eventually(t, 30*time.Second, "the learner to print that it attached", func() bool {
		return strings.Contains(lout.String(), "attached ex1")
	})
	lcancel()
	if code := <-learnerDone; code != 0 {
		t.Errorf("learner exited %d on cancel; stdout %q, stderr %q", code, lout.String(), lerr.String())
	}
}

func TestAggregatorStatusNoHubFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "aggregator", "status", "--hub", freeAddr(t), "--timeout", "300ms")
	if code == 0 || !strings.Contains(errOut, "aggregator status") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}
