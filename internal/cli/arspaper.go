package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/mujoco"
	arsrun "github.com/rlhub/rlhub/internal/run"
)

func newBenchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Long-running experiments that report tables",
	}
	cmd.AddCommand(newBenchARSPaperCmd(g))
	return cmd
}

// arsPaperOptions are `bench ars-paper`'s flags.
type arsPaperOptions struct {
	tasks        []string
	seeds        int
	firstSeed    uint64
	workers      int
	budgetFactor float64
	out          string
	// threshold and budget apply to tasks the paper does not tune (the
	// command's own tests run CartPole-v1 with them).
	threshold float64
	budget    int64
	protocol  string
}

func newBenchARSPaperCmd(g *globals) *cobra.Command {
	var o arsPaperOptions
	cmd := &cobra.Command{
		Use:   "ars-paper",
		Short: "Reproduce the ARS paper's Table 1 on Gymnasium's v5 MuJoCo tasks",
		Long: "bench ars-paper runs, for each --tasks task and each seed in turn, a full\n" +
			"distributed `train ars` (embedded hub, --workers worker processes) with the\n" +
			"paper's hyperparameters (Mania, Guy & Recht 2018, appendix; internal/ars\n" +
			"PaperFor), stopping at the paper's Table 1 threshold or after the budget\n" +
			"(--budget-factor × the paper's episodes to threshold). It then writes\n" +
			"OUT/ars-paper.md and OUT/ars-paper.json: per task the training episodes to\n" +
			"threshold (median, min, max over the seeds that reached it), the success\n" +
			"rate within the budget, wall time and env steps/s, next to the paper's\n" +
			"numbers. Each run keeps its own OUT/TASK/seed-S/ (curve, policy,\n" +
			"summary); a seed whose summary.json is already there with the same task,\n" +
			"hyperparameters, threshold and MuJoCo release, and whose outcome within\n" +
			"the budget it decides, is reused, so an interrupted benchmark resumes.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("threshold") {
				o.threshold = math.NaN()
			}
			return benchARSPaper(cmd.Context(), g, &o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.tasks, "tasks", []string{"Swimmer-v5", "HalfCheetah-v5", "Hopper-v5"}, "tasks in order, each TASK or TASK:SEEDS (overrides --seeds); paper tasks: "+strings.Join(ars.PaperTasks, ","))
	f.IntVar(&o.seeds, "seeds", 10, "seeds per task")
	f.Uint64Var(&o.firstSeed, "first-seed", 1, "seeds are first-seed, first-seed+1, …")
	f.IntVar(&o.workers, "workers", 2, "worker processes per run")
	f.Float64Var(&o.budgetFactor, "budget-factor", 2, "episode budget per run, as a multiple of the paper's episodes to threshold")
	f.StringVar(&o.out, "out", "", "output directory")
	f.StringVar(&o.protocol, "protocol", "paper", "evaluation protocol of every run: paper (every 10 iterations over 100 episodes) or fast (the per-env defaults); the report says which")
	f.Float64Var(&o.threshold, "threshold", 0, "threshold for a task the paper does not tune (all such tasks)")
	f.Int64Var(&o.budget, "budget", 0, "episode budget for a task the paper does not tune")
	cmd.MarkFlagRequired("out")
	return cmd
}

// paperTaskResult is one task's row of the report (OUT/ars-paper.json).
type paperTaskResult struct {
	Task  string            `json:"task"`
	Hyper map[string]string `json:"hyperparameters"`
	// Paper's Table 1 (zero for a task the paper does not tune).
	PaperThreshold float64  `json:"paper_threshold"`
	PaperEpisodes  int64    `json:"paper_episodes"`
	Threshold      float64  `json:"threshold"`
	Budget         int64    `json:"budget_episodes"`
	Seeds          []uint64 `json:"seeds"`
	Reached        int      `json:"reached"`
	// Held: reached seeds whose re-evaluation on fresh episodes also
	// reached the threshold.
	Held        int     `json:"held"`
	SuccessRate float64 `json:"success_rate"`
	// Training episodes (evaluation episodes not counted, as in the paper)
	// that produced the first policy evaluated at or above the threshold,
	// over the seeds that reached it within the budget.
	EpisodesMedian *float64          `json:"episodes_median,omitempty"`
	EpisodesMin    *int64            `json:"episodes_min,omitempty"`
	EpisodesMax    *int64            `json:"episodes_max,omitempty"`
	BestEvalMedian float64           `json:"best_eval_median"`
	WallSeconds    float64           `json:"wall_seconds"` // sum over the seeds' runs
	EnvSteps       int64             `json:"env_steps"`    // training and evaluation
	StepsPerSecond float64           `json:"env_steps_per_second"`
	StepsPerCPU    float64           `json:"env_steps_per_worker_cpu_second"`
	PerSeed        []paperSeedResult `json:"per_seed"`
}

