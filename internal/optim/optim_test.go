package optim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

type jsonTensor struct {
	Shape []int64   `json:"shape"`
	Data  []float64 `json:"data"`
}

type vectorCase struct {
	Name   string                  `json:"name"`
	Config Config                  `json:"config"`
	Params map[string]jsonTensor   `json:"params"`
	Grads  []map[string]jsonTensor `json:"grads"`
	Want   []map[string]jsonTensor `json:"want"`
	LRs    []float64               `json:"lrs"`
}

type scheduleCase struct {
	Name     string    `json:"name"`
	LR       float64   `json:"lr"`
	Schedule Schedule  `json:"schedule"`
	LRs      []float64 `json:"lrs"`
}

type vectors struct {
	Torch     string         `json:"torch"`
	Cases     []vectorCase   `json:"cases"`
	Schedules []scheduleCase `json:"schedules"`
}

// order fixes the tensor order of the vectors' state dicts.
var order = []string{"layer.weight", "layer.bias"}

func toSD(t *testing.T, m map[string]jsonTensor) *tensor.StateDict {
	t.Helper()
	sd := &tensor.StateDict{}
	for _, name := range order {
		jt, ok := m[name]
		if !ok {
			t.Fatalf("vector lacks %q", name)
		}
		f := make([]float32, len(jt.Data))
		for i, v := range jt.Data {
			f[i] = float32(v)
		}
		if err := sd.Add(tensor.FromFloat32s(name, jt.Shape, f)); err != nil {
			t.Fatal(err)
		}
	}
	return sd
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/torch_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no cases in testdata/torch_vectors.json")
	}
	return v
}

// Tolerance for matching torch: float32 arithmetic in a possibly different
// order (torch may fuse multiply-adds), a few ulps per step compounded over
// six steps.
const rtol, atol = 2e-5, 1e-6

func closeTo(got, want float32) bool {
	return math.Abs(float64(got)-float64(want)) <= atol+rtol*math.Abs(float64(want))
}

// TestMatchesTorch replays every committed torch.optim vector.
func TestMatchesTorch(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			params := toSD(t, c.Params)
			o, err := New(c.Config, params)
			if err != nil {
				t.Fatal(err)
			}
			for k := range c.Grads {
				if got, want := o.LR(), c.LRs[k]; math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
					t.Errorf("step %d: lr %v, torch %v", k, got, want)
				}
				if err := o.Step(params, toSD(t, c.Grads[k])); err != nil {
					t.Fatal(err)
				}
				want := toSD(t, c.Want[k])
				for _, name := range order {
					g, _ := params.Get(name).Float32s()
					w, _ := want.Get(name).Float32s()
					for i := range g {
						if !closeTo(g[i], w[i]) {
							t.Fatalf("step %d: %s[%d] = %v, torch %v (diff %g)", k, name, i, g[i], w[i], g[i]-w[i])
						}
					}
				}
			}
		})
	}
}

// ulps is the distance between a and b in float32 units in the last place.
func ulps(a, b float32) int64 {
	ord := func(f float32) int64 {
		i := int64(int32(math.Float32bits(f)))
		if i < 0 {
			i = math.MinInt32 - i
		}
		return i
	}
	d := ord(a) - ord(b)
	if d < 0 {
		d = -d
	}
	return d
}

