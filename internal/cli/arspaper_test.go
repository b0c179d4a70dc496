package cli

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/mujoco"
	arsrun "github.com/rlhub/rlhub/internal/run"
)

// TestBenchARSPaperPlumbing runs the reproduction command on a tiny
// configuration (CartPole-v1, 2 seeds given as TASK:SEEDS, threshold 150, one worker process
// each), checks the report, then runs it again and checks that both seeds
// are reused and give the same report.
func TestBenchARSPaperPlumbing(t *testing.T) {
	useHelperWorkers(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--log-level", "warn", "bench", "ars-paper", "--tasks", "CartPole-v1:2", "--seeds", "5", "--workers", "1",
		"--threshold", "150", "--budget", "3000", "--out", dir}
	code, out, errOut := run(t, ctx, args...)
	if code != 0 {
		t.Fatalf("bench: code %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "ars-paper.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep paperReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Tasks) != 1 {
		t.Fatalf("tasks %d, want 1: %s", len(rep.Tasks), raw)
	}
	tr := rep.Tasks[0]
	if tr.Task != "CartPole-v1" || len(tr.PerSeed) != 2 || tr.PerSeed[0].Seed != 1 || tr.PerSeed[1].Seed != 2 ||
		tr.Threshold != 150 || tr.Budget != 3000 || tr.PaperEpisodes != 0 || tr.EnvSteps <= 0 || tr.StepsPerSecond <= 0 {
		t.Fatalf("report %s", raw)
	}
	if tr.Reached != 2 || tr.SuccessRate != 1 || tr.EpisodesMedian == nil || *tr.EpisodesMin > *tr.EpisodesMax ||
		*tr.EpisodesMedian != float64(tr.PerSeed[0].Episodes+tr.PerSeed[1].Episodes)/2 {
		t.Fatalf("CartPole should reach 150 on both seeds: %s", raw)
	}
	checkLinkedMuJoCo(t, rep.MuJoCo, rep.MuJoCoLibrary, raw)
	for _, s := range tr.PerSeed {
		seedDir := filepath.Join(dir, "CartPole-v1", "seed-"+strconv.FormatUint(s.Seed, 10))
		if _, err := os.Stat(filepath.Join(seedDir, "policy.safetensors")); err != nil {
			t.Error(err)
		}
		sraw, err := os.ReadFile(filepath.Join(seedDir, "summary.json"))
		if err != nil {
			t.Fatal(err)
		}
		var sum arsrun.Summary
		if err := json.Unmarshal(sraw, &sum); err != nil {
			t.Fatal(err)
		}
		checkLinkedMuJoCo(t, sum.MuJoCo, sum.MuJoCoLibrary, sraw)
	}
	md, err := os.ReadFile(filepath.Join(dir, "ars-paper.md"))
	if err != nil || !strings.Contains(string(md), "| CartPole-v1 | V2-t, 16, 8, 0.02, 0.03, 0 | 150 | — |") || !strings.Contains(out, "| CartPole-v1 |") {
		t.Fatalf("markdown %q (err %v), stdout %q", md, err, out)
	}

	code, out2, errOut := run(t, ctx, args...)
	if code != 0 || strings.Count(out2, "reusing") != 2 {
		t.Fatalf("second bench: code %d, want both seeds reused\nstdout %s\nstderr %s", code, out2, errOut)
	}
	raw2, _ := os.ReadFile(filepath.Join(dir, "ars-paper.json"))
	var rep2 paperReport
	if err := json.Unmarshal(raw2, &rep2); err != nil {
		t.Fatal(err)
	}
	if *rep2.Tasks[0].EpisodesMedian != *tr.EpisodesMedian || rep2.Tasks[0].EnvSteps != tr.EnvSteps {
		t.Errorf("reused report %s, first %s", raw2, raw)
	}
}

func TestBenchARSPaperRefusesUntunedTaskWithoutThreshold(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "bench", "ars-paper", "--tasks", "CartPole-v1", "--seeds", "1", "--out", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "--threshold") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}

