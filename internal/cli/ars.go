package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/hub"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// selfCommand is how `rlhub train` re-executes this binary to start worker
// processes (tests point it at a helper process).
var selfCommand = func() ([]string, error) {
	exe, err := os.Executable()
	return []string{exe}, err
}

func newWorkerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Join a hub as a worker",
	}
	cmd.AddCommand(newWorkerARSCmd(g))
	return cmd
}

func newWorkerARSCmd(g *globals) *cobra.Command {
	var addr, name string
	var maxTasks int
	var retry time.Duration
	cmd := &cobra.Command{
		Use:   "ars",
		Short: "Evaluate ARS directions leased by a hub until interrupted",
		Long: "worker ars attaches to the hub's ARS coordinator and loops: lease task indices,\n" +
			"pull the policy version they need, run the episodes, report the returns and\n" +
			"state statistics. SIGINT/SIGTERM detaches and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := dialHub(cmd.Context(), addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			if name == "" {
				h, _ := os.Hostname()
				name = fmt.Sprintf("%s/%d", h, os.Getpid())
			}
			st, err := arsrpc.RunWorker(cmd.Context(), arsrpc.WorkerConfig{Conn: conn, Name: name, MaxTasks: maxTasks, RetryFor: retry, Logger: g.logger})
			g.logger.Info("ars worker done", "tasks", st.Tasks, "steps", st.Steps, "pulls", st.Pulls)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "hub", hub.DefaultListen, "hub address")
	f.StringVar(&name, "name", "", "worker name in the hub's logs (default host/pid)")
	f.IntVar(&maxTasks, "max-tasks", 8, "most tasks in one lease")
	f.DurationVar(&retry, "retry-for", 30*time.Second, "how long to retry an unreachable hub before giving up")
	return cmd
}

func newTrainCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train a policy",
	}
	cmd.AddCommand(newTrainARSCmd(g))
	return cmd
}

type trainARSOptions struct {
	spec       pb.ARSRunSpec
	version    string
	hidden     []int
	target     float64
	workers    int
	hubAddr    string
	out        string
	noProgress bool
	// envSpec: the spaces of an environment only Python workers run
	// (--obs-dim with --discrete or --act-dim); zero for a built-in one.
	envSpec pb.ARSEnvSpec
}

