// Package optim holds rlhub's server-side optimizers and learning-rate
// schedules: pure, synchronous code that updates float32 parameters in place
// from a gradient, matching PyTorch's torch.optim (single-tensor, CPU
// implementation) to float32 tolerance.
//
// To use it:
//  1. Fill a Config (Kind plus that kind's hyper-parameters; zero fields take
//     PyTorch's defaults) and call New with the model's parameters.
//  2. Call Step(params, grads) once per reduced gradient. The learning rate
//     for step k (0-based) is Schedule.LR(k), as with PyTorch's pattern
//     `opt.step(); sched.step()`.
//  3. To checkpoint, State() returns the optimizer state as a state dict plus
//     string metadata (safetensors-ready); Restore loads it into a fresh
//     Optimizer built with the same Config and parameter layout.
//
// Only F32 parameters are supported. An Optimizer is not safe for concurrent
// use: the reducer's primary owns it from one goroutine.
//
// The committed test vectors in testdata/ come from
// scripts/gen_optim_vectors.py (real torch.optim); the tests replay them.
package optim

import (
	"fmt"
	"math"
	"strconv"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Kind names an optimizer algorithm.
type Kind string

// The supported optimizers.
const (
	SGD     Kind = "sgd"
	Adam    Kind = "adam"
	AdamW   Kind = "adamw"
	RMSprop Kind = "rmsprop"
	Adagrad Kind = "adagrad"
	Adamax  Kind = "adamax"
	NAdam   Kind = "nadam"
	RAdam   Kind = "radam"
)

// Config configures an optimizer. Fields that do not apply to Kind must be
// zero. A zero field means PyTorch's default for that Kind (noted per field);
// PyTorch's defaults for the fields below that default to zero are zero.
type Config struct {
	// Kind selects the algorithm; required.
	Kind Kind `json:"kind"`
	// LR is the base learning rate; required, > 0.
	LR float64 `json:"lr"`
	// WeightDecay is the L2 penalty (SGD, Adam, RMSprop: added to the
	// gradient) or the decoupled decay (AdamW: 0 means PyTorch's 0.01).
	WeightDecay float64 `json:"weight_decay,omitempty"`
	// Momentum (SGD, RMSprop); 0 means none.
	Momentum float64 `json:"momentum,omitempty"`
	// Dampening (SGD); 0 means none.
	Dampening float64 `json:"dampening,omitempty"`
	// Nesterov momentum (SGD); needs Momentum > 0 and Dampening = 0.
	Nesterov bool `json:"nesterov,omitempty"`
	// Beta1, Beta2 (Adam, AdamW, Adamax, NAdam, RAdam); 0 means 0.9 and
	// 0.999.
	Beta1 float64 `json:"beta1,omitempty"`
	Beta2 float64 `json:"beta2,omitempty"`
	// Eps (every kind but SGD); 0 means 1e-8 (Adagrad: 1e-10).
	Eps float64 `json:"eps,omitempty"`
	// LRDecay (Adagrad): the rate at step t is lr / (1 + (t−1)·lr_decay).
	LRDecay float64 `json:"lr_decay,omitempty"`
	// InitialAccumulatorValue (Adagrad): the sum of squares starts here.
	InitialAccumulatorValue float64 `json:"initial_accumulator_value,omitempty"`
	// MomentumDecay (NAdam); 0 means 0.004.
	MomentumDecay float64 `json:"momentum_decay,omitempty"`
	// DecoupledWeightDecay (NAdam, RAdam): decay the weights as AdamW does
	// instead of adding the L2 term to the gradient.
	DecoupledWeightDecay bool `json:"decoupled_weight_decay,omitempty"`
	// Alpha, the square-average decay (RMSprop); 0 means 0.99.
	Alpha float64 `json:"alpha,omitempty"`
	// Centered RMSprop (normalise by the estimated variance).
	Centered bool `json:"centered,omitempty"`
	// Schedule of the learning rate; the zero value is constant.
	Schedule Schedule `json:"schedule,omitzero"`
}

// Validate fills defaults and rejects nonsense, wrapping errs.ErrInvalid.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: optimizer %s: %s", errs.ErrInvalid, c.Kind, fmt.Sprintf(format, args...))
	}
	finite := func(name string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return bad("%s is %v", name, v)
		}
		if math.Abs(v) > math.MaxFloat32 {
			// The steps run in float32, where it would be ±Inf.
			return bad("%s %v is beyond float32's range", name, v)
		}
		return nil
	}
	for name, v := range map[string]float64{"lr": c.LR, "weight_decay": c.WeightDecay, "momentum": c.Momentum,
		"dampening": c.Dampening, "beta1": c.Beta1, "beta2": c.Beta2, "eps": c.Eps, "alpha": c.Alpha,
		"lr_decay": c.LRDecay, "initial_accumulator_value": c.InitialAccumulatorValue, "momentum_decay": c.MomentumDecay} {
		if err := finite(name, v); err != nil {
			return err
		}
	}
	if c.LR <= 0 {
		return bad("lr %v must be > 0", c.LR)
	}
	if c.WeightDecay < 0 || c.Momentum < 0 || c.Dampening < 0 || c.Eps < 0 ||
		c.LRDecay < 0 || c.InitialAccumulatorValue < 0 || c.MomentumDecay < 0 {
		return bad("weight_decay, momentum, dampening, eps, lr_decay, initial_accumulator_value and momentum_decay must be ≥ 0")
	}
	notFor := func(fields ...struct {
		name string
		set  bool
	}) error {
		for _, f := range fields {
			if f.set {
				return bad("%s does not apply", f.name)
			}
		}
		return nil
	}
	type f = struct {
		name string
		set  bool
	}
	// The fields only the newer kinds take.
	if c.Kind != Adagrad {
		if err := notFor(f{"lr_decay", c.LRDecay != 0}, f{"initial_accumulator_value", c.InitialAccumulatorValue != 0}); err != nil {
			return err
		}
	}
	if c.Kind != NAdam {
		if err := notFor(f{"momentum_decay", c.MomentumDecay != 0}); err != nil {
			return err
		}
	}
	if c.Kind != NAdam && c.Kind != RAdam {
		if err := notFor(f{"decoupled_weight_decay", c.DecoupledWeightDecay}); err != nil {
			return err
		}
	}
	switch c.Kind {
	case SGD:
		if err := notFor(f{"beta1", c.Beta1 != 0}, f{"beta2", c.Beta2 != 0}, f{"eps", c.Eps != 0}, f{"alpha", c.Alpha != 0}, f{"centered", c.Centered}); err != nil {
			return err
		}
		if c.Nesterov && (c.Momentum <= 0 || c.Dampening != 0) {
			return bad("nesterov needs momentum > 0 and dampening 0")
		}
		if c.Dampening > 1 {
			return bad("dampening %v must be ≤ 1", c.Dampening)
		}
	case Adam, AdamW:
		if err := notFor(f{"momentum", c.Momentum != 0}, f{"dampening", c.Dampening != 0}, f{"nesterov", c.Nesterov}, f{"alpha", c.Alpha != 0}, f{"centered", c.Centered}); err != nil {
			return err
		}
		if c.Beta1 == 0 {
			c.Beta1 = 0.9
		}
		if c.Beta2 == 0 {
			c.Beta2 = 0.999
		}
		if c.Eps == 0 {
			c.Eps = 1e-8
		}
		if c.Kind == AdamW && c.WeightDecay == 0 {
			c.WeightDecay = 0.01
		}
		if c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1 {
			return bad("betas (%v, %v) must be in [0, 1)", c.Beta1, c.Beta2)
		}
	case RMSprop:
		if err := notFor(f{"beta1", c.Beta1 != 0}, f{"beta2", c.Beta2 != 0}, f{"dampening", c.Dampening != 0}, f{"nesterov", c.Nesterov}); err != nil {
			return err
		}
		if c.Alpha == 0 {
			c.Alpha = 0.99
		}
		if c.Eps == 0 {
			c.Eps = 1e-8
		}
		if c.Alpha < 0 || c.Alpha >= 1 {
			return bad("alpha %v must be in [0, 1)", c.Alpha)
		}
	case Adagrad:
		if err := notFor(f{"momentum", c.Momentum != 0}, f{"dampening", c.Dampening != 0}, f{"nesterov", c.Nesterov},
			f{"beta1", c.Beta1 != 0}, f{"beta2", c.Beta2 != 0}, f{"alpha", c.Alpha != 0}, f{"centered", c.Centered}); err != nil {
			return err
		}
		if c.Eps == 0 {
			c.Eps = 1e-10
		}
	case Adamax, NAdam, RAdam:
		if err := notFor(f{"momentum", c.Momentum != 0}, f{"dampening", c.Dampening != 0}, f{"nesterov", c.Nesterov}, f{"alpha", c.Alpha != 0}, f{"centered", c.Centered}); err != nil {
			return err
		}
		if c.Beta1 == 0 {
			c.Beta1 = 0.9
		}
		if c.Beta2 == 0 {
			c.Beta2 = 0.999
		}
		if c.Eps == 0 {
			c.Eps = 1e-8
		}
		if c.Kind == NAdam && c.MomentumDecay == 0 {
			c.MomentumDecay = 4e-3
		}
		if c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1 {
			return bad("betas (%v, %v) must be in [0, 1)", c.Beta1, c.Beta2)
		}
	default:
		return fmt.Errorf("%w: unknown optimizer %q (want sgd, adam, adamw, rmsprop, adagrad, adamax, nadam or radam)", errs.ErrInvalid, truncate(string(c.Kind)))
	}
	if c.Eps != 0 && float32(c.Eps) == 0 {
		// A zero eps divides a parameter's zero gradient by a zero
		// denominator: NaN weights.
		return bad("eps %v rounds to 0 in float32, the precision of the step", c.Eps)
	}
	return c.Schedule.Validate()
}