// TestSchedulesMatchTorch replays torch's scheduler objects (LinearLR,
// StepLR, CosineAnnealingLR, ChainedScheduler of LinearLR with each) over
// 300 steps: every rate within 1 ulp of float32, through Schedule.LR and
// through an optimizer that follows the schedule step by step.
func TestSchedulesMatchTorch(t *testing.T) {
	v := loadVectors(t)
	if len(v.Schedules) < 10 {
		t.Fatalf("%d schedule vectors, want every kind alone and with warm-up", len(v.Schedules))
	}
	params := tensor.NewF32("w", 1)
	sd, _ := tensor.NewStateDict(params)
	for _, c := range v.Schedules {
		t.Run(c.Name, func(t *testing.T) {
			if len(c.LRs) < 200 {
				t.Fatalf("%d steps, want ≥ 200", len(c.LRs))
			}
			s := c.Schedule
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			o, err := New(Config{Kind: SGD, LR: c.LR, Schedule: c.Schedule}, sd)
			if err != nil {
				t.Fatal(err)
			}
			grad, _ := tensor.NewStateDict(tensor.NewF32("w", 1))
			worst := int64(0)
			for k, want := range c.LRs {
				got := s.LR(c.LR, int64(k))
				if d := ulps(float32(got), float32(want)); d > 1 {
					t.Fatalf("step %d: lr %v, torch %v (%d ulps of float32)", k, got, want, d)
				} else if d > worst {
					worst = d
				}
				if ol := o.LR(); ol != got {
					t.Fatalf("step %d: optimizer lr %v, Schedule.LR %v", k, ol, got)
				}
				if err := o.Step(sd, grad); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%d steps, worst %d ulp", len(c.LRs), worst)
		})
	}
}

func randSD(r *rand.Rand, scale float32) *tensor.StateDict {
	sd := &tensor.StateDict{}
	for _, s := range []struct {
		name  string
		shape []int64
	}{{"a", []int64{7, 3}}, {"b", []int64{4}}} {
		tn := tensor.NewF32(s.name, s.shape...)
		f, _ := tn.Float32s()
		for i := range f {
			f[i] = scale * float32(r.NormFloat64())
		}
		_ = sd.Add(tn)
	}
	return sd
}

// TestCheckpointRestore: stepping 3 times, checkpointing through
// safetensors bytes, restoring into a fresh optimizer and stepping 3 more
// gives bit-identical parameters to 6 uninterrupted steps.
func TestCheckpointRestore(t *testing.T) {
	cfgs := []Config{
		{Kind: SGD, LR: 0.1, Momentum: 0.9, Nesterov: true},
		{Kind: Adam, LR: 0.01, Schedule: Schedule{Kind: Cosine, TMax: 5}},
		{Kind: AdamW, LR: 0.01},
		{Kind: RMSprop, LR: 0.01, Momentum: 0.5, Centered: true, Schedule: Schedule{WarmupSteps: 3}},
		{Kind: Adagrad, LR: 0.1, InitialAccumulatorValue: 0.1, LRDecay: 0.01},
		{Kind: Adamax, LR: 0.01},
		{Kind: NAdam, LR: 0.01, Schedule: Schedule{Kind: Cosine, TMax: 4, MinLR: 0.001, WarmupSteps: 2}},
		{Kind: RAdam, LR: 0.01, Beta2: 0.9},
	}
	for _, cfg := range cfgs {
		t.Run(string(cfg.Kind), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			init := randSD(r, 1)
			grads := make([]*tensor.StateDict, 6)
			for i := range grads {
				grads[i] = randSD(r, 0.5)
			}
			ref := init.Clone()
			oRef, err := New(cfg, ref)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range grads {
				if err := oRef.Step(ref, g); err != nil {
					t.Fatal(err)
				}
			}

			p := init.Clone()
			o1, _ := New(cfg, p)
			for _, g := range grads[:3] {
				_ = o1.Step(p, g)
			}
			st, meta := o1.State()
			blob, err := safetensors.Encode(st, meta)
			if err != nil {
				t.Fatal(err)
			}
			f, err := safetensors.Decode(blob)
			if err != nil {
				t.Fatal(err)
			}
			o2, _ := New(cfg, p)
			if err := o2.Restore(f.Tensors, f.Metadata); err != nil {
				t.Fatal(err)
			}
			if o2.Steps() != 3 {
				t.Fatalf("restored steps %d, want 3", o2.Steps())
			}
			for _, g := range grads[3:] {
				_ = o2.Step(p, g)
			}
			for _, name := range []string{"a", "b"} {
				a, _ := p.Get(name).Float32s()
				b, _ := ref.Get(name).Float32s()
				if !slices.Equal(a, b) {
					t.Fatalf("%s: restored run %v, uninterrupted %v", name, a, b)
				}
			}
		})
	}
}

