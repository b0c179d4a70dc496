package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestReducerStatsAndRoleFlags: `rlhub reducer stats` prints the counters
// of a served hub; --role reducer without --primary is refused.
func TestReducerStatsAndRoleFlags(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "serve", "--role", "reducer", "--listen", "127.0.0.1:0", "--data", "")
	if code == 0 || !strings.Contains(errOut, "--primary") {
		t.Fatalf("serve --role reducer without --primary: code %d, stderr %q", code, errOut)
	}
	addr := serveCLI(t, "--reducer-secondaries", "2")
	var out string
	testkit.Eventually(t, 20*time.Second, "reducer stats to answer", func() bool {
		var c int
		c, out, errOut = run(t, context.Background(), "reducer", "stats", "--hub", addr, "--timeout", "2s")
		return c == 0
	})
	for _, want := range []string{"total", "primary", "secondary/s0", "secondary/s1", "pushed 0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stats output lacks %q:\n%s\nstderr %s", want, out, errOut)
		}
	}
}

// TestReducerStatsShowsLostStateAndUnreachableHubs: a model whose optimizer
// state was not recovered and a secondary hub that did not answer are
// spelled out, not hidden in the totals.
func TestReducerStatsShowsLostStateAndUnreachableHubs(t *testing.T) {
	var out strings.Builder
	g := &globals{stdout: &out}
	printReducerStats(g, &rlhubv1.ReducerStatsResponse{
		Total: &rlhubv1.ReducerCounters{Pushed: 3, Attempts: 7, Applied: 3},
		Models: map[string]*rlhubv1.ReducerModelStats{"m": {Version: 9, OptimizerSteps: 2,
			StateError: "no optimizer state for version 9"}},
		Unreachable: map[string]string{"127.0.0.1:7480": "deadline exceeded"},
	})
	for _, want := range []string{"attempts 7", "model m at version 9, optimizer step 2",
		"OPTIMIZER STATE NOT RECOVERED: no optimizer state for version 9", "127.0.0.1:7480 UNREACHABLE"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// README's secondary-reducer line, run in the directory of a hub on the
// default --data rlhub-data: the secondary keeps nothing on disk, so it
// starts beside the hub. It used to open rlhub-data/store too and exit
// "store: rlhub-data/store is in use by another process".
func TestSecondaryReducerStartsBesideAHubOnTheDefaultData(t *testing.T) {
	t.Chdir(t.TempDir())
	addrFile := filepath.Join(t.TempDir(), "addr")
	stopHub := runInBackground(t, "serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile)
	var addr string
	testkit.Eventually(t, 30*time.Second, "the hub to write its address", func() bool {
		b, err := os.ReadFile(addrFile)
		addr = strings.TrimSpace(string(b))
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	if _, err := os.Stat(filepath.Join("rlhub-data", "store")); err != nil {
		t.Fatalf("the hub on the default --data: %v", err)
	}
	stopSecondary := runInBackground(t, "serve", "--role", "reducer", "--primary", addr, "--listen", "127.0.0.1:0")
	testkit.Eventually(t, 30*time.Second, "the secondary to attach to the hub", func() bool {
		code, out, _ := run(t, context.Background(), "reducer", "stats", "--hub", addr, "--timeout", "2s")
		return code == 0 && strings.Contains(out, "secondary/127.0.0.1:")
	})
	if code, stderr := stopSecondary(); code != 0 {
		t.Fatalf("serve --role reducer exited %d: %s", code, stderr)
	}
	if code, stderr := stopHub(); code != 0 {
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
}
