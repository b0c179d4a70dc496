package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	arsrun "github.com/rlhub/rlhub/internal/run"
)

// `train ars --out DIR --resume` continues the run the hub holds, with
// the spec it started with. A spec flag given with --resume (here
// --seed 9 --directions 10) cannot change that run, yet it is written to
// OUT/config.yaml and summary.json: they then describe another run than
// OUT/policy.safetensors, and `--config OUT/config.yaml` (documented to
// replay the run byte for byte) trains a different policy.
func TestTrainARSResumeWithSpecFlagsKeepsOutputsTrue(t *testing.T) {
	useHelperWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--seed", "4", "--max-iterations", "3",
		"--eval-every", "2", "--eval-episodes", "3", "--directions", "6", "--workers", "1", "--out", dir, "--no-progress")
	if code != 0 {
		t.Fatalf("train: code %d %q %q", code, out, errOut)
	}
	code, out, errOut = run(t, ctx, "--log-level", "warn", "train", "ars", "--out", dir, "--resume", "--seed", "9", "--directions", "10",
		"--workers", "1", "--no-progress")
	if code != 0 {
		// Refusing is fine when it says why and leaves the outputs alone.
		sum, err := arsrun.ReadSummary(dir)
		if !strings.Contains(errOut, "--resume") || err != nil || sum.Seed != 4 {
			t.Errorf("resume refused with %q; summary seed %d (%v)", errOut, sum.Seed, err)
		}
	}
	if code == 0 {
		// Accepting the flags is fine only if the outputs still describe
		// the run the hub continued.
		blob, _ := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
		pol, err := ars.DecodePolicy(blob)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := arsrun.ReadSummary(dir)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Seed != pol.Seed {
			t.Errorf("summary.json seed %d, but policy.safetensors was trained with seed %d (%d directions)", sum.Seed, pol.Seed, pol.Hyper.Directions)
		}
		replay := t.TempDir()
		if code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--config", filepath.Join(dir, "config.yaml"), "--out", replay, "--no-progress"); code != 0 {
			t.Fatalf("replay: code %d %q %q", code, out, errOut)
		}
		b, _ := os.ReadFile(filepath.Join(replay, "policy.safetensors"))
		if !bytes.Equal(blob, b) {
			cfg, _ := os.ReadFile(filepath.Join(dir, "config.yaml"))
			t.Errorf("--config OUT/config.yaml does not replay OUT/policy.safetensors; config.yaml:\n%s", cfg)
		}
	}
}
