package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// TestReducerRegister: `rlhub reducer register` registers a model with a
// new optimizer and a chained schedule; the same config again is a no-op,
// another one AlreadyExists, a nonsensical one InvalidArgument.
func TestReducerRegister(t *testing.T) {
	addr := startStoreHub(t)
	ctx := context.Background()
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 3))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "w.safetensors")
	if err := os.WriteFile(in, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, ctx, "model", "push", "--hub", addr, "--name", "m", "--version", "1", "--expect", "0", in); code != 0 {
		t.Fatalf("model push: %s", errOut)
	}
	args := []string{"reducer", "register", "--hub", addr, "--model", "m", "--optimizer", "nadam", "--lr", "0.01",
		"--decoupled-weight-decay", "--weight-decay", "0.1", "--schedule", "cosine", "--t-max", "10", "--min-lr", "0.001", "--warmup-steps", "3"}
	code, out, errOut := run(t, ctx, args...)
	if code != 0 || !strings.Contains(out, "registered m at version 1 (optimizer nadam") {
		t.Fatalf("register: code %d, out %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := run(t, ctx, args...); code != 0 {
		t.Fatalf("same config again: %s", errOut)
	}
	code, _, errOut = run(t, ctx, "reducer", "register", "--hub", addr, "--model", "m", "--optimizer", "radam", "--lr", "0.01")
	if code == 0 || !strings.Contains(errOut, "already exists") {
		t.Fatalf("another config: code %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, ctx, "reducer", "register", "--hub", addr, "--model", "m", "--optimizer", "adagrad", "--lr", "0.1", "--beta1", "0.9")
	if code == 0 || !strings.Contains(errOut, "beta1 does not apply") {
		t.Fatalf("adagrad with beta1: code %d, stderr %q", code, errOut)
	}
}
