package ars

import (
	"fmt"
	"math"
)

// Arch is a policy's architecture: the shapes that turn a flat parameter
// vector θ into a function from observations to actions. It never changes
// during a run; θ does.
//
// With no Hidden layers it is the paper's linear policy a = M·x (no bias).
// With Hidden layers it is an MLP: tanh hidden layers with biases and a
// linear output layer with a bias (forward pass only: ARS needs no
// gradients).
//
// θ is laid out layer by layer: the weight matrix (out × in, row-major),
// then (MLP only) the bias vector.
type Arch struct {
	ObsDim int
	// OutDim is the action length of a continuous space, or the number of
	// actions of a discrete one.
	OutDim int
	// Discrete selects argmax over OutDim outputs (ties: lowest index) as
	// the action; otherwise the outputs are the action (the environment
	// clips them to its bounds).
	Discrete bool
	Hidden   []int
}

// Validate checks the dimensions.
func (a *Arch) Validate() error {
	if a.ObsDim < 1 || a.OutDim < 1 {
		return fmt.Errorf("ars: policy needs ObsDim, OutDim ≥ 1, got %d, %d", a.ObsDim, a.OutDim)
	}
	for _, h := range a.Hidden {
		if h < 1 || h > 4096 {
			return fmt.Errorf("ars: hidden layer width %d outside [1, 4096]", h)
		}
	}
	return nil
}

// Linear reports whether a is the paper's linear policy.
func (a *Arch) Linear() bool { return len(a.Hidden) == 0 }

// layer is one affine map of the architecture.
type layer struct {
	in, out  int
	w, b     int // offsets of weights and bias in θ; b < 0 when no bias
	nextSize int
}

func (a *Arch) layers() []layer {
	sizes := append(append([]int{a.ObsDim}, a.Hidden...), a.OutDim)
	var ls []layer
	off := 0
	for i := 0; i+1 < len(sizes); i++ {
		l := layer{in: sizes[i], out: sizes[i+1], w: off, b: -1}
		off += l.in * l.out
		if !a.Linear() {
			l.b = off
			off += l.out
		}
		ls = append(ls, l)
	}
	return ls
}

// NumParams is len(θ).
func (a *Arch) NumParams() int {
	n := 0
	for _, l := range a.layers() {
		n += l.in * l.out
		if l.b >= 0 {
			n += l.out
		}
	}
	return n
}

// InitParams returns θ_0: zeros for the linear policy (Algorithm 2's
// M_0 = 0); for an MLP, weights drawn as N(0, 1/in) from the seed's
// TagInit stream (index = layer number) and zero biases.
func (a *Arch) InitParams(seed uint64) []float64 {
	theta := make([]float64, a.NumParams())
	if a.Linear() {
		return theta
	}
	for i, l := range a.layers() {
		w := theta[l.w : l.w+l.in*l.out]
		Normals(w, seed, TagInit, uint64(i))
		s := 1 / math.Sqrt(float64(l.in))
		for k := range w {
			w[k] *= s
		}
	}
	return theta
}

// Forward holds scratch buffers for evaluating a policy; one per goroutine.
type Forward struct {
	arch   *Arch
	layers []layer
	x      []float64 // normalised observation
	h      [][]float64
	Action []float64 // the last action: the index for a discrete space
}

// NewForward prepares scratch space for arch.
func NewForward(arch *Arch) *Forward {
	f := &Forward{arch: arch, layers: arch.layers(), x: make([]float64, arch.ObsDim)}
	for _, l := range f.layers {
		f.h = append(f.h, make([]float64, l.out))
	}
	if arch.Discrete {
		f.Action = make([]float64, 1)
	} else {
		f.Action = make([]float64, arch.OutDim)
	}
	return f
}

// Act computes the action for observation obs under parameters theta and
// filter flt, stores it in f.Action and returns it. The returned slice is
// f's own, valid until the next call.
func (f *Forward) Act(theta []float64, flt Filter, obs []float64) []float64 {
	flt.Apply(f.x, obs)
	in := f.x
	for i, l := range f.layers {
		out := f.h[i]
		for o := 0; o < l.out; o++ {
			row := theta[l.w+o*l.in : l.w+(o+1)*l.in]
			var s float64
			for k, v := range in {
				s += float64(row[k] * v)
			}
			if l.b >= 0 {
				s += theta[l.b+o]
			}
			if i+1 < len(f.layers) {
				s = math.Tanh(s)
			}
			out[o] = s
		}
		in = out
	}
	if f.arch.Discrete {
		best := 0
		for o := 1; o < len(in); o++ {
			if in[o] > in[best] {
				best = o
			}
		}
		f.Action[0] = float64(best)
	} else {
		copy(f.Action, in)
	}
	return f.Action
}