type paperSeedResult struct {
	Seed    uint64 `json:"seed"`
	Reached bool   `json:"reached"`
	// ConfirmEval is the reached policy's mean return on the fresh
	// episodes of the re-evaluation after the stop; Held says whether it
	// reached the threshold too.
	ConfirmEval *float64 `json:"confirm_eval,omitempty"`
	Held        *bool    `json:"held,omitempty"`
	Episodes    int64    `json:"episodes"` // to threshold if reached, else training episodes run
	BestEval    float64  `json:"best_eval"`
	WallSeconds float64  `json:"wall_seconds"`
	EnvSteps    int64    `json:"env_steps"`
	WorkerCPU   float64  `json:"worker_cpu_seconds"`
	Reused      bool     `json:"reused,omitempty"`
}

type paperReport struct {
	Command string `json:"command"`
	// Protocol is the evaluation protocol of every run in the report.
	Protocol string `json:"protocol"`
	Workers  int    `json:"workers"`
	// MuJoCo is the linked MuJoCo release ("" without the binding):
	// Debian's 2.2.2 or, built with scripts/mujoco_fast.sh, the wheel's
	// 2.3.7; MuJoCoLibrary the file it was loaded from (mujoco.Library).
	// Every run's summary.json records the same two.
	MuJoCo        string            `json:"mujoco,omitempty"`
	MuJoCoLibrary string            `json:"mujoco_library,omitempty"`
	Started       string            `json:"started"`
	Load          string            `json:"load_average_at_end"`
	Tasks         []paperTaskResult `json:"tasks"`
}

// paperTask resolves a task's hyperparameters, threshold and budget.
func (o *arsPaperOptions) paperTask(name string) (ars.Paper, int64, error) {
	p, ok := ars.PaperFor(name)
	if ok {
		return p, int64(math.Ceil(o.budgetFactor * float64(p.Episodes))), nil
	}
	if math.IsNaN(o.threshold) || o.budget <= 0 {
		return p, 0, fmt.Errorf("--tasks %s: the paper does not tune it; give --threshold and --budget (paper tasks: %s)", name, strings.Join(ars.PaperTasks, ","))
	}
	d := ars.EnvDefaults(name)
	return ars.Paper{Hyper: d.Hyper, Threshold: o.threshold}, o.budget, nil
}

func benchARSPaper(ctx context.Context, g *globals, o *arsPaperOptions) error {
	if o.seeds < 1 || o.workers < 1 || o.budgetFactor <= 0 {
		return fmt.Errorf("need --seeds ≥ 1, --workers ≥ 1 and --budget-factor > 0")
	}
	type plan struct {
		name   string
		p      ars.Paper
		budget int64
		seeds  int
	}
	var plans []plan
	for _, t := range o.tasks {
		name, seeds := t, o.seeds
		if n, s, ok := strings.Cut(t, ":"); ok {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				return fmt.Errorf("--tasks %s: want TASK or TASK:SEEDS with SEEDS ≥ 1", t)
			}
			name, seeds = n, v
		}
		p, budget, err := o.paperTask(name)
		if err != nil {
			return err
		}
		plans = append(plans, plan{name, p, budget, seeds})
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.protocol != arsrpc.ProtocolPaper && o.protocol != arsrpc.ProtocolFast {
		return fmt.Errorf("--protocol %q: want paper or fast", o.protocol)
	}
	rep := paperReport{Command: "rlhub " + strings.Join(os.Args[1:], " "), Protocol: o.protocol, Workers: o.workers, MuJoCo: mujoco.Version(), MuJoCoLibrary: mujoco.Library(), Started: time.Now().UTC().Format(time.RFC3339)}
	var runErr error
	for _, pl := range plans {
		res := paperTaskResult{Task: pl.name, Hyper: hyperStrings(pl.p.Hyper), Threshold: pl.p.Threshold, Budget: pl.budget}
		if _, ok := ars.PaperFor(pl.name); ok {
			res.PaperThreshold, res.PaperEpisodes = pl.p.Threshold, pl.p.Episodes
		}
		for i := range pl.seeds {
			if runErr != nil {
				break
			}
			seed := o.firstSeed + uint64(i)
			dir := filepath.Join(o.out, pl.name, fmt.Sprintf("seed-%d", seed))
			sum, reused, err := runPaperSeed(ctx, g, o, pl.name, pl.p, pl.budget, seed, dir)
			if err != nil {
				runErr = fmt.Errorf("%s seed %d: %w", pl.name, seed, err)
				break
			}
			res.PerSeed = append(res.PerSeed, seedResult(sum, pl.budget, reused))
			// The report is rewritten after every seed, so a benchmark
			// stopped part-way leaves the seeds that finished.
			if err := writePartialReport(o.out, rep, res); err != nil {
				return err
			}
		}
		finishTask(&res)
		rep.Tasks = append(rep.Tasks, res)
	}
	rep.Load = loadAverage()
	if err := writePaperReport(o.out, &rep); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprint(g.stdout, paperMarkdown(&rep))
	fmt.Fprintf(g.stdout, "wrote %s\n", filepath.Join(o.out, "{ars-paper.md,ars-paper.json}"))
	return runErr
}