func newTrainARSCmd(g *globals) *cobra.Command {
	var o trainARSOptions
	cmd := &cobra.Command{
		Use:   "ars",
		Short: "Distributed Augmented Random Search (the README's main job)",
		Long: "train ars starts an embedded hub on 127.0.0.1 (or uses --hub) and --workers\n" +
			"worker processes, runs ARS (Mania, Guy & Recht 2018, Algorithm 2) until the\n" +
			"evaluation return reaches --target or the episode budget is spent, and writes\n" +
			"OUT/curve.csv, OUT/curve.png, OUT/policy.safetensors and OUT/summary.json.\n" +
			"Hyperparameters left at 0 take the environment's defaults (docs/ars.md).\n" +
			"The same --seed gives the same policy whatever the number of workers.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.spec.UseTarget = cmd.Flags().Changed("target")
			o.spec.Target = o.target
			return trainARS(cmd.Context(), g, &o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.spec.Env, "env", "", "environment: "+fmt.Sprint(env.Names()))
	f.IntVar(&o.workers, "workers", 2, "worker processes to start (0: rely on workers already attached to --hub)")
	f.Uint64Var(&o.spec.Seed, "seed", 1, "run seed (noise directions, episode seeds)")
	f.StringVar(&o.version, "version", "", "ARS version: V1, V2, V1-t or V2-t (default per env)")
	f.Uint32Var(&o.spec.Directions, "directions", 0, "directions N per iteration (default per env)")
	f.Uint32Var(&o.spec.Top, "top", 0, "top directions b kept (-t versions; default per env)")
	f.Float64Var(&o.spec.StepSize, "step-size", 0, "step size α (default per env)")
	f.Float64Var(&o.spec.Noise, "noise", 0, "exploration noise ν (default per env)")
	f.Float64Var(&o.spec.Shift, "shift", 0, "reward shift subtracted per step in training")
	f.IntSliceVar(&o.hidden, "hidden", nil, "MLP hidden widths (default: the paper's linear policy)")
	f.Uint32Var(&o.spec.EvalEvery, "eval-every", 0, "evaluate every K iterations (default per env)")
	f.Uint32Var(&o.spec.EvalEpisodes, "eval-episodes", 0, "episodes per evaluation (default per env)")
	f.Float64Var(&o.target, "target", 0, "stop once an evaluation's mean return reaches this")
	f.Int64Var(&o.spec.MaxEpisodes, "max-episodes", 0, "training episode budget (default per env)")
	f.Uint32Var(&o.spec.MaxIterations, "max-iterations", 0, "iteration budget (0: none)")
	f.StringVar(&o.hubAddr, "hub", "", "use a running hub at this address instead of an embedded one")
	f.StringVar(&o.out, "out", "", "output directory")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress bar")
	f.Uint32Var(&o.envSpec.ObsDim, "obs-dim", 0, "observation length of an --env the hub does not know (a Gymnasium env served by python -m rlhub.ars_worker; needs --hub and --workers 0)")
	f.Uint32Var(&o.envSpec.Discrete, "discrete", 0, "with --obs-dim: number of discrete actions")
	f.Uint32Var(&o.envSpec.ActDim, "act-dim", 0, "with --obs-dim: length of a continuous action")
	cmd.MarkFlagRequired("env")
	cmd.MarkFlagRequired("out")
	return cmd
}

// curveRow is one finished iteration as the CLI saw it.
type curveRow struct {
	p    *pb.ARSProgress
	wall float64 // seconds since the run started, on this machine
}

// trainSummary is OUT/summary.json.
type trainSummary struct {
	Env            string            `json:"env"`
	Seed           uint64            `json:"seed"`
	Workers        int               `json:"workers"`
	RunID          string            `json:"run_id"`
	Model          string            `json:"model"`
	PolicyVersion  uint64            `json:"policy_version"`
	Hyper          map[string]string `json:"hyperparameters"`
	Reason         string            `json:"stop_reason"`
	ReachedTarget  bool              `json:"reached_target"`
	Target         *float64          `json:"target,omitempty"`
	Iterations     uint64            `json:"iterations"`
	Episodes       int64             `json:"training_episodes"`
	PolicyEpisodes int64             `json:"policy_training_episodes"`
	EvalEpisodes   int64             `json:"eval_episodes"`
	Steps          int64             `json:"env_steps"`
	WallSeconds    float64           `json:"wall_seconds"`
	StepsPerSecond float64           `json:"env_steps_per_second"`
	// CPU time (user + system) of the worker processes started by this
	// command, and of this process (the embedded hub and the client).
	WorkerCPUSeconds        float64  `json:"worker_cpu_seconds"`
	TrainCPUSeconds         float64  `json:"train_process_cpu_seconds"`
	StepsPerWorkerCPUSecond float64  `json:"env_steps_per_worker_cpu_second"`
	FinalEvalMean           *float64 `json:"final_eval_mean,omitempty"`
	FinalEvalStd            *float64 `json:"final_eval_std,omitempty"`
	BestEvalMean            *float64 `json:"best_eval_mean,omitempty"`
	// LQRRelativeCost is J(M)/J* − 1 for a V1/V1-t policy on LQR: the
	// exact average cost of the trained gain relative to the Riccati
	// optimum.
	LQRRelativeCost *float64 `json:"lqr_relative_cost,omitempty"`
}

// lqrRelativeCost returns J(M)/J* − 1 for a linear policy on the raw LQR
// state (V1, V1-t), or nil when it does not apply.
func lqrRelativeCost(p *ars.Policy) (*float64, error) {
	if p.Env != "LQR" || !p.Arch.Linear() || p.Version.Normalises() {
		return nil, nil
	}
	c, err := env.LQRAverageCost(p.Theta)
	if err != nil {
		return nil, err
	}
	r := c/env.LQROptimalCost() - 1
	return &r, nil
}

func trainARS(ctx context.Context, g *globals, o *trainARSOptions) error {
	o.spec.Version = o.version
	for _, h := range o.hidden {
		if h < 1 {
			return fmt.Errorf("--hidden %v: widths must be ≥ 1", o.hidden)
		}
		o.spec.Hidden = append(o.spec.Hidden, uint32(h))
	}
	if o.envSpec.ObsDim > 0 || o.envSpec.Discrete > 0 || o.envSpec.ActDim > 0 {
		// An environment only Python workers can run: no Go worker may be
		// started for it.
		if o.hubAddr == "" || o.workers != 0 {
			return errors.New("--obs-dim/--discrete/--act-dim describe an env served by Python workers: use them with --hub and --workers 0")
		}
		o.spec.EnvSpec = &o.envSpec
	} else if _, err := env.Make(o.spec.Env); err != nil {
		return fmt.Errorf("--env: %w (for a Gymnasium env served by Python workers give its spaces: --obs-dim with --discrete or --act-dim)", err)
	}
	if _, _, err := arsrpc.Normalise(&o.spec); err != nil {
		return err // the hub would refuse the run: say so before starting anything
	}
	if o.workers < 0 || (o.workers == 0 && o.hubAddr == "") {
		return fmt.Errorf("--workers %d: need at least one worker with an embedded hub", o.workers)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}

	// Worker output, the progress bar and the logs share stderr from
	// several goroutines: serialise them.
	errw := &lockedWriter{w: g.stderr}
	logger, err := newLogger(errw, g.logLevel, g.logFormat)
	if err != nil {
		return err
	}
	g = &globals{stdout: g.stdout, stderr: errw, logger: logger, logLevel: g.logLevel, logFormat: g.logFormat, conn: g.conn}

	addr := o.hubAddr
	if addr == "" {
		h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: g.logger.With("role", "hub")})
		if err != nil {
			return err
		}
		if err := h.Start(); err != nil {
			return errors.Join(err, h.Close())
		}
		defer h.Close()
		addr = h.Addr().String()
	}

	// Worker processes live until this function returns.
	procs := newWorkerProcs()
	defer procs.stop()
	cpu0 := selfCPU()
	self, err := selfCommand()
	if err != nil {
		return fmt.Errorf("locate own binary: %w", err)
	}
	for i := range o.workers {
		args := append(append([]string{}, self[1:]...), "--log-level", "warn", "worker", "ars", "--hub", addr, "--name", fmt.Sprintf("worker-%d", i))
		args = append(args, g.conn.args()...)
		if err := procs.start(self[0], args, g.stderr); err != nil {
			return fmt.Errorf("start worker %d: %w", i, err)
		}
	}
	procs.seal()

	conn, err := dialHub(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := pb.NewARSClient(conn)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	start, err := client.StartRun(sctx, &pb.ARSStartRunRequest{Spec: &o.spec}, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return fmt.Errorf("start run: %w", grpcerr.FromStatus(err))
	}
	g.logger.Info("ars run", "run", start.RunId, "hub", addr, "workers", o.workers)
	began := time.Now()

	// Follow the run; give up if every worker process we started died
	// (nobody would ever finish an iteration).
	wctx, cancelWatch := context.WithCancel(ctx)
	watchdog := make(chan bool, 1)
	go func() {
		select {
		case <-procs.allExitedIf(o.workers > 0 && o.hubAddr == ""):
			cancelWatch()
			watchdog <- true
		case <-wctx.Done():
			watchdog <- false
		}
	}()
	rows, werr := watchRun(wctx, g, client, start.RunId, o, began)
	cancelWatch()
	if <-watchdog && werr != nil {
		werr = errors.New("every worker process exited before the run ended")
	}
	if werr != nil {
		// Interrupted or the stream broke: stop the run, keep what we have.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		client.StopRun(sctx, &pb.ARSStopRunRequest{RunId: start.RunId})
		cancel()
	}
	if len(rows) == 0 {
		return errors.Join(werr, errors.New("no iteration finished"))
	}
	pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pol, blob, err := arsrpc.PullPolicy(pctx, client, start.RunId, 0)
	if err != nil {
		return errors.Join(werr, err)
	}
	hubCPU := selfCPU() - cpu0
	workerCPU := procs.stop()
	sum := summarise(o, start, pol, rows)
	sum.WorkerCPUSeconds, sum.TrainCPUSeconds = workerCPU.Seconds(), hubCPU.Seconds()
	if workerCPU > 0 {
		sum.StepsPerWorkerCPUSecond = float64(sum.Steps) / workerCPU.Seconds()
	}
	if err := writeOutputs(o.out, blob, rows, sum); err != nil {
		return errors.Join(werr, err)
	}
	fmt.Fprintf(g.stdout, "%s seed %d: %s after %d iterations, %d training episodes (policy from %d), %d env steps in %.3fs (%.0f steps/s)",
		sum.Env, sum.Seed, sum.Reason, sum.Iterations, sum.Episodes, sum.PolicyEpisodes, sum.Steps, sum.WallSeconds, sum.StepsPerSecond)
	if sum.FinalEvalMean != nil {
		fmt.Fprintf(g.stdout, "; eval return %.2f ± %.2f", *sum.FinalEvalMean, *sum.FinalEvalStd)
	}
	if sum.LQRRelativeCost != nil {
		fmt.Fprintf(g.stdout, "; LQR cost %.4f above the Riccati optimum", *sum.LQRRelativeCost)
	}
	fmt.Fprintf(g.stdout, "\nwrote %s\n", filepath.Join(o.out, "{curve.csv,curve.png,policy.safetensors,summary.json}"))
	if werr != nil {
		return werr
	}
	if last := rows[len(rows)-1].p; last.Reason != "target" && last.Reason != "budget" {
		return fmt.Errorf("run ended: %s", last.Reason)
	}
	return nil
}

