package run

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/env"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// OutMode says what Run does with an output directory that already holds
// a run.
type OutMode int

const (
	// OutFresh refuses a directory that holds an earlier run's files (an
	// empty or missing directory is fine): nothing is ever silently
	// overwritten.
	OutFresh OutMode = iota
	// OutOverwrite deletes an earlier run's files (and its embedded hub's
	// state) first.
	OutOverwrite
	// OutResume continues the run recorded in OUT/run.json: on its hub
	// (Config.Hub, or the address recorded), or on an embedded hub reopened
	// on OUT/hub, which resumes the run from its last finished iteration.
	OutResume
)

// Config describes one training run. The zero value of every optional
// field means what its comment says.
type Config struct {
	// Spec is the run as the hub's coordinator takes it; zero fields take
	// the environment's defaults (arsrpc.Normalise). Required, with Env.
	// Run does not modify it.
	Spec *pb.ARSRunSpec
	// Hub is the address of a running hub; "" starts an embedded hub on
	// 127.0.0.1 whose state lives under Out/hub (so OutResume can reopen
	// it).
	Hub string
	// Workers is the number of worker processes Run starts (this binary's
	// `worker ars`); 0 relies on workers already attached to Hub and is
	// refused with an embedded hub.
	Workers int
	// WorkerCommand is the argv prefix that runs this binary (Run appends
	// `--log-level warn worker ars --hub ADDR --name worker-I --retry-for
	// WINDOW`); nil means os.Executable().
	WorkerCommand []string
	// WorkerOutput receives the worker processes' stdout and stderr; nil
	// means io.Discard. It must be safe for concurrent writes.
	WorkerOutput io.Writer
	// Out is the output directory; required.
	Out     string
	OutMode OutMode
	// Progress receives a progress display; nil means none. It must be
	// safe for concurrent writes when it is also WorkerOutput or a log's.
	Progress io.Writer
	// Terminal: Progress is a terminal, so one bar is redrawn in place;
	// otherwise one line is printed per iteration.
	Terminal bool
	// Observer sees every finished iteration once, in order, on Run's
	// goroutine (it must not block for long); nil means none.
	Observer Observer
	// ReconnectWindow is how long a hub that became unreachable after the
	// run started is retried (with backoff) before Run gives up; workers
	// Run starts get the same window. 0 means 2 minutes.
	ReconnectWindow time.Duration
	// StartTimeout bounds starting the run on the hub; a hub that refuses
	// connections fails at once. 0 means 10s.
	StartTimeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Dial is how Run reaches the hub (TLS, token); the zero value dials
	// plaintext, as on loopback.
	Dial dial.Config
	// WorkerArgs are extra flags for each worker process Run starts (the
	// connection flags that reproduce Dial on its command line).
	WorkerArgs []string
}

func (c *Config) validate() (*pb.ARSRunSpec, error) {
	if c.Spec == nil || c.Spec.Env == "" {
		return nil, errors.New("run: Config.Spec with an environment is required")
	}
	if c.Out == "" {
		return nil, errors.New("run: Config.Out is required")
	}
	if c.Spec.EnvSpec == nil {
		e, err := env.Make(c.Spec.Env)
		if err != nil {
			return nil, fmt.Errorf("environment: %w (for a Gymnasium env served by Python workers give its spaces: --obs-dim with --discrete or --act-dim)", err)
		}
		env.Close(e) // made to check it exists only
	} else if c.Hub == "" || c.Workers != 0 {
		// An environment only Python workers can run: no Go worker may be
		// started for it.
		return nil, errors.New("an env given by its spaces (--obs-dim/--discrete/--act-dim) is served by Python workers: use it with --hub and --workers 0")
	}
	spec, _, err := arsrpc.Normalise(c.Spec)
	if err != nil {
		return nil, err // the hub would refuse the run: say so before starting anything
	}
	if c.Workers < 0 || (c.Workers == 0 && c.Hub == "") {
		return nil, fmt.Errorf("workers %d: need at least one worker with an embedded hub", c.Workers)
	}
	if c.OutMode < OutFresh || c.OutMode > OutResume {
		return nil, fmt.Errorf("run: unknown OutMode %d", c.OutMode)
	}
	if c.WorkerCommand == nil && c.Workers > 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("locate own binary: %w", err)
		}
		c.WorkerCommand = []string{exe}
	}
	if c.WorkerOutput == nil {
		c.WorkerOutput = io.Discard
	}
	if c.ReconnectWindow == 0 {
		c.ReconnectWindow = 2 * time.Minute
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 10 * time.Second
	}
	if c.ReconnectWindow < 0 || c.StartTimeout < 0 {
		return nil, fmt.Errorf("run: negative ReconnectWindow %v or StartTimeout %v", c.ReconnectWindow, c.StartTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Spec = proto.Clone(c.Spec).(*pb.ARSRunSpec)
	return spec, nil
}

// Iteration is what an Observer sees of one finished iteration.
type Iteration struct {
	Iteration uint64
	// Version is the store version of the policy after the iteration.
	Version uint64
	// Episodes: training episodes so far; PolicyEpisodes: those behind
	// the policy this iteration evaluated.
	Episodes, PolicyEpisodes int64
	EvalEpisodes             int64
	// Steps: environment steps so far (training and evaluation).
	Steps int64
	// Wall: time since the run started, on this machine.
	Wall           time.Duration
	StepsPerSecond float64
	// TrainReturn is the mean of the iteration's 2N shifted training
	// returns; HasTrain is false for an evaluation-only iteration.
	TrainReturn float64
	HasTrain    bool
	// EvalReturn ± EvalStd over the iteration's evaluation episodes, when
	// HasEval. Confirm marks the re-evaluation on fresh episodes after the
	// target was reached.
	HasEval             bool
	EvalReturn, EvalStd float64
	Confirm             bool
	// Protocol is the run's evaluation protocol ("paper" or "fast").
	Protocol string
}

// Observer receives finished iterations (metrics, TensorBoard, …).
type Observer interface {
	OnIteration(Iteration)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Iteration)

// OnIteration calls f.
func (f ObserverFunc) OnIteration(it Iteration) { f(it) }

// Observers fans one iteration out to several observers in order.
type Observers []Observer

// OnIteration calls each observer.
func (os Observers) OnIteration(it Iteration) {
	for _, o := range os {
		if o != nil {
			o.OnIteration(it)
		}
	}
}