// slot names of the per-parameter state, as PyTorch names them.
const (
	slotMomentum  = "momentum_buffer"
	slotExpAvg    = "exp_avg"
	slotExpAvgSq  = "exp_avg_sq"
	slotSquareAvg = "square_avg"
	slotGradAvg   = "grad_avg"
	slotSum       = "sum"
	slotExpInf    = "exp_inf"
)

// slots lists the state buffers a Config keeps per parameter.
func (c *Config) slots() []string {
	switch c.Kind {
	case SGD:
		if c.Momentum != 0 {
			return []string{slotMomentum}
		}
	case Adam, AdamW:
		return []string{slotExpAvg, slotExpAvgSq}
	case Adagrad:
		return []string{slotSum}
	case Adamax:
		return []string{slotExpAvg, slotExpInf}
	case NAdam:
		return []string{slotExpAvg, slotExpAvgSq}
	case RAdam:
		return []string{slotExpAvg, slotExpAvgSq}
	case RMSprop:
		s := []string{slotSquareAvg}
		if c.Momentum > 0 {
			s = append(s, slotMomentum)
		}
		if c.Centered {
			s = append(s, slotGradAvg)
		}
		return s
	}
	return nil
}

// Optimizer updates one model's parameters. Not safe for concurrent use.
type Optimizer struct {
	cfg    Config
	layout *tensor.StateDict // names, shapes, dtypes (data not used)
	steps  int64             // completed steps
	// state[slot][i] is the buffer of parameter i (layout order); a
	// buffer is nil until its first step, as in PyTorch (SGD's momentum
	// buffer starts as a copy of the first gradient).
	state map[string][][]float32
	// sched follows the learning-rate schedule; see Optimizer.LR.
	sched schedCursor
	// muProd is NAdam's mu_product after muStep steps (0: not computed).
	muProd float32
	muStep int64
}