// watchRun follows the run's progress, drawing the bar, until it ends.
func watchRun(ctx context.Context, g *globals, client pb.ARSClient, runID string, o *trainARSOptions, began time.Time) ([]curveRow, error) {
	stream, err := client.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: runID})
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	total := int64(-1)
	if o.spec.MaxEpisodes > 0 {
		total = o.spec.MaxEpisodes
	} else if o.spec.MaxIterations == 0 {
		total = ars.EnvDefaults(o.spec.Env).MaxEpisodes
	}
	var bar *progressbar.ProgressBar
	if !o.noProgress {
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(g.stderr),
			progressbar.OptionSetDescription("ars"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("episodes"),
			progressbar.OptionThrottle(0),
			progressbar.OptionSetWidth(20),
		)
	}
	var rows []curveRow
	lastEval := math.NaN()
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rows, grpcerr.FromStatus(err)
		}
		wall := time.Since(began).Seconds()
		rows = append(rows, curveRow{p: p, wall: wall})
		if p.HasEval {
			lastEval = p.EvalMean
		}
		if bar != nil {
			bar.Describe(fmt.Sprintf("it %d | ep %d | %.0f steps/s | eval %.1f", p.Iteration, p.Episodes, float64(p.Steps)/max(wall, 1e-9), lastEval))
			if total > 0 {
				bar.Set64(min(p.Episodes, total))
			} else {
				bar.Set64(p.Episodes)
			}
		}
		if p.Done {
			break
		}
	}
	if bar != nil {
		bar.Exit()
		fmt.Fprintln(g.stderr)
	}
	return rows, nil
}

