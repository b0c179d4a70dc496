package run

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

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

	Workers         *int   `yaml:"workers,omitempty"`
	Hub             string `yaml:"hub,omitempty"`
	ReconnectWindow string `yaml:"reconnect_window,omitempty"`
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
		MaxEpisodes: f.MaxEpisodes, MaxIterations: f.MaxIterations}
	if f.Seed != nil {
		s.Seed = *f.Seed
	}
	if f.Target != nil {
		s.UseTarget, s.Target = true, *f.Target
	}
	if f.ObsDim > 0 || f.Discrete > 0 || f.ActDim > 0 {
		s.EnvSpec = &pb.ARSEnvSpec{ObsDim: f.ObsDim, Discrete: f.Discrete, ActDim: f.ActDim}
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
		Workers: &workers, Hub: cfg.Hub, ReconnectWindow: cfg.ReconnectWindow.String()}
	if spec.UseTarget {
		t := spec.Target
		f.Target = &t
	}
	if e := spec.EnvSpec; e != nil {
		f.ObsDim, f.Discrete, f.ActDim = e.ObsDim, e.Discrete, e.ActDim
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