// New builds an optimizer for parameters with params' layout (names, shapes;
// every tensor F32). It keeps no reference to params' data.
func New(cfg Config, params *tensor.StateDict) (*Optimizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layout := &tensor.StateDict{}
	for _, t := range params.Tensors() {
		if t.DType != tensor.F32 {
			return nil, fmt.Errorf("%w: optimizer: parameter %q is %v, only F32 is supported", errs.ErrInvalid, t.Name, t.DType)
		}
		if err := layout.Add(&tensor.Tensor{Name: t.Name, DType: t.DType, Shape: append([]int64(nil), t.Shape...), Data: t.Data[:len(t.Data):len(t.Data)]}); err != nil {
			return nil, fmt.Errorf("%w: optimizer: %v", errs.ErrInvalid, err)
		}
	}
	o := &Optimizer{cfg: cfg, layout: layout, state: map[string][][]float32{}}
	for _, s := range cfg.slots() {
		o.state[s] = make([][]float32, layout.Len())
	}
	return o, nil
}

// Config returns the validated configuration (defaults filled).
func (o *Optimizer) Config() Config { return o.cfg }

// Steps returns the number of completed steps.
func (o *Optimizer) Steps() int64 { return o.steps }

// NonFinite names the first optimizer state buffer holding a NaN or ±Inf
// ("slot/tensor[i]"), or "" when all are finite: a finite gradient can
// still overflow a step (Adam's second moment for |g| near 1e20).
func (o *Optimizer) NonFinite() string {
	for _, slot := range o.cfg.slots() {
		for i, b := range o.state[slot] {
			if j := kernels.FirstNonFinite(b); j >= 0 {
				return fmt.Sprintf("%s/%s[%d]", slot, o.layout.Tensors()[i].Name, j)
			}
		}
	}
	return ""
}

