package replica_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// arsArgs is the run both sides train: small enough for a loaded machine,
// long enough for two failovers.
var arsArgs = []string{"--env", "CartPole-v1", "--seed", "11", "--directions", "8", "--top", "4",
	"--max-iterations", "40", "--eval-every", "3", "--eval-episodes", "8", "--no-progress"}

// curveRows counts the iterations recorded in OUT/curve.csv.
func curveRows(out string) int {
	b, err := os.ReadFile(filepath.Join(out, "curve.csv"))
	if err != nil {
		return 0
	}
	return max(0, strings.Count(string(b), "\n")-1)
}

// TestARSRunSurvivesTwoPrimaryKills: one etcd, three hubs, two external
// `worker ars` processes and `train ars`, all given only the cluster
// (etcd). The primary is SIGKILLed twice during the run; each time a
// standby takes over from its replicated run state, the run finishes, and
// the final policy is byte-identical to an undisturbed run with the same
// seed (an embedded hub), and curve.csv has every iteration exactly once
// with the undisturbed run's values (all but the clocks).
func TestARSRunSurvivesTwoPrimaryKills(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs, two workers and two ARS runs")
	}
	ref := t.TempDir()
	undisturbed := testkit.StartProc(t, testkit.ProcConfig{Name: "undisturbed train ars",
		Args: append([]string{"--log-level", "warn", "train", "ars", "--workers", "2", "--out", ref}, arsArgs...)})
	if st := undisturbed.Wait(t, 10*time.Minute); !st.Success() {
		t.Fatalf("undisturbed run: %v\n%s", st, undisturbed.Output())
	}
	want, err := os.ReadFile(filepath.Join(ref, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}

	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	l1, p1 := c.leader(0)
	for i := range 2 {
		w := testkit.StartProc(t, testkit.ProcConfig{Name: fmt.Sprintf("worker %d", i), Args: []string{"--log-level", "warn", "worker", "ars",
			"--etcd", e.Endpoint, "--cluster", c.name, "--name", fmt.Sprintf("ext-%d", i), "--retry-for", "120s"}})
		t.Cleanup(func() { w.Stop(syscall.SIGINT, 10*time.Second) })
	}
	out := t.TempDir()
	train := testkit.StartProc(t, testkit.ProcConfig{Name: "train ars", Args: append([]string{"--log-level", "warn", "train", "ars",
		"--etcd", e.Endpoint, "--cluster", c.name, "--workers", "0", "--reconnect-window", "2m", "--out", out}, arsArgs...)})

	ended := func() bool {
		if st := train.State(); st != nil {
			t.Fatalf("train ars ended (%v) before both kills:\n%s", st, train.Output())
		}
		return false
	}
	testkit.Eventually(t, 3*time.Minute, "10 iterations before the first kill", func() bool { return !ended() && curveRows(out) >= 10 })
	p1.kill()
	l2, p2 := c.leader(l1.Epoch)
	testkit.Eventually(t, 3*time.Minute, "20 iterations before the second kill", func() bool { return !ended() && curveRows(out) >= 20 })
	p2.kill()
	c.leader(l2.Epoch)
	if st := train.Wait(t, 5*time.Minute); !st.Success() {
		t.Fatalf("train ars after two failovers: %v\n%s", st, train.Output())
	}
	got, err := os.ReadFile(filepath.Join(out, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the final policy after two failovers (%d bytes) differs from the undisturbed run's (%d bytes)", len(got), len(want))
	}
	// The curve: every iteration exactly once, and each row equal to the
	// undisturbed run's but for the clocks.
	if g, w := curveWithoutClocks(t, out), curveWithoutClocks(t, ref); g != w {
		t.Fatalf("curve.csv after two failovers:\n%s\nwant (undisturbed):\n%s", g, w)
	}
}

// curveWithoutClocks is OUT/curve.csv without its wall_seconds and
// hub_seconds columns.
func curveWithoutClocks(t *testing.T, out string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "curve.csv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	head := strings.Split(lines[0], ",")
	var keep []int
	for i, h := range head {
		if h != "wall_seconds" && h != "hub_seconds" {
			keep = append(keep, i)
		}
	}
	var sb strings.Builder
	for _, l := range lines {
		f := strings.Split(l, ",")
		for j, i := range keep {
			if j > 0 {
				sb.WriteByte(',')
			}
			if i < len(f) {
				sb.WriteString(f[i])
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