func TestRestoreRejectsMismatch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := randSD(r, 1)
	adam, _ := New(Config{Kind: Adam, LR: 0.1}, p)
	_ = adam.Step(p.Clone(), randSD(r, 1))
	st, meta := adam.State()

	sgd, _ := New(Config{Kind: SGD, LR: 0.1, Momentum: 0.9}, p)
	if err := sgd.Restore(st, meta); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("adam state into sgd: %v, want ErrInvalid", err)
	}
	other := &tensor.StateDict{}
	_ = other.Add(tensor.NewF32("a", 2, 2))
	adam2, _ := New(Config{Kind: Adam, LR: 0.1}, other)
	if err := adam2.Restore(st, meta); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("state for another layout: %v, want ErrInvalid", err)
	}
	if adam2.Steps() != 0 {
		t.Fatal("failed restore changed the step count")
	}
	// A state whose last buffer is misshapen, restored into an optimizer
	// that has stepped: refused, its moments and step count as they were.
	stepped, _ := New(Config{Kind: Adam, LR: 0.1}, p)
	_ = stepped.Step(p.Clone(), randSD(r, 1))
	_ = stepped.Step(p.Clone(), randSD(r, 1))
	was, _ := stepped.State()
	bad := st.Clone()
	last := bad.At(bad.Len() - 1)
	last.Shape = []int64{int64(len(last.Data) / 4), 1} // the same bytes, reshaped
	if err := stepped.Restore(bad, meta); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("misshapen %s: %v, want ErrInvalid", last.Name, err)
	}
	now, _ := stepped.State()
	if stepped.Steps() != 2 || now.Len() != was.Len() {
		t.Fatalf("refused restore: %d steps, %d buffers; want 2 and %d", stepped.Steps(), now.Len(), was.Len())
	}
	for i := range now.Len() {
		if !bytes.Equal(now.At(i).Data, was.At(i).Data) {
			t.Fatalf("refused restore changed %s", now.At(i).Name)
		}
	}
}

func TestStepRejectsLayoutMismatch(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	p := randSD(r, 1)
	o, _ := New(Config{Kind: SGD, LR: 0.1}, p)
	before := p.Clone()
	// Gradients of the same sizes (a is 3×7, not 7×3) and not zero: a
	// step that wrote before it refused would show in the parameters.
	bad := randSD(r, 1)
	bad.Get("a").Shape = []int64{3, 7}
	if err := o.Step(p, bad); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("Step with wrong shape: %v, want ErrInvalid", err)
	}
	for _, n := range []string{"a", "b"} {
		x, _ := p.Get(n).Float32s()
		y, _ := before.Get(n).Float32s()
		if !slices.Equal(x, y) {
			t.Fatalf("failed step changed params %s", n)
		}
	}
	if o.Steps() != 0 {
		t.Fatal("failed step counted")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{},
		{Kind: "lion", LR: 1},
		{Kind: SGD},
		{Kind: SGD, LR: math.NaN()},
		{Kind: SGD, LR: 1, Nesterov: true},
		{Kind: SGD, LR: 1, Momentum: 0.9, Dampening: 0.1, Nesterov: true},
		{Kind: SGD, LR: 1, Beta1: 0.9},
		{Kind: Adam, LR: 1, Beta1: 1},
		{Kind: Adam, LR: 1, Momentum: 0.9},
		{Kind: RMSprop, LR: 1, Alpha: 1.5},
		{Kind: SGD, LR: 1, Schedule: Schedule{Kind: StepDecay}},
		{Kind: SGD, LR: 1, Schedule: Schedule{Kind: Cosine}},
		{Kind: SGD, LR: 1, Schedule: Schedule{Kind: "exp"}},
		{Kind: SGD, LR: 1, Schedule: Schedule{WarmupSteps: 2, WarmupStart: 2}},
		{Kind: Adam, LR: 1, LRDecay: 0.1},
		{Kind: Adagrad, LR: 1, Beta1: 0.9},
		{Kind: Adagrad, LR: 1, InitialAccumulatorValue: -1},
		{Kind: Adamax, LR: 1, MomentumDecay: 0.1},
		{Kind: Adam, LR: 1, DecoupledWeightDecay: true},
		{Kind: NAdam, LR: 1, Beta2: 1},
		{Kind: RAdam, LR: 1, Momentum: 0.9},
	}
	for i, c := range bad {
		if err := c.Validate(); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("case %d %+v: %v, want ErrInvalid", i, c, err)
		}
	}
	good := Config{Kind: AdamW, LR: 1}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if good.Beta1 != 0.9 || good.Beta2 != 0.999 || good.Eps != 1e-8 || good.WeightDecay != 0.01 {
		t.Fatalf("AdamW defaults %+v", good)
	}
}

