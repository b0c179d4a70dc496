package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/metrics"
	arsrun "github.com/rlhub/rlhub/internal/run"
	"github.com/rlhub/rlhub/internal/tblog"
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
	var metricsListen string
	var metricsInsecure bool
	cmd := &cobra.Command{
		Use:   "ars",
		Short: "Evaluate ARS directions leased by a hub until interrupted",
		Long: "worker ars attaches to the hub's ARS coordinator and loops: lease task indices,\n" +
			"pull the policy version they need, run the episodes, report the returns and\n" +
			"state statistics. SIGINT/SIGTERM detaches and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// arsrpc.WorkerConfig reads 0 as the default (8 tasks, 30 s):
			// a 0 given here is refused, not silently replaced.
			if err := refuseNonPositive(cmd, "max-tasks", "retry-for"); err != nil {
				return err
			}
			conn, err := dialHub(cmd.Context(), addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			if name == "" {
				h, _ := os.Hostname()
				name = fmt.Sprintf("%s/%d", h, os.Getpid())
			}
			wcfg := arsrpc.WorkerConfig{Conn: conn, Name: name, MaxTasks: maxTasks, RetryFor: retry, Logger: g.logger}
			var st arsrpc.WorkerStats
			work := func(ctx context.Context) (err error) {
				st, err = arsrpc.RunWorker(ctx, wcfg)
				return err
			}
			if metricsListen != "" {
				wcfg.Live = &arsrpc.WorkerCounters{}
				ms, err := metrics.New(metrics.Config{Listen: metricsListen, Insecure: metricsInsecure, Role: "ars worker " + name, Logger: g.logger,
					Sources: metrics.Sources{Worker: wcfg.Live}})
				if err != nil {
					return err
				}
				err = runBoth(cmd.Context(), work, ms.Run)
				g.logger.Info("ars worker done", "tasks", st.Tasks, "steps", st.Steps, "pulls", st.Pulls)
				return err
			}
			err = work(cmd.Context())
			g.logger.Info("ars worker done", "tasks", st.Tasks, "steps", st.Steps, "pulls", st.Pulls)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "hub", hub.DefaultListen, "hub address")
	f.StringVar(&name, "name", "", "worker name in the hub's logs (default host/pid)")
	f.IntVar(&maxTasks, "max-tasks", 8, "most tasks in one lease")
	f.DurationVar(&retry, "retry-for", 30*time.Second, "how long to retry an unreachable hub before giving up")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve this worker's Prometheus /metrics over HTTP on this address (default off; loopback only unless --metrics-insecure)")
	f.BoolVar(&metricsInsecure, "metrics-insecure", false, "allow a non-loopback --metrics-listen: plain HTTP, no token")
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
	tensorboard string // --tensorboard DIR: event files beside curve.csv's rows
	spec        pb.ARSRunSpec
	version     string
	hidden      []int
	target      float64
	workers     int
	hubAddr     string
	out         string
	noProgress  bool
	overwrite   bool
	resume      bool
	reconnect   time.Duration
	config      string
	// envSpec: the spaces of an environment only Python workers run
	// (--obs-dim with --discrete or --act-dim); zero for a built-in one.
	envSpec pb.ARSEnvSpec
	obsKeys []string
	// opt: --optimizer and its flags; gradientMax: --gradient-max.
	opt pb.ReducerOptimizer
}