// writePartialReport writes the report as it stands with cur, the task in
// progress, counted over the seeds it has finished.
func writePartialReport(dir string, rep paperReport, cur paperTaskResult) error {
	cur.PerSeed = slices.Clone(cur.PerSeed)
	cur.Seeds = nil
	finishTask(&cur)
	rep.Tasks = append(slices.Clone(rep.Tasks), cur)
	rep.Load = loadAverage()
	return writePaperReport(dir, &rep)
}

// runPaperSeed runs (or reuses) one seed's training.
func runPaperSeed(ctx context.Context, g *globals, o *arsPaperOptions, name string, p ars.Paper, budget int64, seed uint64, dir string) (arsrun.Summary, bool, error) {
	if sum, ok := reusableSummary(dir, name, p, budget, seed); ok && sum.Protocol == o.protocol {
		fmt.Fprintf(g.stdout, "%s seed %d: reusing %s (%s after %d episodes)\n", name, seed, dir, sum.Reason, sum.PolicyEpisodes)
		return sum, true, nil
	}
	os.RemoveAll(dir)
	h := p.Hyper
	to := trainARSOptions{workers: o.workers, out: dir, noProgress: true, overwrite: true, reconnect: 2 * time.Minute, version: h.Version.String()}
	to.spec.Env, to.spec.Seed = name, seed
	to.spec.Directions, to.spec.Top = uint32(h.Directions), uint32(h.Top)
	to.spec.StepSize, to.spec.Noise, to.spec.Shift = h.StepSize, h.Noise, h.Shift
	to.spec.UseTarget, to.spec.Target = true, p.Threshold
	to.spec.MaxEpisodes = budget
	to.spec.Protocol = o.protocol
	if err := trainARS(ctx, g, &to); err != nil {
		return arsrun.Summary{}, false, err
	}
	sum, err := arsrun.ReadSummary(dir)
	return sum, false, err
}

// reusableSummary returns an earlier run's summary when it is the same
// experiment and settles the outcome within budget: it reached the
// threshold (at however many episodes), or it ran out of its own budget
// at a point where under this budget no further iteration would fit
// either (a run stops once episodes + 2N would exceed the budget). A run
// is determined by its seed whatever the number of workers (docs/ars.md),
// so its outcome under another budget is read off it.
func reusableSummary(dir, name string, p ars.Paper, budget int64, seed uint64) (arsrun.Summary, bool) {
	sum, err := arsrun.ReadSummary(dir)
	// A summary of another MuJoCo release (or of none recorded) ran other
	// physics: it is run again, not mixed into this binary's report.
	if err != nil || sum.Env != name || sum.Seed != seed || sum.Target == nil || *sum.Target != p.Threshold || sum.MuJoCo != mujoco.Version() {
		return sum, false
	}
	want := hyperStrings(p.Hyper)
	for k, v := range want {
		if sum.Hyper[k] != v {
			return sum, false
		}
	}
	n, err := strconv.Atoi(sum.Hyper["directions"])
	if err != nil {
		return sum, false
	}
	return sum, sum.ReachedTarget || (sum.Reason == "budget" && sum.Episodes+int64(2*n) > budget)
}

func hyperStrings(h ars.Hyper) map[string]string {
	top := h.Top
	if top == 0 {
		top = h.Directions
	}
	return map[string]string{
		"version":    h.Version.String(),
		"directions": strconv.Itoa(h.Directions),
		"top":        strconv.Itoa(top),
		"step_size":  strconv.FormatFloat(h.StepSize, 'g', -1, 64),
		"noise":      strconv.FormatFloat(h.Noise, 'g', -1, 64),
		"shift":      strconv.FormatFloat(h.Shift, 'g', -1, 64),
	}
}

