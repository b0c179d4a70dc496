package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/mujoco"
	arsrun "github.com/rlhub/rlhub/internal/run"
)

const helperEnv = "RLHUB_CLI_TEST_HELPER_PROCESS"

// TestHelperARSProcess is not a test: when train ars re-executes "itself"
// in these tests, it runs this test binary, which lands here and acts as
// the rlhub binary with the arguments after "--".
func TestHelperARSProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// useHelperWorkers makes train ars start this test binary as its workers.
func useHelperWorkers(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	old := selfCommand
	selfCommand = func() ([]string, error) { return []string{exe, "-test.run=^TestHelperARSProcess$", "--"}, nil }
	t.Cleanup(func() { selfCommand = old })
}

func TestTrainARSReachesTargetAndEval(t *testing.T) {
	useHelperWorkers(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--workers", "2",
		"--seed", "2", "--target", "475", "--out", dir)
	if code != 0 {
		t.Fatalf("train: code %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if !strings.Contains(out, "CartPole-v1 seed 2: target") || !strings.Contains(errOut, "eval") {
		t.Errorf("stdout %q, stderr (progress) %q", out, errOut)
	}
	var sum arsrun.Summary
	raw, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.ReachedTarget || sum.TargetHeld == nil || sum.FinalEvalMean == nil || *sum.FinalEvalMean < 475 != !*sum.TargetHeld || sum.Workers != 2 || sum.Steps == 0 || sum.Protocol != "paper" {
		t.Fatalf("summary %s", raw)
	}
	checkLinkedMuJoCo(t, sum.MuJoCo, sum.MuJoCoLibrary, raw)
	f, err := os.Open(filepath.Join(dir, "curve.csv"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	// header, one row per iteration, the re-evaluation on fresh episodes
	if err != nil || len(recs) != int(sum.Iterations)+2 || recs[0][0] != "iteration" || recs[len(recs)-1][len(recs[0])-1] != "true" {
		t.Fatalf("curve.csv: %v, %d rows for %d iterations", err, len(recs), sum.Iterations)
	}
	png, err := os.ReadFile(filepath.Join(dir, "curve.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("curve.png: %v", err)
	}
	blob, err := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ars.DecodePolicy(blob)
	if err != nil || p.Env != "CartPole-v1" || p.Stats.Count == 0 {
		t.Fatalf("policy: %v %+v", err, p)
	}

	code, out, errOut = run(t, ctx, "eval", "--policy", filepath.Join(dir, "policy.safetensors"), "--episodes", "20")
	if code != 0 || !strings.Contains(out, "over 20 episodes") || !strings.Contains(out, "±") {
		t.Fatalf("eval: code %d, %q %q", code, out, errOut)
	}
	code, _, errOut = run(t, ctx, "eval", "--policy", filepath.Join(dir, "policy.safetensors"), "--env", "Acrobot-v1")
	if code == 0 {
		t.Fatalf("eval on a mismatched env succeeded: %q", errOut)
	}
}

// checkLinkedMuJoCo: a run records the MuJoCo its workers (this binary)
// link — release and library file — and nothing in a build without it.
func checkLinkedMuJoCo(t *testing.T, version, library string, raw []byte) {
	t.Helper()
	if version != mujoco.Version() || library != mujoco.Library() {
		t.Fatalf("recorded MuJoCo %q from %q, this binary links %q from %q: %s", version, library, mujoco.Version(), mujoco.Library(), raw)
	}
	if !mujoco.Available {
		if bytes.Contains(raw, []byte(`"mujoco`)) {
			t.Fatalf("a build without MuJoCo recorded one: %s", raw)
		}
		return
	}
	if fi, err := os.Stat(library); version == "" || err != nil || !fi.Mode().IsRegular() || !strings.HasPrefix(filepath.Base(library), "libmujoco") {
		t.Fatalf("recorded MuJoCo %q from %q: %v", version, library, err)
	}
}

// The same seed gives byte-identical policy files with 1 and 2 worker
// processes.
func TestTrainARSSameResultWithOneAndTwoWorkerProcesses(t *testing.T) {
	useHelperWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var blobs [][]byte
	for _, n := range []string{"1", "2"} {
		dir := t.TempDir()
		code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--workers", n,
			"--seed", "9", "--max-iterations", "4", "--eval-every", "2", "--out", dir, "--no-progress")
		if code != 0 {
			t.Fatalf("workers %s: code %d %q %q", n, code, out, errOut)
		}
		b, err := os.ReadFile(filepath.Join(dir, "policy.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, b)
	}
	if !bytes.Equal(blobs[0], blobs[1]) {
		t.Fatal("policy.safetensors differs between 1 and 2 worker processes")
	}
}

func TestTrainARSBadFlags(t *testing.T) {
	ctx := context.Background()
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "summary.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, ctx, "train", "ars", "--env", "CartPole-v1", "--out", used)
	if b, _ := os.ReadFile(filepath.Join(used, "summary.json")); code == 0 || string(b) != "{}" || !strings.Contains(errOut, "--overwrite") {
		t.Errorf("train into a used --out: code %d, %q, summary %q", code, errOut, b)
	}
	for _, args := range [][]string{
		{"train", "ars", "--env", "Nope-v0", "--out", t.TempDir()},
		{"train", "ars", "--env", "CartPole-v1"},
		{"train", "ars", "--env", "CartPole-v1", "--workers", "0", "--out", t.TempDir()},
		{"train", "ars", "--env", "CartPole-v1", "--hidden", "0", "--out", t.TempDir()},
		{"train", "ars", "--env", "CartPole-v1", "--version", "V2", "--directions", "8", "--top", "4", "--out", t.TempDir()},
		{"train", "ars", "--env", "CartPole-v1", "--max-episodes", "3", "--out", t.TempDir()},
		// An env only Python workers run needs --hub and --workers 0, and
		// one kind of action space.
		{"train", "ars", "--env", "user/Grid-v0", "--obs-dim", "3", "--discrete", "2", "--out", t.TempDir()},
		{"train", "ars", "--env", "user/Grid-v0", "--obs-dim", "3", "--discrete", "2", "--act-dim", "1", "--hub", "127.0.0.1:1", "--workers", "0", "--out", t.TempDir()},
		{"eval", "--policy", filepath.Join(t.TempDir(), "missing.safetensors")},
		{"train", "ars", "--env", "CartPole-v1", "--out", t.TempDir(), "--resume", "--overwrite"},
		{"train", "ars", "--env", "CartPole-v1", "--out", t.TempDir(), "--resume"},
	} {
		if code, _, _ := run(t, ctx, args...); code == 0 {
			t.Errorf("%v succeeded", args)
		}
	}
}

// When every worker process dies, train fails instead of waiting forever.
func TestTrainARSFailsWhenWorkersDie(t *testing.T) {
	old := selfCommand
	selfCommand = func() ([]string, error) { return []string{"/bin/false"}, nil }
	t.Cleanup(func() { selfCommand = old })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--workers", "2", "--out", t.TempDir(), "--no-progress")
	if code == 0 || !strings.Contains(errOut, "every worker process exited") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	if ctx.Err() != nil {
		t.Fatal("train did not notice before the deadline")
	}
}

// Every run writes its resolved configuration; `--config OUT/config.yaml`
// replays it to a byte-identical policy; flags override the file; unknown
// keys are refused with a clear error.
func TestTrainARSRunFileReplays(t *testing.T) {
	useHelperWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	first := t.TempDir()
	cfgPath := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(cfgPath, []byte("env: CartPole-v1\nseed: 4\nmax_iterations: 3\neval_every: 2\neval_episodes: 3\nworkers: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--config", cfgPath, "--directions", "6", "--out", first, "--no-progress")
	if code != 0 {
		t.Fatalf("train: code %d %q %q", code, out, errOut)
	}
	resolved, err := os.ReadFile(filepath.Join(first, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"env: CartPole-v1", "seed: 4", "directions: 6", "protocol: paper", "eval_every: 2", "workers: 1", "version: V2-t"} {
		if !strings.Contains(string(resolved), want+"\n") {
			t.Errorf("config.yaml lacks %q:\n%s", want, resolved)
		}
	}
	second := t.TempDir()
	code, out, errOut = run(t, ctx, "--log-level", "warn", "train", "ars", "--config", filepath.Join(first, "config.yaml"), "--out", second, "--no-progress")
	if code != 0 {
		t.Fatalf("replay: code %d %q %q", code, out, errOut)
	}
	a, _ := os.ReadFile(filepath.Join(first, "policy.safetensors"))
	b, _ := os.ReadFile(filepath.Join(second, "policy.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatal("the replayed run's policy differs")
	}
	if again, _ := os.ReadFile(filepath.Join(second, "config.yaml")); !bytes.Equal(again, resolved) {
		t.Errorf("replay resolved to\n%s\nnot\n%s", again, resolved)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("env: CartPole-v1\nstep_szie: 0.1\n"), 0o644)
	dir := t.TempDir()
	code, _, errOut = run(t, ctx, "train", "ars", "--config", bad, "--out", dir)
	if code == 0 || !strings.Contains(errOut, "step_szie") || !strings.Contains(errOut, "not found") {
		t.Fatalf("unknown key: code %d, %q", code, errOut)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused run file wrote %d files", len(ents))
	}
}

// --optimizer, its hyper-parameters, --lr-schedule and --gradient-max reach
// the run, OUT/config.yaml and summary.json, and the replay is
// byte-identical; a flag given with --config overrides the file's field.
func TestTrainARSOptimizerFlagsReplay(t *testing.T) {
	useHelperWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	first := t.TempDir()
	code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--env", "CartPole-v1", "--seed", "4", "--max-iterations", "3",
		"--eval-every", "2", "--eval-episodes", "3", "--workers", "1", "--optimizer", "adam", "--beta1", "0.8",
		"--lr-schedule", "cosine", "--lr-t-max", "4", "--lr-warmup-steps", "1", "--gradient-max", "0.5", "--out", first, "--no-progress")
	if code != 0 {
		t.Fatalf("train: code %d %q %q", code, out, errOut)
	}
	resolved, err := os.ReadFile(filepath.Join(first, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: adam", "beta1: 0.8", "beta2: 0.999", "schedule: cosine", "t_max: 4", "warmup_steps: 1", "gradient_max: 0.5"} {
		if !strings.Contains(string(resolved), want+"\n") {
			t.Errorf("config.yaml lacks %q:\n%s", want, resolved)
		}
	}
	sum, err := arsrun.ReadSummary(first)
	if err != nil || sum.Optimizer == nil || sum.Optimizer.Kind != "adam" || sum.Optimizer.Beta1 != 0.8 || sum.GradientMax != 0.5 {
		t.Fatalf("summary optimizer %+v (%v)", sum.Optimizer, err)
	}
	second := t.TempDir()
	if code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--config", filepath.Join(first, "config.yaml"), "--out", second, "--no-progress"); code != 0 {
		t.Fatalf("replay: code %d %q %q", code, out, errOut)
	}
	a, _ := os.ReadFile(filepath.Join(first, "policy.safetensors"))
	b, _ := os.ReadFile(filepath.Join(second, "policy.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatal("the replayed run's policy differs")
	}
	third := t.TempDir()
	if code, out, errOut := run(t, ctx, "--log-level", "warn", "train", "ars", "--config", filepath.Join(first, "config.yaml"), "--beta1", "0.5", "--out", third, "--no-progress"); code != 0 {
		t.Fatalf("override: code %d %q %q", code, out, errOut)
	}
	if again, _ := os.ReadFile(filepath.Join(third, "config.yaml")); !strings.Contains(string(again), "beta1: 0.5\n") || !strings.Contains(string(again), "kind: adam\n") {
		t.Errorf("--beta1 over the file resolved to\n%s", again)
	}
	for _, args := range [][]string{
		{"--optimizer", "lion"}, {"--optimizer", "step", "--momentum", "0.9"}, {"--gradient-max", "-1"},
		{"--lr-schedule", "cosine"}, {"--optimizer", "adam", "--momentum", "0.9"},
	} {
		argv := append([]string{"train", "ars", "--env", "CartPole-v1", "--out", t.TempDir()}, args...)
		if code, _, _ := run(t, ctx, argv...); code == 0 {
			t.Errorf("%v succeeded", args)
		}
	}
}