func TestPaperTaskBudget(t *testing.T) {
	o := arsPaperOptions{budgetFactor: 2, threshold: math.NaN()}
	p, budget, err := o.paperTask("HalfCheetah-v5")
	if err != nil || p.Threshold != 3430 || budget != 3414 || p.Hyper.Directions != 32 || p.Hyper.Top != 4 {
		t.Fatalf("HalfCheetah-v5: %+v budget %d err %v", p, budget, err)
	}
}

// TestReusableSummary: an earlier run settles the outcome within a budget
// when it reached the threshold or ran at least the budget.
func TestReusableSummary(t *testing.T) {
	p, _ := ars.PaperFor("Swimmer-v5")
	target := p.Threshold
	for _, c := range []struct {
		name     string
		reached  bool
		episodes int64
		budget   int64
		want     bool
	}{
		{"reached below budget", true, 150, 200, true},
		{"reached above budget (a failure within it)", true, 300, 200, true},
		{"budget spent, same budget", false, 200, 200, true},
		{"budget spent, a budget the next iteration would still exceed", false, 200, 201, true},
		{"budget spent, larger new budget", false, 200, 202, false},
	} {
		dir := t.TempDir()
		sum := arsrun.Summary{Env: "Swimmer-v5", Seed: 3, Target: &target, Hyper: hyperStrings(p.Hyper), ReachedTarget: c.reached, Reason: reason(c.reached),
			Episodes: c.episodes, PolicyEpisodes: c.episodes, MuJoCo: mujoco.Version()}
		b, _ := json.Marshal(sum)
		os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644)
		if _, got := reusableSummary(dir, "Swimmer-v5", p, c.budget, 3); got != c.want {
			t.Errorf("%s: reusable %v, want %v", c.name, got, c.want)
		}
		other := sum
		other.MuJoCo = "1.31"
		b, _ = json.Marshal(other)
		os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644)
		if _, got := reusableSummary(dir, "Swimmer-v5", p, c.budget, 3); got {
			t.Errorf("%s: a summary of MuJoCo 1.31 reused by a binary of MuJoCo %q", c.name, mujoco.Version())
		}
		b, _ = json.Marshal(sum)
		os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644)
		if _, got := reusableSummary(dir, "Swimmer-v5", p, c.budget, 4); got {
			t.Errorf("%s: another seed's summary reused", c.name)
		}
		if r := seedResult(sum, c.budget, true); r.Reached != (c.reached && c.episodes <= c.budget) {
			t.Errorf("%s: seed result %+v", c.name, r)
		}
	}
}

func reason(reached bool) string {
	if reached {
		return "target"
	}
	return "budget"
}

// TestPartialReportCountsFinishedSeeds: the report written after each seed
// holds the finished tasks and the task in progress over the seeds it has
// finished, and leaves the in-progress result as it was.
func TestPartialReportCountsFinishedSeeds(t *testing.T) {
	dir := t.TempDir()
	rep := paperReport{Protocol: "paper", Tasks: []paperTaskResult{{Task: "Done-v0", Reached: 1}}}
	held := true
	conf := 3200.0
	cur := paperTaskResult{Task: "Hopper-v5", Threshold: 3120, PerSeed: []paperSeedResult{
		{Seed: 1, Reached: true, Episodes: 2000, ConfirmEval: &conf, Held: &held},
		{Seed: 2, Episodes: 3936},
	}}
	if err := writePartialReport(dir, rep, cur); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "ars-paper.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got paperReport
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Tasks) != 2 || got.Tasks[1].Task != "Hopper-v5" {
		t.Fatalf("report %s", raw)
	}
	h := got.Tasks[1]
	if h.Reached != 1 || h.Held != 1 || h.SuccessRate != 0.5 || len(h.Seeds) != 2 || h.EpisodesMedian == nil || *h.EpisodesMedian != 2000 {
		t.Fatalf("task in progress %+v", h)
	}
	if cur.Reached != 0 || cur.Seeds != nil || len(rep.Tasks) != 1 {
		t.Fatalf("writePartialReport changed its arguments: %+v %+v", cur, rep)
	}
}
