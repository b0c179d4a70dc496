package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// startStoreHub runs an in-process hub with a file-backed store on 127.0.0.1:0.
func startStoreHub(t *testing.T) string {
	t.Helper()
	h := hubtest.Start(t, hub.Config{DataDir: t.TempDir(), Logger: testkit.Logger()})
	return h.Addr().String()
}

func TestModelPushPullLs(t *testing.T) {
	addr := startStoreHub(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.safetensors")
	blob := storetest.Blob(t, 5, 3000)
	if err := os.WriteFile(in, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	code, out, errOut := run(t, ctx, "model", "push", "--hub", addr, "--name", "cartpole/policy", "--version", "3", "--expect", "0", in)
	if code != 0 || !strings.Contains(out, "pushed cartpole/policy v3") {
		t.Fatalf("push: code %d, out %q, err %q", code, out, errOut)
	}
	// A wrong expectation is refused with the current version named.
	code, _, errOut = run(t, ctx, "model", "push", "--hub", addr, "--name", "cartpole/policy", "--version", "4", "--expect", "2", in)
	if code == 0 || !strings.Contains(errOut, "at version 3") {
		t.Fatalf("stale push: code %d, stderr %q; want a failure naming version 3", code, errOut)
	}
	// A file that is not safetensors is refused before any network call.
	bad := filepath.Join(dir, "bad.safetensors")
	os.WriteFile(bad, []byte("not a model at all"), 0o644)
	if code, _, errOut = run(t, ctx, "model", "push", "--hub", addr, "--name", "x", "--version", "1", bad); code == 0 || !strings.Contains(errOut, "invalid") {
		t.Fatalf("bad file push: code %d, stderr %q", code, errOut)
	}
	outFile := filepath.Join(dir, "out.safetensors")
	code, out, errOut = run(t, ctx, "model", "pull", "--hub", addr, "--name", "cartpole/policy", "-o", outFile)
	if code != 0 || !strings.Contains(out, "pulled cartpole/policy v3") {
		t.Fatalf("pull: code %d, out %q, err %q", code, out, errOut)
	}
	if got, _ := os.ReadFile(outFile); !bytes.Equal(got, blob) {
		t.Fatal("pulled file differs from the pushed one")
	}
	if code, _, errOut = run(t, ctx, "model", "pull", "--hub", addr, "--name", "nope", "-o", outFile); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("pull unknown: code %d, stderr %q", code, errOut)
	}
	code, out, _ = run(t, ctx, "model", "ls", "--hub", addr)
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "cartpole/policy") || !strings.Contains(out, "  3  ") {
		t.Fatalf("ls: code %d, out %q", code, out)
	}
}

// TestModelRm: `model rm` deletes a model on a file-backed hub, from the
// listing and the pull, and the name takes a fresh version 1 afterwards;
// an unknown model is a clear failure.
func TestModelRm(t *testing.T) {
	addr := startStoreHub(t)
	in := filepath.Join(t.TempDir(), "in.safetensors")
	if err := os.WriteFile(in, storetest.Blob(t, 5, 30), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"doomed", "kept"} {
		if code, _, errOut := run(t, ctx, "model", "push", "--hub", addr, "--name", name, "--version", "9", in); code != 0 {
			t.Fatalf("push %s: %s", name, errOut)
		}
	}
	code, out, errOut := run(t, ctx, "model", "rm", "--hub", addr, "--name", "doomed")
	if code != 0 || !strings.Contains(out, "deleted doomed") {
		t.Fatalf("rm: code %d, out %q, err %q", code, out, errOut)
	}
	code, out, _ = run(t, ctx, "model", "ls", "--hub", addr)
	if code != 0 || strings.Contains(out, "doomed") || !strings.Contains(out, "kept") {
		t.Fatalf("ls after rm: code %d, out %q", code, out)
	}
	if code, _, errOut = run(t, ctx, "model", "rm", "--hub", addr, "--name", "doomed"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("second rm: code %d, stderr %q", code, errOut)
	}
	if code, _, errOut = run(t, ctx, "model", "push", "--hub", addr, "--name", "doomed", "--version", "1", "--expect", "0", in); code != 0 {
		t.Fatalf("push after rm: %s", errOut)
	}
}

