package ars

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Policy is a published ARS policy: architecture, parameters and the filter
// statistics it is paired with. It is what the model store holds (as one
// safetensors state dict) and what policy.safetensors contains.
//
// State dict layout (all F64, little-endian):
//
//	policy.weight         [out, obs]       linear policy (no bias)
//	policy.<i>.weight     [out_i, in_i]    MLP layer i (i = 0, 1, …)
//	policy.<i>.bias       [out_i]
//	filter.count          [1]              states seen
//	filter.mean           [obs]            running mean
//	filter.m2             [obs]            running sum of squared deviations
//
// Metadata (strings): ars.env, ars.version, ars.iteration, ars.seed,
// ars.hidden ("64,64" or ""), ars.discrete (number of actions, 0 for a
// continuous space), ars.obs_dim, ars.out_dim, ars.directions, ars.top,
// ars.step_size, ars.noise, ars.shift; ars.obs_keys for a Dict observation
// space (obskeys.go).
//
// To act: x̃ = (x − mean)/σ with σ² = m2/(count−1) (components with
// σ < MinStd become 0; identity while count < 2), only when ars.version is
// V2 or V2-t; then a = W·x̃, or the MLP; argmax for a discrete space.
type Policy struct {
	Env       string
	Version   Version
	Iteration uint64
	Seed      uint64
	Hyper     Hyper
	Arch      Arch
	Theta     []float64
	Stats     *Stats
	// ObsKeys: the Dict observation space's keys the observation is
	// flattened from (metadata ars.obs_keys, a JSON list of {name, dim});
	// empty for a flat observation.
	ObsKeys []env.ObsKey
}

// Filter returns the frozen filter the policy acts with.
func (p *Policy) Filter() Filter {
	if p.Version.Normalises() {
		return p.Stats.Freeze()
	}
	return Identity(p.Arch.ObsDim)
}

// PolicyOf returns the trainer's current policy (sharing θ and statistics:
// encode it before the next Finish).
func (t *Trainer) PolicyOf() *Policy {
	return &Policy{Env: t.cfg.Env, Version: t.cfg.Hyper.Version, Iteration: t.iter, Seed: t.cfg.Seed,
		Hyper: t.cfg.Hyper, Arch: t.arch, Theta: t.theta, Stats: t.stats, ObsKeys: t.cfg.Spec.ObsKeys}
}