func summarise(o *trainARSOptions, start *pb.ARSStartRunResponse, pol *ars.Policy, rows []curveRow) trainSummary {
	last := rows[len(rows)-1]
	s := trainSummary{
		Env: o.spec.Env, Seed: o.spec.Seed, Workers: o.workers, RunID: start.RunId, Model: start.Model,
		PolicyVersion: last.p.Version, Reason: last.p.Reason, ReachedTarget: last.p.Reason == "target",
		Iterations: last.p.Iteration + 1, Episodes: last.p.Episodes, EvalEpisodes: last.p.EvalEpisodes,
		PolicyEpisodes: last.p.PolicyEpisodes,
		Steps:          last.p.Steps, WallSeconds: last.wall,
		Hyper: map[string]string{
			"version":    pol.Version.String(),
			"directions": strconv.Itoa(pol.Hyper.Directions),
			"top":        strconv.Itoa(pol.Hyper.Top),
			"step_size":  strconv.FormatFloat(pol.Hyper.StepSize, 'g', -1, 64),
			"noise":      strconv.FormatFloat(pol.Hyper.Noise, 'g', -1, 64),
			"shift":      strconv.FormatFloat(pol.Hyper.Shift, 'g', -1, 64),
			"hidden":     fmt.Sprint(pol.Arch.Hidden),
		},
	}
	if o.spec.UseTarget {
		t := o.spec.Target
		s.Target = &t
	}
	if last.wall > 0 {
		s.StepsPerSecond = float64(last.p.Steps) / last.wall
	}
	s.LQRRelativeCost, _ = lqrRelativeCost(pol) // nil for an unstable gain
	for _, r := range rows {
		if r.p.HasEval {
			m, sd := r.p.EvalMean, r.p.EvalStd
			s.FinalEvalMean, s.FinalEvalStd = &m, &sd
			if s.BestEvalMean == nil || m > *s.BestEvalMean {
				b := m
				s.BestEvalMean = &b
			}
		}
	}
	return s
}

