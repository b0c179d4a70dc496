package run

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rlhub/rlhub/internal/errs"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// File is a run file (`rlhub train ars --config run.yaml`) and the
// resolved configuration every run writes to OUT/config.yaml: the run's
// spec with every default filled in, and how it was run. Replaying
// OUT/config.yaml (with another --out) reproduces the run's policy byte
// for byte. Keys are the long flag names with "_" for "-"; a field left
// out of a hand-written file takes the flag's default. Unknown keys are
// errors.
type File struct {
	Env             string   `yaml:"env"`
	Seed            *uint64  `yaml:"seed,omitempty"`
	Version         string   `yaml:"version,omitempty"`
	Directions      uint32   `yaml:"directions,omitempty"`
	Top             uint32   `yaml:"top,omitempty"`
	StepSize        float64  `yaml:"step_size,omitempty"`
	Noise           float64  `yaml:"noise,omitempty"`
	Shift           float64  `yaml:"shift,omitempty"`
	Hidden          []uint32 `yaml:"hidden,omitempty,flow"`
	Protocol        string   `yaml:"protocol,omitempty"`
	EvalEvery       uint32   `yaml:"eval_every,omitempty"`
	EvalEpisodes    uint32   `yaml:"eval_episodes,omitempty"`
	ConfirmEpisodes uint32   `yaml:"confirm_episodes,omitempty"`
	// Target, when set, stops the run once an evaluation reaches it.
	Target        *float64 `yaml:"target,omitempty"`
	MaxEpisodes   int64    `yaml:"max_episodes,omitempty"`
	MaxIterations uint32   `yaml:"max_iterations,omitempty"`
	// EnvSpec: the spaces of an environment only Python workers run.
	ObsDim   uint32 `yaml:"obs_dim,omitempty"`
	Discrete uint32 `yaml:"discrete,omitempty"`
	ActDim   uint32 `yaml:"act_dim,omitempty"`
	// ObsKeys: the keys of a Dict observation space, "name:dim" in the
	// space's order (--obs-keys).
	ObsKeys []string `yaml:"obs_keys,omitempty,flow"`
	// Optimizer: how θ moves (default: the paper's step); GradientMax
	// clips the ARS gradient's norm (0: none).
	Optimizer   *OptimizerFile `yaml:"optimizer,omitempty"`
	GradientMax float64        `yaml:"gradient_max,omitempty"`

	Workers         *int   `yaml:"workers,omitempty"`
	Hub             string `yaml:"hub,omitempty"`
	ReconnectWindow string `yaml:"reconnect_window,omitempty"`
}

// OptimizerFile is a run file's optimizer: kind ("step", the paper's
// update, or one of internal/optim's kinds) with that kind's
// hyper-parameters and an lr schedule; the keys are rlhub.v1.ReducerOptimizer's
// fields. There is no lr: step_size is the learning rate.
type OptimizerFile struct {
	Kind                    string  `yaml:"kind" json:"kind"`
	WeightDecay             float64 `yaml:"weight_decay,omitempty" json:"weight_decay,omitempty"`
	Momentum                float64 `yaml:"momentum,omitempty" json:"momentum,omitempty"`
	Dampening               float64 `yaml:"dampening,omitempty" json:"dampening,omitempty"`
	Nesterov                bool    `yaml:"nesterov,omitempty" json:"nesterov,omitempty"`
	Beta1                   float64 `yaml:"beta1,omitempty" json:"beta1,omitempty"`
	Beta2                   float64 `yaml:"beta2,omitempty" json:"beta2,omitempty"`
	Eps                     float64 `yaml:"eps,omitempty" json:"eps,omitempty"`
	Alpha                   float64 `yaml:"alpha,omitempty" json:"alpha,omitempty"`
	Centered                bool    `yaml:"centered,omitempty" json:"centered,omitempty"`
	LRDecay                 float64 `yaml:"lr_decay,omitempty" json:"lr_decay,omitempty"`
	InitialAccumulatorValue float64 `yaml:"initial_accumulator_value,omitempty" json:"initial_accumulator_value,omitempty"`
	MomentumDecay           float64 `yaml:"momentum_decay,omitempty" json:"momentum_decay,omitempty"`
	DecoupledWeightDecay    bool    `yaml:"decoupled_weight_decay,omitempty" json:"decoupled_weight_decay,omitempty"`
	// The lr schedule (internal/optim): "" (constant), step or cosine.
	Schedule    string  `yaml:"schedule,omitempty" json:"schedule,omitempty"`
	StepSize    int64   `yaml:"step_size,omitempty" json:"step_size,omitempty"`
	Gamma       float64 `yaml:"gamma,omitempty" json:"gamma,omitempty"`
	TMax        int64   `yaml:"t_max,omitempty" json:"t_max,omitempty"`
	MinLR       float64 `yaml:"min_lr,omitempty" json:"min_lr,omitempty"`
	WarmupSteps int64   `yaml:"warmup_steps,omitempty" json:"warmup_steps,omitempty"`
	WarmupStart float64 `yaml:"warmup_start,omitempty" json:"warmup_start,omitempty"`
}

// Proto is the optimizer as a run spec holds it.
func (o *OptimizerFile) Proto() *pb.ReducerOptimizer {
	if o == nil {
		return nil
	}
	return &pb.ReducerOptimizer{Kind: o.Kind, WeightDecay: o.WeightDecay, Momentum: o.Momentum, Dampening: o.Dampening,
		Nesterov: o.Nesterov, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, Alpha: o.Alpha, Centered: o.Centered,
		LrDecay: o.LRDecay, InitialAccumulatorValue: o.InitialAccumulatorValue, MomentumDecay: o.MomentumDecay,
		DecoupledWeightDecay: o.DecoupledWeightDecay, Schedule: o.Schedule, StepSize: o.StepSize, Gamma: o.Gamma,
		TMax: o.TMax, MinLr: o.MinLR, WarmupSteps: o.WarmupSteps, WarmupStart: o.WarmupStart}
}