func f64Tensor(name string, shape []int64, v []float64) *tensor.Tensor {
	b := tensor.AlignedBytes(8 * len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return &tensor.Tensor{Name: name, DType: tensor.F64, Shape: shape, Data: b}
}

func f64s(t *tensor.Tensor) []float64 {
	v := make([]float64, len(t.Data)/8)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v
}

// Encode returns the policy as a safetensors blob.
func (p *Policy) Encode() ([]byte, error) {
	var ts []*tensor.Tensor
	for i, l := range p.Arch.layers() {
		w := p.Theta[l.w : l.w+l.in*l.out]
		if p.Arch.Linear() {
			ts = append(ts, f64Tensor("policy.weight", []int64{int64(l.out), int64(l.in)}, w))
			continue
		}
		ts = append(ts, f64Tensor(fmt.Sprintf("policy.%d.weight", i), []int64{int64(l.out), int64(l.in)}, w))
		ts = append(ts, f64Tensor(fmt.Sprintf("policy.%d.bias", i), []int64{int64(l.out)}, p.Theta[l.b:l.b+l.out]))
	}
	obs := int64(p.Arch.ObsDim)
	ts = append(ts,
		f64Tensor("filter.count", []int64{1}, []float64{p.Stats.Count}),
		f64Tensor("filter.mean", []int64{obs}, p.Stats.Mean),
		f64Tensor("filter.m2", []int64{obs}, p.Stats.M2))
	sd, err := tensor.NewStateDict(ts...)
	if err != nil {
		return nil, err
	}
	hidden := make([]string, len(p.Arch.Hidden))
	for i, h := range p.Arch.Hidden {
		hidden[i] = strconv.Itoa(h)
	}
	discrete := 0
	if p.Arch.Discrete {
		discrete = p.Arch.OutDim
	}
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	meta := map[string]string{
		"ars.env":        p.Env,
		"ars.version":    p.Version.String(),
		"ars.iteration":  strconv.FormatUint(p.Iteration, 10),
		"ars.seed":       strconv.FormatUint(p.Seed, 10),
		"ars.hidden":     strings.Join(hidden, ","),
		"ars.discrete":   strconv.Itoa(discrete),
		"ars.obs_dim":    strconv.Itoa(p.Arch.ObsDim),
		"ars.out_dim":    strconv.Itoa(p.Arch.OutDim),
		"ars.directions": strconv.Itoa(p.Hyper.Directions),
		"ars.top":        strconv.Itoa(p.Hyper.Top),
		"ars.step_size":  g(p.Hyper.StepSize),
		"ars.noise":      g(p.Hyper.Noise),
		"ars.shift":      g(p.Hyper.Shift),
	}
	if len(p.ObsKeys) > 0 {
		meta["ars.obs_keys"] = encodeObsKeys(p.ObsKeys)
	}
	return safetensors.Encode(sd, meta)
}

// DecodePolicy parses and validates a policy blob (untrusted bytes). Errors
// wrap errs.ErrInvalid. The returned policy owns its slices.
func DecodePolicy(blob []byte) (*Policy, error) {
	f, err := safetensors.Decode(blob)
	if err != nil {
		return nil, err
	}
	return PolicyFromStateDict(f.Tensors, f.Metadata)
}

// PolicyFromStateDict builds a policy from a decoded state dict and its
// metadata, validating names, dtypes and shapes.
func PolicyFromStateDict(sd *tensor.StateDict, meta map[string]string) (*Policy, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: ars policy: %s", errs.ErrInvalid, fmt.Sprintf(format, a...))
	}
	atoi := func(key string) (int, error) {
		v, err := strconv.Atoi(meta[key])
		if err != nil || v < 0 {
			return 0, bad("metadata %s = %q", key, meta[key])
		}
		return v, nil
	}
	p := &Policy{Env: meta["ars.env"]}
	var err error
	if p.Version, err = ParseVersion(meta["ars.version"]); err != nil {
		return nil, err
	}
	if p.Iteration, err = strconv.ParseUint(meta["ars.iteration"], 10, 64); err != nil {
		return nil, bad("metadata ars.iteration = %q", meta["ars.iteration"])
	}
	if p.Seed, err = strconv.ParseUint(meta["ars.seed"], 10, 64); err != nil {
		return nil, bad("metadata ars.seed = %q", meta["ars.seed"])
	}
	if p.Arch.ObsDim, err = atoi("ars.obs_dim"); err != nil {
		return nil, err
	}
	if p.Arch.OutDim, err = atoi("ars.out_dim"); err != nil {
		return nil, err
	}
	discrete, err := atoi("ars.discrete")
	if err != nil {
		return nil, err
	}
	if discrete > 0 {
		if discrete != p.Arch.OutDim {
			return nil, bad("%d discrete actions but %d outputs", discrete, p.Arch.OutDim)
		}
		p.Arch.Discrete = true
	}
	if h := meta["ars.hidden"]; h != "" {
		for _, s := range strings.Split(h, ",") {
			w, err := strconv.Atoi(s)
			if err != nil {
				return nil, bad("metadata ars.hidden = %q", h)
			}
			p.Arch.Hidden = append(p.Arch.Hidden, w)
		}
	}
	if err := p.Arch.Validate(); err != nil || p.Arch.ObsDim > 1<<16 || p.Arch.OutDim > 1<<16 || len(p.Arch.Hidden) > 16 {
		return nil, bad("architecture obs %d, out %d, hidden %v", p.Arch.ObsDim, p.Arch.OutDim, p.Arch.Hidden)
	}
	p.Hyper.Version = p.Version
	p.Hyper.Directions, _ = strconv.Atoi(meta["ars.directions"])
	p.Hyper.Top, _ = strconv.Atoi(meta["ars.top"])
	p.Hyper.StepSize, _ = strconv.ParseFloat(meta["ars.step_size"], 64)
	p.Hyper.Noise, _ = strconv.ParseFloat(meta["ars.noise"], 64)
	p.Hyper.Shift, _ = strconv.ParseFloat(meta["ars.shift"], 64)

	get := func(name string, shape ...int64) ([]float64, error) {
		t := sd.Get(name)
		if t == nil {
			return nil, bad("missing tensor %q", name)
		}
		want := &tensor.Tensor{DType: tensor.F64, Shape: shape}
		if !t.SameLayout(want) {
			return nil, bad("tensor %q is %v%v, want F64%v", name, t.DType, t.Shape, shape)
		}
		return f64s(t), nil
	}
	p.Theta = make([]float64, 0, p.Arch.NumParams())
	names := 3
	for i, l := range p.Arch.layers() {
		wname, bname := fmt.Sprintf("policy.%d.weight", i), fmt.Sprintf("policy.%d.bias", i)
		if p.Arch.Linear() {
			wname = "policy.weight"
		}
		w, err := get(wname, int64(l.out), int64(l.in))
		if err != nil {
			return nil, err
		}
		p.Theta = append(p.Theta, w...)
		names++
		if l.b >= 0 {
			b, err := get(bname, int64(l.out))
			if err != nil {
				return nil, err
			}
			p.Theta = append(p.Theta, b...)
			names++
		}
	}
	if sd.Len() != names {
		return nil, bad("%d tensors, want %d", sd.Len(), names)
	}
	for i, v := range p.Theta {
		if !finite(v) {
			return nil, bad("parameter %d is %v", i, v)
		}
	}
	obs := int64(p.Arch.ObsDim)
	count, err := get("filter.count", 1)
	if err != nil {
		return nil, err
	}
	p.Stats = &Stats{Count: count[0]}
	if p.Stats.Mean, err = get("filter.mean", obs); err != nil {
		return nil, err
	}
	if p.Stats.M2, err = get("filter.m2", obs); err != nil {
		return nil, err
	}
	if err := p.Stats.check(p.Arch.ObsDim, runStats); err != nil {
		return nil, err
	}
	if p.ObsKeys, err = decodeObsKeys(meta["ars.obs_keys"], p.Arch.ObsDim); err != nil {
		return nil, err
	}
	return p, nil
}