// LR returns the learning rate the next step will use: Schedule.LR of the
// step count, followed step by step (a restore replays it once).
func (o *Optimizer) LR() float64 {
	s := &o.cfg.Schedule
	if !o.sched.valid || o.sched.k > o.steps {
		o.sched = s.begin(o.cfg.LR)
	}
	s.follow(o.cfg.LR, &o.sched, o.steps)
	return o.sched.lr
}

// maxReplay bounds the computation a restored step count costs the first
// step: the scheduler steps that change the rate (Schedule.replays), and
// for NAdam the step count itself (its momentum product). 2^28 of the
// costliest (cosine) take about 7 s.
const maxReplay = 1 << 28

// Step applies one update to params in place from grads. Both must have the
// optimizer's layout (checked; errs.ErrInvalid and nothing changes when they
// do not). The caller has already checked grads for NaN/Inf.
func (o *Optimizer) Step(params, grads *tensor.StateDict) error {
	return o.StepTo(params, params, grads)
}

// StepTo is Step writing the updated parameters into dst and only reading
// params (dst may be params). It lets the reducer write a new version
// straight into the buffer it publishes. Every tensor of dst must either be
// params' tensor or not overlap it. A successful StepTo writes every element
// of dst (the reducer steps into buffers it has not zeroed; a test pins
// this); on error dst is untouched.
func (o *Optimizer) StepTo(dst, params, grads *tensor.StateDict) error {
	if err := dst.CheckLayout(o.layout); err != nil {
		return fmt.Errorf("%w: optimizer destination: %v", errs.ErrInvalid, err)
	}
	if err := params.CheckLayout(o.layout); err != nil {
		return fmt.Errorf("%w: optimizer params: %v", errs.ErrInvalid, err)
	}
	if err := grads.CheckLayout(o.layout); err != nil {
		return fmt.Errorf("%w: optimizer grads: %v", errs.ErrInvalid, err)
	}
	// Take every view first: nothing is modified unless all tensors can
	// be updated.
	ps := make([][]float32, o.layout.Len())
	gs := make([][]float32, o.layout.Len())
	ds := make([][]float32, o.layout.Len())
	for i, lt := range o.layout.Tensors() {
		var err error
		if ds[i], err = dst.Get(lt.Name).Float32s(); err != nil {
			return fmt.Errorf("%w: optimizer destination: %v", errs.ErrInvalid, err)
		}
		if ps[i], err = params.Get(lt.Name).Float32s(); err != nil {
			return fmt.Errorf("%w: optimizer params: %v", errs.ErrInvalid, err)
		}
		if gs[i], err = grads.Get(lt.Name).Float32s(); err != nil {
			return fmt.Errorf("%w: optimizer grads: %v", errs.ErrInvalid, err)
		}
	}
	lr := o.LR()
	step := o.steps + 1
	for i := range ps {
		switch o.cfg.Kind {
		case SGD:
			o.sgd(i, ds[i], ps[i], gs[i], lr)
		case Adam, AdamW:
			o.adam(i, ds[i], ps[i], gs[i], lr, step)
		case RMSprop:
			o.rmsprop(i, ds[i], ps[i], gs[i], lr)
		case Adagrad:
			o.adagrad(i, ds[i], ps[i], gs[i], lr, step)
		case Adamax:
			o.adamax(i, ds[i], ps[i], gs[i], lr, step)
		case NAdam:
			o.nadam(i, ds[i], ps[i], gs[i], lr, step)
		case RAdam:
			o.radam(i, ds[i], ps[i], gs[i], lr, step)
		}
	}
	o.steps = step
	return nil
}

