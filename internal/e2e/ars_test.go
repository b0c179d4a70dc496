package e2e

import (
	"bytes"

	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// arsArgs is the run both sides train: small enough for a loaded machine,
// long enough for a failover in its middle.
var arsArgs = []string{"--env", "CartPole-v1", "--seed", "11", "--directions", "8", "--top", "4",
	"--max-iterations", "24", "--eval-every", "3", "--eval-episodes", "8", "--no-progress"}

// curve is OUT/curve.csv without its clock columns (wall_seconds,
// hub_seconds), and its number of iterations.
func curve(t *testing.T, out string) (string, int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "curve.csv"))
	if err != nil {
		return "", 0
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	head := strings.Split(lines[0], ",")
	var sb strings.Builder
	for _, l := range lines {
		f := strings.Split(l, ",")
		for i := range head {
			if head[i] == "wall_seconds" || head[i] == "hub_seconds" || i >= len(f) {
				continue
			}
			sb.WriteString(f[i] + ",")
		}
		sb.WriteByte('\n')
	}
	return sb.String(), len(lines) - 1
}

// TestARSSurvivesTheMachinesDeath: the distributed ARS run of the
// three-machine deployment (`train ars --etcd` on c1, external `worker
// ars --etcd` on c1 and m2, every link on mutual TLS with tokens) goes on
// when the primary's machine dies in its middle (its link cut, every
// process on it SIGKILLed, a worker too if it ran there), and its final
// policy is byte-identical to an undisturbed run with the same seed (an
// embedded hub, two workers), its curve equal but for the clocks.
func TestARSSurvivesTheMachinesDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("a lab, two ARS runs")
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
	wantCurve, _ := curve(t, ref)

	d := newDeployment(t)
	for _, m := range d.machines {
		d.startHub(m)
	}
	l1, p1 := d.leader(0)
	client := func(role string) []string {
		return append(d.etcdFlags(), "--tls-ca", d.pki.pem("ca"), "--tls-cert", d.pki.pem("client"), "--tls-key", d.pki.pem("client-key"),
			"--token-file", d.pki.token(role))
	}
	for _, h := range []*testkit.Host{d.client, d.lab.Host(t, "m2")} {
		w := h.Start(t, testkit.ProcConfig{Name: "worker ars", Args: append([]string{"--log-level", "warn", "worker", "ars",
			"--name", "ext-" + h.Name, "--retry-for", "120s"}, client("worker")...)})
		d.procs[h.Name] = append(d.procs[h.Name], w)
		t.Cleanup(func() { w.Stop(syscall.SIGINT, 10*time.Second) })
	}
	out := t.TempDir()
	// Starting a run is an admin's call.
	train := d.client.Start(t, testkit.ProcConfig{Name: "train ars", Args: append(append([]string{"--log-level", "warn", "train", "ars",
		"--workers", "0", "--reconnect-window", "2m", "--out", out}, client("admin")...), arsArgs...)})
	testkit.Eventually(t, 5*time.Minute, "8 iterations before the machine dies", func() bool {
		if st := train.State(); st != nil {
			t.Fatalf("train ars ended (%v) before the death:\n%s", st, train.Output())
		}
		_, n := curve(t, out)
		return n >= 8
	})
	_, n := curve(t, out)
	died := d.die(p1.host)
	l2, _ := d.leader(l1.Epoch)
	t.Logf("%s died at iteration %d; %s serving %v later", p1.host.Name, n, l2, time.Since(died).Round(time.Millisecond))
	if st := train.Wait(t, 8*time.Minute); !st.Success() {
		t.Fatalf("train ars after the machine's death: %v\n%s", st, train.Output())
	}
	got, err := os.ReadFile(filepath.Join(out, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the final policy after the death (%d bytes) differs from the undisturbed run's (%d bytes)", len(got), len(want))
	}
	if g, _ := curve(t, out); g != wantCurve {
		t.Fatalf("curve.csv after the death:\n%s\nwant (undisturbed):\n%s", g, wantCurve)
	}
}
