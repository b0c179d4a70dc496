package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/tensor"
)

// loopLengths covers every tail length of the 8-lane loops, plus sizes
// spanning many vectors.
func loopLengths() []int {
	var ls []int
	for n := 0; n <= 40; n++ {
		ls = append(ls, n)
	}
	return append(ls, 1000, 4099)
}

// loopConfigs lists optimizer configurations covering every branch of the
// loops (weight decay on and off, each momentum form, both lerp formulas).
var loopConfigs = []Config{
	{Kind: SGD, LR: 0.1, WeightDecay: 0.01},
	{Kind: SGD, LR: 0.1, Momentum: 0.9},
	{Kind: SGD, LR: 0.1, Momentum: 0.9, Dampening: 0.3, WeightDecay: 0.01},
	{Kind: SGD, LR: 0.1, Momentum: 0.8, Nesterov: true},
	{Kind: SGD, LR: 0.1, Momentum: 0.8, Nesterov: true, WeightDecay: 0.001},
	{Kind: Adam, LR: 1e-3},
	{Kind: Adam, LR: 1e-2, Beta1: 0.3, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.1}, // 1−β1 ≥ 0.5
	{Kind: AdamW, LR: 1e-2},
	{Kind: AdamW, LR: 3e-3, Beta1: 0.5, WeightDecay: 0.5},
	{Kind: RMSprop, LR: 1e-2},
	{Kind: RMSprop, LR: 1e-2, Alpha: 0.4, WeightDecay: 0.05}, // 1−α ≥ 0.5
	{Kind: RMSprop, LR: 1e-2, Momentum: 0.7},
	{Kind: RMSprop, LR: 1e-2, Alpha: 0.9, Eps: 1e-5, Momentum: 0.7, Centered: true, WeightDecay: 0.05},
	{Kind: RMSprop, LR: 1e-2, Alpha: 0.3, Centered: true},
}

// TestLoopPathsBitIdentical: every loop implementation gives the generic
// loop's bits, for parameters, state buffers and the output, on every
// length and alignment, into another buffer and in place, over several
// steps (the first one starting from fresh state).
func TestLoopPathsBitIdentical(t *testing.T) {
	if len(loopPaths) == 1 {
		t.Logf("only the generic loops run on this build and CPU")
	}
	saved := activeLoops
	defer func() { activeLoops = saved }()
	for _, cfg := range loopConfigs {
		for _, n := range loopLengths() {
			for _, off := range []int{0, 1, 3} {
				for _, inPlace := range []bool{false, true} {
					name := fmt.Sprintf("%+v/n=%d/off=%d/inPlace=%v", cfg, n, off, inPlace)
					var ref []*Optimizer
					var refP [][]float32
					for pi, path := range loopPaths {
						activeLoops = path
						r := rand.New(rand.NewPCG(uint64(n), uint64(off)))
						p := randVec(r, n, off)
						o := newVecOptimizer(t, cfg, n)
						for step := range 4 {
							g := randVec(r, n, off+1)
							dst := p
							if !inPlace {
								dst = randVec(r, n, off+2)
							}
							stepVec(t, o, dst, p, g)
							p = dst
							if pi == 0 {
								ref = append(ref, cloneOptimizer(o))
								refP = append(refP, slices.Clone(p))
								continue
							}
							if err := sameBits(p, refP[step]); err != nil {
								t.Fatalf("%s: path %s step %d: params: %v", name, path.name, step, err)
							}
							for slot, bufs := range o.state {
								if err := sameBits(bufs[0], ref[step].state[slot][0]); err != nil {
									t.Fatalf("%s: path %s step %d: %s: %v", name, path.name, step, slot, err)
								}
							}
						}
					}
				}
			}
		}
	}
}

func randVec(r *rand.Rand, n, off int) []float32 {
	x := make([]float32, n+off)[off:]
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(12)-6)))
	}
	return x
}

func newVecOptimizer(t *testing.T, cfg Config, n int) *Optimizer {
	t.Helper()
	o, err := New(cfg, vecSD(make([]float32, n)))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// vecSD views f as a one-tensor state dict (no copy).
func vecSD(f []float32) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{int64(len(f))}, f))
	return sd
}

func stepVec(t *testing.T, o *Optimizer, dst, p, g []float32) {
	t.Helper()
	if err := o.StepTo(vecSD(dst), vecSD(p), vecSD(g)); err != nil {
		t.Fatal(err)
	}
}

func cloneOptimizer(o *Optimizer) *Optimizer {
	c := *o
	c.state = map[string][][]float32{}
	for slot, bufs := range o.state {
		for _, b := range bufs {
			c.state[slot] = append(c.state[slot], slices.Clone(b))
		}
	}
	return &c
}

func sameBits(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("[%d] = %v (%#08x), generic gives %v (%#08x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	return nil
}