// TestWarmupTimesCosine: without a floor, warm-up and cosine multiply.
func TestWarmupTimesCosine(t *testing.T) {
	s := Schedule{Kind: Cosine, TMax: 10, WarmupSteps: 4, WarmupStart: 0.2}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for k := int64(0); k < 12; k++ {
		want := (1 + math.Cos(math.Pi*float64(k)/10)) / 2
		if k < 4 {
			want *= 0.2 + 0.8*float64(k)/4
		}
		if got := s.LR(1, k); math.Abs(got-want) > 1e-15 {
			t.Errorf("k=%d: %v, want %v", k, got, want)
		}
	}
}

func ExampleOptimizer_Step() {
	w := tensor.FromFloat32s("w", []int64{2}, []float32{1, 2})
	g := tensor.FromFloat32s("w", []int64{2}, []float32{0.5, -1})
	params, _ := tensor.NewStateDict(w)
	grads, _ := tensor.NewStateDict(g)
	o, _ := New(Config{Kind: SGD, LR: 0.1}, params)
	_ = o.Step(params, grads)
	f, _ := w.Float32s()
	fmt.Println(f)
	// Output: [0.95 2.1]
}

// TestStepToMatchesStep: writing the update elsewhere gives the same bits
// as the in-place step and leaves the source untouched.
func TestStepToMatchesStep(t *testing.T) {
	for _, cfg := range []Config{{Kind: SGD, LR: 0.1}, {Kind: SGD, LR: 0.1, Momentum: 0.9, WeightDecay: 0.1}, {Kind: AdamW, LR: 0.01},
		{Kind: Adam, LR: 0.01, WeightDecay: 0.1}, {Kind: RMSprop, LR: 0.01, Momentum: 0.5, Centered: true, WeightDecay: 0.1}} {
		r := rand.New(rand.NewPCG(9, 9))
		p := randSD(r, 1)
		inPlace, src := p.Clone(), p.Clone()
		o1, _ := New(cfg, p)
		o2, _ := New(cfg, p)
		for range 3 {
			g := randSD(r, 1)
			_ = o1.Step(inPlace, g)
			dst := src.Clone()
			for _, tn := range dst.Tensors() {
				f, _ := tn.Float32s()
				clear(f)
			}
			before := src.Clone()
			if err := o2.StepTo(dst, src, g); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"a", "b"} {
				x, _ := src.Get(n).Float32s()
				y, _ := before.Get(n).Float32s()
				if !slices.Equal(x, y) {
					t.Fatalf("%s: StepTo modified its source", cfg.Kind)
				}
			}
			src = dst
		}
		for _, n := range []string{"a", "b"} {
			x, _ := inPlace.Get(n).Float32s()
			y, _ := src.Get(n).Float32s()
			if !slices.Equal(x, y) {
				t.Fatalf("%s %s: StepTo %v, Step %v", cfg.Kind, n, y, x)
			}
		}
	}
}