func writeOutputs(dir string, blob []byte, rows []curveRow, sum trainSummary) error {
	if err := os.WriteFile(filepath.Join(dir, "policy.safetensors"), blob, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "curve.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"iteration", "policy_version", "policy_training_episodes", "training_episodes", "eval_episodes", "env_steps", "wall_seconds", "hub_seconds", "eval_mean", "eval_std", "sigma_r"})
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', 10, 64) }
	for _, r := range rows {
		p := r.p
		em, es := "", ""
		if p.HasEval {
			em, es = g(p.EvalMean), g(p.EvalStd)
		}
		w.Write([]string{strconv.FormatUint(p.Iteration, 10), strconv.FormatUint(p.Version, 10), strconv.FormatInt(p.PolicyEpisodes, 10), strconv.FormatInt(p.Episodes, 10),
			strconv.FormatInt(p.EvalEpisodes, 10), strconv.FormatInt(p.Steps, 10), g(r.wall), g(p.ElapsedSeconds), em, es, g(p.SigmaR)})
	}
	w.Flush()
	if err := errors.Join(w.Error(), f.Close()); err != nil {
		return err
	}
	if err := plotCurve(filepath.Join(dir, "curve.png"), rows, sum); err != nil {
		return err
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644)
}

func newEvalCmd(g *globals) *cobra.Command {
	var path, envName string
	var episodes int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Evaluate a trained policy: mean ± std return over episodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			blob, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			pol, err := ars.DecodePolicy(blob)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if envName == "" {
				envName = pol.Env
			}
			e, err := env.Make(envName)
			if err != nil {
				return err
			}
			if err := checkPolicyFits(pol, e.Spec()); err != nil {
				return err
			}
			if episodes < 1 {
				return fmt.Errorf("--episodes %d: need at least 1", episodes)
			}
			rets := ars.Evaluate(e, pol, seed, episodes)
			var sum, ss float64
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, r := range rets {
				sum += r
				lo, hi = min(lo, r), max(hi, r)
			}
			mean := sum / float64(len(rets))
			for _, r := range rets {
				ss += (r - mean) * (r - mean)
			}
			fmt.Fprintf(g.stdout, "%s: return %.2f ± %.2f over %d episodes (min %.2f, max %.2f)\n", envName, mean, math.Sqrt(ss/float64(len(rets))), len(rets), lo, hi)
			if envName == "LQR" {
				rel, err := lqrRelativeCost(pol)
				switch {
				case err != nil:
					fmt.Fprintf(g.stdout, "LQR: the gain is not stabilising: %v\n", err)
				case rel != nil:
					fmt.Fprintf(g.stdout, "LQR: average cost %.6f, Riccati optimum %.6f, relative cost %.4f\n", (1+*rel)*env.LQROptimalCost(), env.LQROptimalCost(), *rel)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "policy", "", "policy.safetensors written by rlhub train ars")
	f.StringVar(&envName, "env", "", "environment (default: the one the policy was trained on)")
	f.IntVar(&episodes, "episodes", 100, "episodes to run")
	f.Uint64Var(&seed, "seed", 0, "seed of the evaluation episodes")
	cmd.MarkFlagRequired("policy")
	return cmd
}

func checkPolicyFits(p *ars.Policy, spec env.Spec) error {
	out, discrete := spec.ActDim, false
	if spec.Discrete > 0 {
		out, discrete = spec.Discrete, true
	}
	if p.Arch.ObsDim != spec.ObsDim || p.Arch.OutDim != out || p.Arch.Discrete != discrete {
		return fmt.Errorf("%w: policy maps %d observations to %d outputs (discrete %v); %s has %d → %d (discrete %v)",
			errs.ErrInvalid, p.Arch.ObsDim, p.Arch.OutDim, p.Arch.Discrete, spec.Name, spec.ObsDim, out, discrete)
	}
	return nil
}

// writeFileFrom creates path and fills it with write.
func writeFileFrom(path string, write func(io.Writer) (int64, error)) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = write(f)
	return errors.Join(err, f.Close())
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// selfCPU returns this process's CPU time so far (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// workerProcs owns the worker processes train starts: one goroutine per
// process waits for it. stop interrupts them (SIGINT, then a kill after
// WaitDelay) and returns only when every goroutine has ended.
type workerProcs struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when the last started process exits

	mu     sync.Mutex
	alive  int           // processes started and not yet exited; guarded by mu
	sealed bool          // no more processes will start; guarded by mu
	closed bool          // done is closed; guarded by mu
	cpu    time.Duration // user + system time of exited processes; guarded by mu
}

// closeIfAllExitedLocked closes done once starting is over and nothing is
// alive. Caller holds mu.
func (w *workerProcs) closeIfAllExitedLocked() {
	if w.sealed && w.alive == 0 && !w.closed {
		w.closed = true
		close(w.done)
	}
}

// seal says every process has been started: from now on allExited can fire.
func (w *workerProcs) seal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sealed = true
	w.closeIfAllExitedLocked()
}