// buf returns parameter i's buffer for slot, allocating zeros on first use.
// fresh reports whether it was just allocated.
func (o *Optimizer) buf(slot string, i, n int) (b []float32, fresh bool) {
	b = o.state[slot][i]
	if b == nil {
		b = make([]float32, n)
		o.state[slot][i] = b
		return b, true
	}
	return b, false
}

// sgd is torch.optim.SGD's _single_tensor_sgd.
func (o *Optimizer) sgd(i int, dst, p, g []float32, lr float64) {
	dst, g = dst[:len(p)], g[:len(p)]
	wd, mom, damp := float32(o.cfg.WeightDecay), float32(o.cfg.Momentum), float32(1-o.cfg.Dampening)
	nlr := float32(-lr)
	if mom == 0 && wd == 0 {
		// dst = p − lr·g with the SIMD axpy (it may fuse the multiply-add,
		// as PyTorch's vectorized add_ may), into dst in one pass.
		kernels.AddScaledTo(dst, p, nlr, g)
		return
	}
	h := sgdHyper{wd: wd, mom: mom, damp: damp, nlr: nlr, hasWD: wd != 0, momentum: mom != 0, nesterov: o.cfg.Nesterov}
	var b []float32
	if h.momentum {
		b, h.fresh = o.buf(slotMomentum, i, len(p))
	}
	activeLoops.sgd(dst, p, g, b, &h)
}

// adam is torch.optim.Adam's / AdamW's _single_tensor_adam (amsgrad off).
func (o *Optimizer) adam(i int, dst, p, g []float32, lr float64, step int64) {
	c := &o.cfg
	m, _ := o.buf(slotExpAvg, i, len(p))
	v, _ := o.buf(slotExpAvgSq, i, len(p))
	bc1 := 1 - math.Pow(c.Beta1, float64(step))
	bc2 := 1 - math.Pow(c.Beta2, float64(step))
	h := adamHyper{
		b1w:       float32(1 - c.Beta1),
		b2:        float32(c.Beta2),
		b2c:       float32(1 - c.Beta2),
		nstep:     -float32(lr / bc1),
		bc2Sqrt:   float32(math.Sqrt(bc2)),
		eps:       float32(c.Eps),
		wd:        float32(c.WeightDecay),
		decay:     float32(1 - lr*c.WeightDecay),
		decoupled: c.Kind == AdamW,
	}
	h.b1w1, h.hasWD, h.lerpLo = 1-h.b1w, h.wd != 0, h.b1w < 0.5
	activeLoops.adam(dst, p, g, m, v, &h)
}

// rmsprop is torch.optim.RMSprop's _single_tensor_rmsprop.
func (o *Optimizer) rmsprop(i int, dst, p, g []float32, lr float64) {
	c := &o.cfg
	sq, _ := o.buf(slotSquareAvg, i, len(p))
	h := rmspropHyper{
		alpha: float32(c.Alpha), alphac: float32(1 - c.Alpha),
		wd: float32(c.WeightDecay), eps: float32(c.Eps), mom: float32(c.Momentum),
		nlr: float32(-lr), centered: c.Centered, momentum: c.Momentum > 0,
	}
	h.alphac1, h.hasWD, h.lerpLo = 1-h.alphac, h.wd != 0, h.alphac < 0.5
	var ga, mb []float32
	if h.centered {
		ga, _ = o.buf(slotGradAvg, i, len(p))
	}
	if h.momentum {
		mb, _ = o.buf(slotMomentum, i, len(p))
	}
	activeLoops.rmsprop(dst, p, g, sq, ga, mb, &h)
}