// TestPlainSGDStepToOtherBuffer: plain SGD into another buffer (one
// kernels.AddScaledTo pass) gives the same bits as the in-place step, for a
// tensor spanning several unrolled strides with a ragged tail.
func TestPlainSGDStepToOtherBuffer(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	mk := func() *tensor.StateDict {
		tn := tensor.NewF32("w", 3*4096+37)
		f, _ := tn.Float32s()
		for i := range f {
			f[i] = float32(r.NormFloat64())
		}
		sd, _ := tensor.NewStateDict(tn)
		return sd
	}
	p, g := mk(), mk()
	inPlace, dst := p.Clone(), mk()
	o1, _ := New(Config{Kind: SGD, LR: 0.3}, p)
	o2, _ := New(Config{Kind: SGD, LR: 0.3}, p)
	if err := o1.Step(inPlace, g); err != nil {
		t.Fatal(err)
	}
	if err := o2.StepTo(dst, p, g); err != nil {
		t.Fatal(err)
	}
	x, _ := inPlace.Get("w").Float32s()
	y, _ := dst.Get("w").Float32s()
	if !slices.Equal(x, y) {
		t.Fatal("StepTo into another buffer differs from the in-place step")
	}
}

// TestStepToWritesEveryElement: StepTo sets every element of dst, on the
// first step (fresh state) and later ones, for every kind. The reducer
// relies on it: it steps into blobs it does not zero first, so an element
// left unwritten would publish stale memory. dst is poisoned with NaN.
func TestStepToWritesEveryElement(t *testing.T) {
	for _, cfg := range []Config{{Kind: SGD, LR: 0.1}, {Kind: SGD, LR: 0.1, WeightDecay: 0.1},
		{Kind: SGD, LR: 0.1, Momentum: 0.9, Nesterov: true}, {Kind: SGD, LR: 0.1, Momentum: 0.9, Dampening: 0.5},
		{Kind: Adam, LR: 0.01}, {Kind: Adam, LR: 0.01, WeightDecay: 0.1}, {Kind: AdamW, LR: 0.01},
		{Kind: RMSprop, LR: 0.01}, {Kind: RMSprop, LR: 0.01, Momentum: 0.5, Centered: true, WeightDecay: 0.1},
		{Kind: Adagrad, LR: 0.01, WeightDecay: 0.1}, {Kind: Adamax, LR: 0.01}, {Kind: NAdam, LR: 0.01, WeightDecay: 0.1, DecoupledWeightDecay: true},
		{Kind: RAdam, LR: 0.01, Beta2: 0.9}} {
		r := rand.New(rand.NewPCG(5, 5))
		mk := func() *tensor.StateDict {
			sd := &tensor.StateDict{}
			for i, n := range []int64{3*4096 + 37, 8, 1, 0, 45} {
				tn := tensor.NewF32(fmt.Sprintf("t%d", i), n)
				f, _ := tn.Float32s()
				for j := range f {
					f[j] = float32(r.NormFloat64())
				}
				_ = sd.Add(tn)
			}
			return sd
		}
		src := mk()
		o, _ := New(cfg, src)
		for step := range 3 {
			dst := mk()
			for _, tn := range dst.Tensors() {
				f, _ := tn.Float32s()
				for j := range f {
					f[j] = float32(math.NaN())
				}
			}
			if err := o.StepTo(dst, src, mk()); err != nil {
				t.Fatal(err)
			}
			for _, tn := range dst.Tensors() {
				f, _ := tn.Float32s()
				for j, v := range f {
					if v != v {
						t.Fatalf("%+v step %d: %s[%d] left unwritten", cfg, step, tn.Name, j)
					}
				}
			}
			src = dst
		}
	}
}