func seedResult(sum arsrun.Summary, budget int64, reused bool) paperSeedResult {
	r := paperSeedResult{Seed: sum.Seed, WallSeconds: sum.WallSeconds, EnvSteps: sum.Steps, WorkerCPU: sum.WorkerCPUSeconds, Reused: reused}
	r.Reached = sum.ReachedTarget && sum.PolicyEpisodes <= budget
	r.Episodes = sum.Episodes
	if r.Reached {
		r.Episodes = sum.PolicyEpisodes
	}
	if sum.BestEvalMean != nil {
		r.BestEval = *sum.BestEvalMean
	}
	if r.Reached && sum.TargetHeld != nil && sum.FinalEvalMean != nil {
		m, h := *sum.FinalEvalMean, *sum.TargetHeld
		r.ConfirmEval, r.Held = &m, &h
	}
	return r
}

func finishTask(res *paperTaskResult) {
	var eps []int64
	var best []float64
	var cpu float64
	for _, s := range res.PerSeed {
		res.Seeds = append(res.Seeds, s.Seed)
		res.WallSeconds += s.WallSeconds
		res.EnvSteps += s.EnvSteps
		cpu += s.WorkerCPU
		best = append(best, s.BestEval)
		if s.Reached {
			eps = append(eps, s.Episodes)
		}
		if s.Held != nil && *s.Held {
			res.Held++
		}
	}
	if cpu > 0 {
		res.StepsPerCPU = float64(res.EnvSteps) / cpu
	}
	if n := len(res.PerSeed); n > 0 {
		res.SuccessRate = float64(len(eps)) / float64(n)
		res.BestEvalMedian = median(best)
	}
	res.Reached = len(eps)
	if res.WallSeconds > 0 {
		res.StepsPerSecond = float64(res.EnvSteps) / res.WallSeconds
	}
	if len(eps) > 0 {
		slices.Sort(eps)
		f := make([]float64, len(eps))
		for i, e := range eps {
			f[i] = float64(e)
		}
		m := median(f)
		res.EpisodesMedian, res.EpisodesMin, res.EpisodesMax = &m, &eps[0], &eps[len(eps)-1]
	}
}

// median of xs (sorted in place); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func writePaperReport(dir string, rep *paperReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	// Replaced whole (temp file, rename): the report is rewritten after
	// every seed while collectors (scripts/ars_protocol_results.py) read it.
	if err := atomicfile.Write(filepath.Join(dir, "ars-paper.json"), b, []byte{'\n'}); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "ars-paper.md"), []byte(paperMarkdown(rep)))
}

func protocolText(p string) string {
	switch p {
	case arsrpc.ProtocolPaper:
		return "paper (every 10 iterations over 100 episodes, filter frozen, shift 0; training episodes counted; a reached policy re-evaluated on 100 fresh episodes)"
	case arsrpc.ProtocolFast:
		return "fast (rlhub's per-environment evaluation cadence, 10 episodes; optimistic)"
	}
	return p
}

// paperMarkdown renders the report as the table docs/benchlog/2026-11-30-sessions-1-4.md shows.
func paperMarkdown(rep *paperReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Evaluation protocol: %s.\n\n", protocolText(rep.Protocol))
	if rep.MuJoCo != "" {
		fmt.Fprintf(&b, "MuJoCo %s (%s).\n\n", rep.MuJoCo, rep.MuJoCoLibrary)
	}
	fmt.Fprintf(&b, "| task | version, N, b, α, ν, shift | threshold | paper: episodes | rlhub: episodes median (min–max) | reached within budget | held on fresh episodes | budget | best eval, median | wall time | env steps/s | per worker CPU-s |\n")
	fmt.Fprintf(&b, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, t := range rep.Tasks {
		h := t.Hyper
		hyper := fmt.Sprintf("%s, %s, %s, %s, %s, %s", h["version"], h["directions"], h["top"], h["step_size"], h["noise"], h["shift"])
		paper := "—"
		if t.PaperEpisodes > 0 {
			paper = fmt.Sprint(t.PaperEpisodes)
		}
		eps := "—"
		if t.EpisodesMedian != nil {
			eps = fmt.Sprintf("%.0f (%d–%d)", *t.EpisodesMedian, *t.EpisodesMin, *t.EpisodesMax)
		}
		fmt.Fprintf(&b, "| %s | %s | %g | %s | %s | %d/%d | %d/%d | %d | %.0f | %.0f s | %.0f | %.0f |\n",
			t.Task, hyper, t.Threshold, paper, eps, t.Reached, len(t.PerSeed), t.Held, t.Reached, t.Budget, t.BestEvalMedian, t.WallSeconds, t.StepsPerSecond, t.StepsPerCPU)
	}
	return b.String()
}