func optimizerFile(o *pb.ReducerOptimizer) *OptimizerFile {
	if o == nil {
		return nil
	}
	return &OptimizerFile{Kind: o.Kind, WeightDecay: o.WeightDecay, Momentum: o.Momentum, Dampening: o.Dampening,
		Nesterov: o.Nesterov, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, Alpha: o.Alpha, Centered: o.Centered,
		LRDecay: o.LrDecay, InitialAccumulatorValue: o.InitialAccumulatorValue, MomentumDecay: o.MomentumDecay,
		DecoupledWeightDecay: o.DecoupledWeightDecay, Schedule: o.Schedule, StepSize: o.StepSize, Gamma: o.Gamma,
		TMax: o.TMax, MinLR: o.MinLr, WarmupSteps: o.WarmupSteps, WarmupStart: o.WarmupStart}
}

// ParseObsKeys reads Dict observation keys given as "name:dim".
func ParseObsKeys(ss []string) ([]*pb.ARSObsKey, error) {
	var out []*pb.ARSObsKey
	for _, s := range ss {
		name, d, ok := strings.Cut(s, ":")
		n, err := strconv.ParseUint(d, 10, 32)
		if !ok || name == "" || err != nil || n == 0 {
			return nil, fmt.Errorf("observation key %s: want NAME:DIM with DIM ≥ 1", errs.Quote(s))
		}
		out = append(out, &pb.ARSObsKey{Name: name, Dim: uint32(n)})
	}
	return out, nil
}

// FormatObsKeys is the inverse of ParseObsKeys.
func FormatObsKeys(ks []*pb.ARSObsKey) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.Name+":"+strconv.FormatUint(uint64(k.Dim), 10))
	}
	return out
}

// maxFileBytes bounds a run file.
const maxFileBytes = 1 << 20

// LoadFile reads a run file, rejecting unknown keys and trailing
// documents.
func LoadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxFileBytes {
		return nil, fmt.Errorf("run file %s is larger than %d bytes", path, maxFileBytes)
	}
	var rf File
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("run file %s: %w", path, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("run file %s: one YAML document expected", path)
	}
	if _, err := ParseObsKeys(rf.ObsKeys); err != nil {
		return nil, fmt.Errorf("run file %s: obs_keys: %w", path, err)
	}
	if rf.ReconnectWindow != "" {
		if _, err := time.ParseDuration(rf.ReconnectWindow); err != nil {
			return nil, fmt.Errorf("run file %s: reconnect_window: %w", path, err)
		}
	}
	return &rf, nil
}

// Spec is the run spec the file describes.
func (f *File) Spec() *pb.ARSRunSpec {
	s := &pb.ARSRunSpec{Env: f.Env, Version: f.Version, Directions: f.Directions, Top: f.Top,
		StepSize: f.StepSize, Noise: f.Noise, Shift: f.Shift, Hidden: f.Hidden, Protocol: f.Protocol,
		EvalEvery: f.EvalEvery, EvalEpisodes: f.EvalEpisodes, ConfirmEpisodes: f.ConfirmEpisodes,
		MaxEpisodes: f.MaxEpisodes, MaxIterations: f.MaxIterations,
		Optimizer: f.Optimizer.Proto(), GradientMax: f.GradientMax}
	if f.Seed != nil {
		s.Seed = *f.Seed
	}
	if f.Target != nil {
		s.UseTarget, s.Target = true, *f.Target
	}
	if f.ObsDim > 0 || f.Discrete > 0 || f.ActDim > 0 || len(f.ObsKeys) > 0 {
		keys, _ := ParseObsKeys(f.ObsKeys) // LoadFile checked them
		s.EnvSpec = &pb.ARSEnvSpec{ObsDim: f.ObsDim, Discrete: f.Discrete, ActDim: f.ActDim, ObsKeys: keys}
	}
	return s
}

// resolvedFile is the File of a normalised spec and the run's settings.
func resolvedFile(spec *pb.ARSRunSpec, cfg *Config) *File {
	seed, workers := spec.Seed, cfg.Workers
	f := &File{Env: spec.Env, Seed: &seed, Version: spec.Version, Directions: spec.Directions, Top: spec.Top,
		StepSize: spec.StepSize, Noise: spec.Noise, Shift: spec.Shift, Hidden: spec.Hidden, Protocol: spec.Protocol,
		EvalEvery: spec.EvalEvery, EvalEpisodes: spec.EvalEpisodes, ConfirmEpisodes: spec.ConfirmEpisodes,
		MaxEpisodes: spec.MaxEpisodes, MaxIterations: spec.MaxIterations,
		Optimizer: optimizerFile(spec.Optimizer), GradientMax: spec.GradientMax,
		Workers: &workers, Hub: cfg.Hub, ReconnectWindow: cfg.ReconnectWindow.String()}
	if spec.UseTarget {
		t := spec.Target
		f.Target = &t
	}
	if e := spec.EnvSpec; e != nil {
		f.ObsDim, f.Discrete, f.ActDim, f.ObsKeys = e.ObsDim, e.Discrete, e.ActDim, FormatObsKeys(e.ObsKeys)
	}
	return f
}

// Marshal renders the file as YAML.
func (f *File) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("# rlhub train ars run file: replay with `rlhub train ars --config THIS --out NEW`\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