func newTrainARSCmd(g *globals) *cobra.Command {
	var o trainARSOptions
	cmd := &cobra.Command{
		Use:   "ars",
		Short: "Distributed Augmented Random Search (the README's main job)",
		Long: "train ars starts an embedded hub on 127.0.0.1 (or uses --hub) and --workers\n" +
			"worker processes, runs ARS (Mania, Guy & Recht 2018, Algorithm 2) until the\n" +
			"evaluation return reaches --target or the episode budget is spent, and writes\n" +
			"OUT/curve.csv, OUT/curve.png, OUT/policy.safetensors, OUT/summary.json and\n" +
			"OUT/config.yaml (with OUT/run.json, and the embedded hub's state in OUT/hub).\n" +
			"Hyperparameters left at 0 take the environment's defaults (docs/ars.md).\n" +
			"The same --seed gives the same policy whatever the number of workers.\n\n" +
			"--out is never overwritten silently: a directory that holds an earlier run\n" +
			"is refused unless --resume (continue that run where its hub left it) or\n" +
			"--overwrite (delete it and start afresh) is given.\n" +
			"A hub that restarts on its --data keeps the run: train ars reconnects with\n" +
			"backoff for --reconnect-window and carries on; a hub that refuses\n" +
			"connections before the run started fails at once.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.spec.UseTarget = cmd.Flags().Changed("target")
			o.spec.Target = o.target
			if o.resume && o.config == "" && o.out != "" {
				// The hub continues the run with the spec it started with:
				// OUT/config.yaml (written at its start) is that spec, so
				// the outputs rewritten now describe the same run.
				if p := filepath.Join(o.out, "config.yaml"); fileExists(p) {
					o.config = p
				}
			}
			if o.config != "" {
				rf, err := arsrun.LoadFile(o.config)
				if err != nil {
					return err
				}
				o.applyFile(rf, cmd.Flags().Changed)
			}
			if o.spec.Env == "" || o.out == "" {
				return errors.New("need --env and --out (as flags or in the --config file; out only as a flag)")
			}
			return trainARS(cmd.Context(), g, &o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "run file (YAML; keys are these flags' names with _ for -; OUT/config.yaml of a run replays it); flags given override it")
	f.StringVar(&o.spec.Protocol, "protocol", "", "evaluation protocol: paper (default: every 10 iterations over 100 episodes, as the ARS authors' code) or fast (the per-env defaults, fewer and smaller evaluations); --eval-every/--eval-episodes override either")
	f.Uint32Var(&o.spec.ConfirmEpisodes, "confirm-episodes", 0, "fresh episodes of the re-evaluation after a stop at --target (default 100)")
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
	f.StringVar(&o.out, "out", "", "output directory (refused if it holds an earlier run, unless --resume or --overwrite)")
	f.BoolVar(&o.overwrite, "overwrite", false, "delete an earlier run in --out and start a new one")
	f.BoolVar(&o.resume, "resume", false, "continue the run recorded in --out (OUT/run.json) instead of starting one")
	f.DurationVar(&o.reconnect, "reconnect-window", 2*time.Minute, "how long to retry a hub that became unreachable after the run started (workers started here get the same)")
	f.StringVar(&o.tensorboard, "tensorboard", "", "also write TensorBoard scalars (eval and train return, steps/s, episodes; step = iteration) to an event file in this directory")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress display (one line per iteration when stderr is not a terminal)")
	f.Uint32Var(&o.envSpec.ObsDim, "obs-dim", 0, "observation length of an --env the hub does not know (a Gymnasium env served by python -m rlhub.ars_worker; needs --hub and --workers 0)")
	f.Uint32Var(&o.envSpec.Discrete, "discrete", 0, "with --obs-dim: number of discrete actions")
	f.Uint32Var(&o.envSpec.ActDim, "act-dim", 0, "with --obs-dim: length of a continuous action")
	f.StringSliceVar(&o.obsKeys, "obs-keys", nil, "with --obs-dim, for a Gymnasium Dict observation space: its keys in the space's order as NAME:DIM,… (each key gets its own mean/std filter)")
	f.StringVar(&o.opt.Kind, "optimizer", "step", "how θ moves: step (the paper's update) or sgd, adam, adamw, rmsprop, adagrad, adamax, nadam, radam on Machin's ARS gradient (learning rate --step-size; docs/ars.md)")
	f.Float64Var(&o.opt.Momentum, "momentum", 0, "momentum (--optimizer sgd, rmsprop)")
	f.Float64Var(&o.opt.WeightDecay, "weight-decay", 0, "weight decay (an --optimizer; adamw: 0 means 0.01)")
	f.Float64Var(&o.opt.Beta1, "beta1", 0, "β1 (--optimizer adam, adamw, adamax, nadam, radam; 0 means 0.9)")
	f.Float64Var(&o.opt.Beta2, "beta2", 0, "β2 (0 means 0.999)")
	f.Float64Var(&o.opt.Eps, "eps", 0, "ε of an --optimizer (0 means torch's default)")
	f.StringVar(&o.opt.Schedule, "lr-schedule", "", "step-size schedule: \"\" (constant), step (StepLR) or cosine (CosineAnnealingLR); with --lr-warmup-steps chained after LinearLR")
	f.Int64Var(&o.opt.StepSize, "lr-step-every", 0, "updates between decays (--lr-schedule step)")
	f.Float64Var(&o.opt.Gamma, "lr-gamma", 0, "decay factor (--lr-schedule step; 0 means 0.1)")
	f.Int64Var(&o.opt.TMax, "lr-t-max", 0, "half period in updates (--lr-schedule cosine)")
	f.Float64Var(&o.opt.MinLr, "lr-min", 0, "floor eta_min (--lr-schedule cosine)")
	f.Int64Var(&o.opt.WarmupSteps, "lr-warmup-steps", 0, "updates of linear warm-up")
	f.Float64Var(&o.opt.WarmupStart, "lr-warmup-start", 0, "warm-up's first factor (0 means 1/3)")
	f.Float64Var(&o.spec.GradientMax, "gradient-max", 0, "clip the ARS gradient's global L2 norm to this, as torch's clip_grad_norm_ (0: none; Machin's gradient_max)")
	return cmd
}

// applyFile takes every setting of a run file whose flag was not given.
func (o *trainARSOptions) applyFile(rf *arsrun.File, changed func(string) bool) {
	sp := rf.Spec()
	set := func(flag string, apply func()) {
		if !changed(flag) {
			apply()
		}
	}
	set("env", func() { o.spec.Env = sp.Env })
	set("seed", func() {
		if rf.Seed != nil {
			o.spec.Seed = sp.Seed
		}
	})
	set("version", func() { o.version = sp.Version })
	set("directions", func() { o.spec.Directions = sp.Directions })
	set("top", func() { o.spec.Top = sp.Top })
	set("step-size", func() { o.spec.StepSize = sp.StepSize })
	set("noise", func() { o.spec.Noise = sp.Noise })
	set("shift", func() { o.spec.Shift = sp.Shift })
	set("hidden", func() {
		o.hidden = nil
		for _, h := range sp.Hidden {
			o.hidden = append(o.hidden, int(h))
		}
	})
	set("protocol", func() { o.spec.Protocol = sp.Protocol })
	set("eval-every", func() { o.spec.EvalEvery = sp.EvalEvery })
	set("eval-episodes", func() { o.spec.EvalEpisodes = sp.EvalEpisodes })
	set("confirm-episodes", func() { o.spec.ConfirmEpisodes = sp.ConfirmEpisodes })
	set("target", func() { o.spec.UseTarget, o.spec.Target = sp.UseTarget, sp.Target })
	set("max-episodes", func() { o.spec.MaxEpisodes = sp.MaxEpisodes })
	set("max-iterations", func() { o.spec.MaxIterations = sp.MaxIterations })
	set("obs-dim", func() { o.envSpec.ObsDim = rf.ObsDim })
	set("discrete", func() { o.envSpec.Discrete = rf.Discrete })
	set("act-dim", func() { o.envSpec.ActDim = rf.ActDim })
	set("obs-keys", func() { o.obsKeys = rf.ObsKeys })
	set("gradient-max", func() { o.spec.GradientMax = rf.GradientMax })
	if fo := rf.Optimizer.Proto(); fo != nil {
		// The file's optimizer, each flag given overriding its field.
		mine := proto.Clone(&o.opt).(*pb.ReducerOptimizer)
		proto.Reset(&o.opt)
		proto.Merge(&o.opt, fo)
		for flag, copyMine := range map[string]func(){
			"optimizer": func() { o.opt.Kind = mine.Kind }, "momentum": func() { o.opt.Momentum = mine.Momentum },
			"weight-decay": func() { o.opt.WeightDecay = mine.WeightDecay }, "beta1": func() { o.opt.Beta1 = mine.Beta1 },
			"beta2": func() { o.opt.Beta2 = mine.Beta2 }, "eps": func() { o.opt.Eps = mine.Eps },
			"lr-schedule": func() { o.opt.Schedule = mine.Schedule }, "lr-step-every": func() { o.opt.StepSize = mine.StepSize },
			"lr-gamma": func() { o.opt.Gamma = mine.Gamma }, "lr-t-max": func() { o.opt.TMax = mine.TMax },
			"lr-min": func() { o.opt.MinLr = mine.MinLr }, "lr-warmup-steps": func() { o.opt.WarmupSteps = mine.WarmupSteps },
			"lr-warmup-start": func() { o.opt.WarmupStart = mine.WarmupStart },
		} {
			if changed(flag) {
				copyMine()
			}
		}
	}
	set("workers", func() {
		if rf.Workers != nil {
			o.workers = *rf.Workers
		}
	})
	set("hub", func() { o.hubAddr = rf.Hub })
	set("reconnect-window", func() {
		if d, err := time.ParseDuration(rf.ReconnectWindow); err == nil && rf.ReconnectWindow != "" {
			o.reconnect = d // LoadFile validated it
		}
	})
}

// runConfig maps the flags to a arsrun.Config.
func (o *trainARSOptions) runConfig(g *globals) (arsrun.Config, error) {
	o.spec.Version = o.version
	o.spec.Hidden = nil
	for _, h := range o.hidden {
		if h < 1 {
			return arsrun.Config{}, fmt.Errorf("--hidden %v: widths must be ≥ 1", o.hidden)
		}
		o.spec.Hidden = append(o.spec.Hidden, uint32(h))
	}
	keys, err := arsrun.ParseObsKeys(o.obsKeys)
	if err != nil {
		return arsrun.Config{}, fmt.Errorf("--obs-keys: %w", err)
	}
	o.envSpec.ObsKeys = keys
	if o.envSpec.ObsDim > 0 || o.envSpec.Discrete > 0 || o.envSpec.ActDim > 0 || len(keys) > 0 {
		o.spec.EnvSpec = &o.envSpec
	}
	o.spec.Optimizer = &o.opt
	if o.overwrite && o.resume {
		return arsrun.Config{}, errors.New("--overwrite and --resume exclude each other")
	}
	cfg := arsrun.Config{
		Spec: &o.spec, Hub: o.hubAddr, Workers: o.workers, Out: o.out,
		ReconnectWindow: o.reconnect, Logger: g.logger, WorkerOutput: g.stderr,
	}
	if o.reconnect <= 0 {
		return arsrun.Config{}, fmt.Errorf("--reconnect-window %v: must be positive", o.reconnect)
	}
	switch {
	case o.overwrite:
		cfg.OutMode = arsrun.OutOverwrite
	case o.resume:
		cfg.OutMode = arsrun.OutResume
	}
	if cmd := selfCommand; cmd != nil && o.workers > 0 {
		self, err := cmd()
		if err != nil {
			return arsrun.Config{}, fmt.Errorf("locate own binary: %w", err)
		}
		cfg.WorkerCommand = self
	}
	if !o.noProgress {
		cfg.Progress, cfg.Terminal = g.stderr, isTerminal(g.rawStderr())
	}
	return cfg, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func trainARS(ctx context.Context, g *globals, o *trainARSOptions) error {
	// Worker output, the progress display and the logs share stderr from
	// several goroutines: serialise them.
	errw := &lockedWriter{w: g.stderr}
	logger, err := newLogger(errw, g.logLevel, g.logFormat)
	if err != nil {
		return err
	}
	raw := g.rawStderr()
	g = &globals{stdout: g.stdout, stderr: errw, raw: raw, logger: logger, logLevel: g.logLevel, logFormat: g.logFormat, conn: g.conn}
	cfg, err := o.runConfig(g)
	if err != nil {
		return err
	}
	cfg.Dial, cfg.WorkerArgs = dialConfig(ctx), g.conn.args() // TLS and token, for the run and its workers
	if o.tensorboard != "" {
		tb, err := tblog.Create(o.tensorboard, tblog.Config{})
		if err != nil {
			return fmt.Errorf("--tensorboard: %w", err)
		}
		defer func() {
			if err := tb.Close(); err != nil {
				g.logger.Warn("tensorboard: closing the event file", "err", err)
			}
		}()
		cfg.Observer = arsrun.Observers{cfg.Observer, &tensorBoardObserver{w: tb, log: g.logger}}
	}
	sum, err := arsrun.Run(ctx, cfg)
	if sum.RunID == "" {
		return err
	}
	fmt.Fprintf(g.stdout, "%s seed %d: %s after %d iterations, %d training episodes (policy from %d), %d env steps in %.3fs (%.0f steps/s), %s protocol",
		sum.Env, sum.Seed, sum.Reason, sum.Iterations, sum.Episodes, sum.PolicyEpisodes, sum.Steps, sum.WallSeconds, sum.StepsPerSecond, sum.Protocol)
	if sum.FinalEvalMean != nil {
		if sum.TargetHeld != nil {
			fmt.Fprintf(g.stdout, "; re-evaluated on %d fresh episodes: %.2f ± %.2f", sum.ConfirmEpisodes, *sum.FinalEvalMean, *sum.FinalEvalStd)
			if !*sum.TargetHeld {
				fmt.Fprint(g.stdout, " (below the target)")
			}
		} else {
			fmt.Fprintf(g.stdout, "; eval return %.2f ± %.2f", *sum.FinalEvalMean, *sum.FinalEvalStd)
		}
	}
	if sum.LQRRelativeCost != nil {
		fmt.Fprintf(g.stdout, "; LQR cost %.4f above the Riccati optimum", *sum.LQRRelativeCost)
	}
	if sum.LQRUnstable {
		fmt.Fprint(g.stdout, "; LQR: the trained gain is unstable (infinite average cost)")
	}
	fmt.Fprintln(g.stdout)
	if err == nil { // else the error says which output could not be written
		fmt.Fprintf(g.stdout, "wrote %s\n", filepath.Join(o.out, "{curve.csv,curve.png,policy.safetensors,summary.json}"))
	}
	return err
}

// maxEvalEpisodes bounds rlhub eval --episodes: the returns are kept,
// one float each (a huge count asked for memory at once).
const maxEvalEpisodes = 1_000_000

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
			if episodes < 1 || episodes > maxEvalEpisodes {
				return fmt.Errorf("--episodes %d: from 1 to %d", episodes, maxEvalEpisodes)
			}
			e, err := env.Make(envName)
			if err != nil {
				return err
			}
			defer env.Close(e)
			if err := checkPolicyFits(pol, e.Spec()); err != nil {
				return err
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
				rel, err := arsrun.LQRRelativeCost(pol)
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