// TestModelPythonFileRoundTrip pushes a file written by the reference
// Python library and checks the pulled file is byte-identical and loads in
// Python with the same values.
func TestModelPythonFileRoundTrip(t *testing.T) {
	if err := exec.Command("python3", "-c", "import numpy, safetensors.numpy").Run(); err != nil {
		t.Skipf("python3 with numpy and safetensors is not installed (scripts/setup.sh installs it): %v", err)
	}
	addr := startStoreHub(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "py.safetensors"), filepath.Join(dir, "back.safetensors")
	script := `
import sys, numpy as np
from safetensors.numpy import save_file, load_file
mode, path = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(3)
want = {
    "fc1.weight": rng.standard_normal((64, 17)).astype(np.float32),
    "fc1.bias": rng.standard_normal(64).astype(np.float16),
    "steps": np.arange(5, dtype=np.int64),
    "scalar": np.array(2.5, dtype=np.float64),
    "mask": np.array([1, 0, 1], dtype=np.uint8),
}
if mode == "save":
    save_file(want, path, metadata={"format": "np", "step": "12"})
else:
    got = load_file(path)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), k
`
	py := func(mode, path string) {
		t.Helper()
		cmd := exec.Command("python3", "-c", script, mode, path)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("python %s: %v\n%s", mode, err, b)
		}
	}
	py("save", in)
	ctx := context.Background()
	if code, _, errOut := run(t, ctx, "model", "push", "--hub", addr, "--name", "py", "--version", "1", in); code != 0 {
		t.Fatalf("push: %s", errOut)
	}
	if code, _, errOut := run(t, ctx, "model", "pull", "--hub", addr, "--name", "py", "--version", "1", "-o", out); code != 0 {
		t.Fatalf("pull: %s", errOut)
	}
	a, _ := os.ReadFile(in)
	b, _ := os.ReadFile(out)
	if !bytes.Equal(a, b) {
		t.Fatalf("pulled file (%d bytes) is not byte-identical to Python's (%d bytes)", len(b), len(a))
	}
	py("check", out)
}

// TestTimeoutMustBePositive: a --timeout of 0 or less expired the call's
// deadline before it started, and each command then blamed a live hub (or
// etcd): "list: context deadline exceeded", "cluster status: unavailable:
// cluster: etcd: context deadline exceeded". It is refused, naming the
// flag, before anything is dialed.
func TestTimeoutMustBePositive(t *testing.T) {
	addr := startStoreHub(t)
	in := filepath.Join(t.TempDir(), "in.safetensors")
	if err := os.WriteFile(in, storetest.Blob(t, 1, 4), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, args := range [][]string{
		{"model", "ls", "--hub", addr, "--timeout", "0"},
		{"model", "push", "--hub", addr, "--name", "m", "--version", "1", "--timeout", "-1s", in},
		{"reducer", "stats", "--hub", addr, "--timeout", "0"},
		{"aggregator", "status", "--hub", addr, "--timeout", "0"},
		{"ping", "--hub", addr, "--timeout", "0"},
		{"cluster", "status", "--etcd", "127.0.0.1:1", "--timeout", "0"},
	} {
		code, _, errOut := run(t, ctx, args...)
		if code == 0 || !strings.Contains(errOut, "rlhub: --timeout ") {
			t.Errorf("%s: exit %d, stderr %q; want --timeout refused", strings.Join(args, " "), code, strings.TrimSpace(errOut))
		}
	}
	// Nothing was pushed.
	if code, out, errOut := run(t, ctx, "model", "ls", "--hub", addr); code != 0 || strings.Contains(out, "\nm ") {
		t.Errorf("model ls: exit %d, out %q, err %q; want no model m", code, out, errOut)
	}
}