func newWorkerProcs() *workerProcs {
	ctx, cancel := context.WithCancel(context.Background())
	return &workerProcs{ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (w *workerProcs) start(exe string, args []string, out io.Writer) error {
	p := exec.CommandContext(w.ctx, exe, args...)
	p.Stdout, p.Stderr = out, out
	p.Cancel = func() error { return p.Process.Signal(os.Interrupt) }
	p.WaitDelay = 5 * time.Second
	if err := p.Start(); err != nil {
		return err
	}
	w.mu.Lock()
	w.alive++
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		p.Wait()
		w.mu.Lock()
		defer w.mu.Unlock()
		if p.ProcessState != nil {
			w.cpu += p.ProcessState.UserTime() + p.ProcessState.SystemTime()
		}
		w.alive--
		w.closeIfAllExitedLocked()
	}()
	return nil
}

// allExited is closed once seal was called and every started process has
// exited (at seal, if none was started).
func (w *workerProcs) allExited() <-chan struct{} { return w.done }

// allExitedIf is allExited when cond holds, else a channel that never
// fires.
func (w *workerProcs) allExitedIf(cond bool) <-chan struct{} {
	if cond {
		return w.done
	}
	return nil
}

// stop ends every process and returns their total CPU time. Safe to call
// twice.
func (w *workerProcs) stop() time.Duration {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cpu
}
