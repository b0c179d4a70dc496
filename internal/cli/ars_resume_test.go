package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTrainARSResumeKeepsTheRunsSettings: README's resume line,
// `train ars --env CartPole-v1 --out runs/cartpole --resume`, continues
// the run recorded in OUT (the hub keeps its spec), so OUT/config.yaml
// and summary.json must go on describing that run: its seed, directions,
// evaluation and target, not the flags' defaults. Before, they were
// rewritten from the defaults (seed 1, 16 directions, no target), the
// summary said "(below the target)", and `--config OUT/config.yaml`
// replayed another run.
func TestTrainARSResumeKeepsTheRunsSettings(t *testing.T) {
	useHelperWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--seed", "4", "--max-iterations", "3",
		"--eval-every", "2", "--eval-episodes", "3", "--directions", "6", "--workers", "1", "--target", "400", "--out", dir, "--no-progress")
	if code != 0 {
		t.Fatalf("train: code %d %q %q", code, out, errOut)
	}
	before, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--out", dir, "--resume", "--workers", "1", "--no-progress")
	if code != 0 {
		t.Fatalf("resume: code %d %q %q", code, out, errOut)
	}
	if strings.Contains(out, "below the target") || !strings.Contains(out, "seed 4") {
		t.Errorf("resume printed %q; the run has seed 4 and held its target", strings.TrimSpace(out))
	}
	after, _ := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if !bytes.Equal(before, after) {
		t.Errorf("--resume rewrote config.yaml from\n%s\nto\n%s", before, after)
	}
	var sum struct {
		Seed   uint64   `json:"seed"`
		Target *float64 `json:"target"`
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Seed != 4 || sum.Target == nil || *sum.Target != 400 {
		t.Errorf("summary.json after --resume: seed %d, target %v; want 4 and 400", sum.Seed, sum.Target)
	}
}