// State returns the optimizer's state as a state dict of F32 tensors named
// "<slot>/<param>" (a buffer not yet created is omitted) and metadata holding
// the step count and kind. The tensors are copies the caller owns.
func (o *Optimizer) State() (*tensor.StateDict, map[string]string) {
	sd := &tensor.StateDict{}
	for _, slot := range o.cfg.slots() {
		for i, b := range o.state[slot] {
			if b == nil {
				continue
			}
			lt := o.layout.At(i)
			t := tensor.NewF32(slot+"/"+lt.Name, lt.Shape...)
			f, _ := t.Float32s()
			copy(f, b)
			if err := sd.Add(t); err != nil {
				panic(err) // names are unique by construction
			}
		}
	}
	meta := map[string]string{
		"optim.kind":  string(o.cfg.Kind),
		"optim.steps": strconv.FormatInt(o.steps, 10),
	}
	return sd, meta
}

// Restore replaces the optimizer's state with one State returned (possibly
// after a safetensors round trip). It checks kind, names and shapes and
// fails with errs.ErrInvalid, changing nothing, on any mismatch, on a NaN
// or ±Inf element, and on a step count whose learning rate (or NAdam's
// momentum product) would take more than 2^28 scheduler steps to replay:
// an absurd count from a damaged state file would otherwise stall the
// first step.
func (o *Optimizer) Restore(sd *tensor.StateDict, meta map[string]string) error {
	if k := meta["optim.kind"]; k != string(o.cfg.Kind) {
		return fmt.Errorf("%w: optimizer state is for %q, optimizer is %q", errs.ErrInvalid, truncate(k), o.cfg.Kind)
	}
	steps, err := strconv.ParseInt(meta["optim.steps"], 10, 64)
	if err != nil || steps < 0 {
		return fmt.Errorf("%w: optimizer state: bad step count %q", errs.ErrInvalid, truncate(meta["optim.steps"]))
	}
	if replay := o.cfg.Schedule.replays(steps); replay > maxReplay || (o.cfg.Kind == NAdam && steps > maxReplay) {
		return fmt.Errorf("%w: optimizer state: step count %d is beyond what the learning-rate schedule (or NAdam's momentum) can be replayed to (%d steps)", errs.ErrInvalid, steps, int64(maxReplay))
	}
	state := map[string][][]float32{}
	seen := 0
	for _, slot := range o.cfg.slots() {
		state[slot] = make([][]float32, o.layout.Len())
		for i, lt := range o.layout.Tensors() {
			t := sd.Get(slot + "/" + lt.Name)
			if t == nil {
				continue
			}
			seen++
			if !t.SameLayout(lt) {
				return fmt.Errorf("%w: optimizer state %q is %v%v, parameter is %v%v", errs.ErrInvalid, t.Name, t.DType, t.Shape, lt.DType, lt.Shape)
			}
			f, err := t.Float32s()
			if err != nil {
				return fmt.Errorf("%w: optimizer state %q: %v", errs.ErrInvalid, t.Name, err)
			}
			// A step that leaves a buffer non-finite is never kept
			// (NonFinite), so a state holding one is damaged or
			// hand-made: restored, it would fail every later step.
			if j := kernels.FirstNonFinite(f); j >= 0 {
				return fmt.Errorf("%w: optimizer state %s[%d] is %v", errs.ErrInvalid, t.Name, j, f[j])
			}
			state[slot][i] = append([]float32(nil), f...)
		}
	}
	if seen != sd.Len() {
		return fmt.Errorf("%w: optimizer state has %d tensors, %d match this optimizer", errs.ErrInvalid, sd.Len(), seen)
	}
	if steps > 0 && seen == 0 && len(o.cfg.slots()) > 0 {
		return fmt.Errorf("%w: optimizer state at step %d holds no buffers", errs.ErrInvalid, steps)
	}
	o.state, o.steps = state, steps
	return nil
}
