package ars

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
)

// Hand-computed: θ = 0, N = 3, b = 2, α = 0.5, δ0 = (1,0), δ1 = (0,1),
// δ2 = (1,1); r+ = (3,1,2), r− = (1,4,0). max(r+, r−) = (3,4,2) keeps
// d1 then d0; rewards used {1,4,3,1}: mean 9/4, σ_R² = 27/16, so
// σ_R = 3√3/4 and α/(bσ_R) = 1/(3√3). Σ (r+−r−)δ = −3·(0,1) + 2·(1,0)
// = (2, −3), so θ' = (2/(3√3), −1/√3).
func TestStepHandComputed(t *testing.T) {
	h := Hyper{Version: V1t, Directions: 3, Top: 2, StepSize: 0.5, Noise: 0.1}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	dirs := [][]float64{{1, 0}, {0, 1}, {1, 1}}
	theta := []float64{0, 0}
	info := Step(theta, &h, []float64{3, 1, 2}, []float64{1, 4, 0}, func(d int, dst []float64) { copy(dst, dirs[d]) })
	if !slices.Equal(info.Selected, []int{1, 0}) {
		t.Fatalf("selected %v, want [1 0]", info.Selected)
	}
	if want := 3 * math.Sqrt(3) / 4; math.Abs(info.SigmaR-want) > 1e-15 {
		t.Fatalf("σ_R = %v, want %v", info.SigmaR, want)
	}
	want := []float64{2 / (3 * math.Sqrt(3)), -1 / math.Sqrt(3)}
	for i := range want {
		if math.Abs(theta[i]-want[i]) > 1e-15 {
			t.Fatalf("θ = %v, want %v", theta, want)
		}
	}
}

// V1/V2 use every direction; equal rewards leave θ unchanged.
func TestStepAllDirectionsAndZeroSpread(t *testing.T) {
	h := Hyper{Version: V1, Directions: 2, StepSize: 1, Noise: 0.1}
	if err := h.Validate(); err != nil || h.Top != 2 {
		t.Fatalf("validate: %v, top %d", err, h.Top)
	}
	dirs := [][]float64{{1}, {2}}
	theta := []float64{0}
	// rewards {2,0,1,1}: mean 1, σ_R = √(2/4); Σ = 2·1 + 0·2 = 2.
	Step(theta, &h, []float64{2, 1}, []float64{0, 1}, func(d int, dst []float64) { copy(dst, dirs[d]) })
	if want := 2 / (2 * math.Sqrt(0.5)); math.Abs(theta[0]-want) > 1e-15 {
		t.Fatalf("θ = %v, want %v", theta[0], want)
	}
	theta = []float64{0.25}
	info := Step(theta, &h, []float64{5, 5}, []float64{5, 5}, func(d int, dst []float64) { copy(dst, dirs[d]) })
	if theta[0] != 0.25 || info.Scale != 0 {
		t.Fatalf("equal rewards moved θ to %v (scale %v)", theta[0], info.Scale)
	}
}

func TestTopBTies(t *testing.T) {
	cases := []struct {
		rp, rm []float64
		b      int
		want   []int
	}{
		{[]float64{1, 2, 2, 0, 2}, []float64{2, 0, 1, 2, 0}, 3, []int{0, 1, 2}},
		{[]float64{5, 7, 1, 5}, []float64{0, 0, 7, 0}, 3, []int{1, 2, 0}},
		{[]float64{5, 7, 1, 5}, []float64{0, 0, 7, 0}, 4, []int{1, 2, 0, 3}},
		{[]float64{-1, -1, -1}, []float64{-2, -3, -1}, 1, []int{0}},
	}
	for _, c := range cases {
		got := TopB(c.rp, c.rm, c.b)
		if !slices.Equal(got, c.want) {
			t.Errorf("TopB(%v, %v, %d) = %v, want %v", c.rp, c.rm, c.b, got, c.want)
		}
	}
}

func TestHyperValidate(t *testing.T) {
	bad := []Hyper{
		{Version: 9, Directions: 2, StepSize: 1, Noise: 1},
		{Version: V2, Directions: 0, StepSize: 1, Noise: 1},
		{Version: V2, Directions: 4, Top: 2, StepSize: 1, Noise: 1}, // V2 uses all
		{Version: V2t, Directions: 4, Top: 5, StepSize: 1, Noise: 1},
		{Version: V2t, Directions: 4, Top: 2, StepSize: 0, Noise: 1},
		{Version: V2t, Directions: 4, Top: 2, StepSize: 1, Noise: math.NaN()},
		{Version: V2t, Directions: 4, Top: 2, StepSize: 1, Noise: 1, Shift: math.Inf(1)},
	}
	for _, h := range bad {
		if err := h.Validate(); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%+v: err %v, want ErrInvalid", h, err)
		}
	}
	for _, s := range []string{"V1", "v2", "V1-t", "v2-T"} {
		if _, err := ParseVersion(s); err != nil {
			t.Errorf("ParseVersion(%q): %v", s, err)
		}
	}
	if _, err := ParseVersion("V3"); err == nil {
		t.Error("ParseVersion(V3) succeeded")
	}
}

// Per-chunk statistics merged in order match one process that saw every
// vector, and both match a two-pass mean and sample variance.
func TestStatsMergeMatchesSingleProcess(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const dim, n = 3, 1000
	xs := make([][]float64, n)
	for i := range xs {
		xs[i] = []float64{rng.NormFloat64()*3 + 10, rng.Float64(), 1e3 + rng.NormFloat64()}
	}
	single := NewStats(dim)
	for _, x := range xs {
		single.Push(x)
	}
	merged := NewStats(dim)
	for lo := 0; lo < n; {
		hi := min(n, lo+1+rng.IntN(150))
		part := NewStats(dim)
		for _, x := range xs[lo:hi] {
			part.Push(x)
		}
		if err := merged.Merge(part); err != nil {
			t.Fatal(err)
		}
		lo = hi
	}
	if err := merged.Merge(NewStats(dim)); err != nil { // empty merge is a no-op
		t.Fatal(err)
	}
	for i := 0; i < dim; i++ {
		var s float64
		for _, x := range xs {
			s += x[i]
		}
		mean := s / n
		var ss float64
		for _, x := range xs {
			ss += (x[i] - mean) * (x[i] - mean)
		}
		for name, st := range map[string]*Stats{"single": single, "merged": merged} {
			if st.Count != n || math.Abs(st.Mean[i]-mean) > 1e-12*math.Abs(mean)+1e-12 || math.Abs(st.M2[i]-ss) > 1e-9*ss {
				t.Errorf("%s component %d: n %v mean %v M2 %v, want %d %v %v", name, i, st.Count, st.Mean[i], st.M2[i], n, mean, ss)
			}
		}
	}
	f := merged.Freeze()
	if want := 1 / math.Sqrt(merged.M2[0]/(n-1)); f.InvStd[0] != want {
		t.Errorf("InvStd %v, want %v", f.InvStd[0], want)
	}
}

func TestStatsRejectBadInput(t *testing.T) {
	s := NewStats(2)
	s.Push([]float64{1, 2})
	before := s.Clone()
	for _, o := range []*Stats{
		{Count: 1, Mean: []float64{1}, M2: []float64{0}},
		{Count: -1, Mean: []float64{0, 0}, M2: []float64{0, 0}},
		{Count: 1.5, Mean: []float64{0, 0}, M2: []float64{0, 0}},
		{Count: 2, Mean: []float64{math.NaN(), 0}, M2: []float64{0, 0}},
		{Count: 2, Mean: []float64{0, 0}, M2: []float64{-1, 0}},
		{Count: 0, Mean: []float64{1, 0}, M2: []float64{0, 0}},
	} {
		if err := s.Merge(o); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("Merge(%+v): %v, want ErrInvalid", o, err)
		}
	}
	if s.Count != before.Count || !slices.Equal(s.Mean, before.Mean) || !slices.Equal(s.M2, before.M2) {
		t.Fatal("a rejected merge changed the statistics")
	}
}

func TestFreezeIdentityAndConstantComponents(t *testing.T) {
	s := NewStats(2)
	s.Push([]float64{4, 1})
	if f := s.Freeze(); f.Mean[0] != 0 || f.InvStd[0] != 1 {
		t.Fatalf("one sample: filter %+v, want identity", f)
	}
	s.Push([]float64{6, 1})
	f := s.Freeze()
	dst := make([]float64, 2)
	f.Apply(dst, []float64{7, 3})
	// mean 5, sample std √2; constant component → 0.
	if math.Abs(dst[0]-2/math.Sqrt2) > 1e-15 || dst[1] != 0 {
		t.Fatalf("Apply = %v", dst)
	}
}

// The authors' filter treats a component whose std is below 1e-7 as
// constant (modestyachts/ARS filter.py sets it to +∞); rlhub must drop the
// same components, not amplify them by up to 10⁸.
func TestFreezeDropsComponentsBelowTheAuthorsMinStd(t *testing.T) {
	s := NewStats(3)
	s.Push([]float64{0, 0, 0})
	s.Push([]float64{1e-7, 2e-7, 1e-9}) // sample std |a−b|/√2: 7.1e-8, 1.4e-7, 7.1e-10
	f := s.Freeze()
	for i, want := range []float64{0, math.Sqrt2 / 2e-7, 0} {
		if math.Abs(f.InvStd[i]-want) > 1e-9*want {
			t.Errorf("component %d: InvStd = %g, want %g", i, f.InvStd[i], want)
		}
	}
	if MinStd != 1e-7 {
		t.Errorf("MinStd = %g, want the authors' 1e-7", MinStd)
	}
}

func cartpoleConfig(t *testing.T, seed uint64) Config {
	t.Helper()
	e, err := env.Make("CartPole-v1")
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Env: "CartPole-v1", Spec: e.Spec(), Seed: seed,
		Hyper:     Hyper{Version: V2t, Directions: 4, Top: 2, StepSize: 0.02, Noise: 0.05},
		EvalEvery: 2, EvalEpisodes: 3, MaxIterations: 5,
	}
}

func TestRunLocalDeterministic(t *testing.T) {
	run := func() (*Trainer, []Report) {
		e, _ := env.Make("CartPole-v1")
		var reps []Report
		tr, err := RunLocal(cartpoleConfig(t, 3), e, func(r Report) { reps = append(reps, r) })
		if err != nil {
			t.Fatal(err)
		}
		return tr, reps
	}
	a, ra := run()
	b, rb := run()
	if !slices.Equal(a.Theta(), b.Theta()) || !slices.Equal(a.Stats().Mean, b.Stats().Mean) {
		t.Fatal("two runs with one seed differ")
	}
	for i := range ra {
		if ra[i].EvalMean != rb[i].EvalMean || ra[i].Update.SigmaR != rb[i].Update.SigmaR || ra[i].Steps != rb[i].Steps {
			t.Fatalf("report %d differs: %+v vs %+v", i, ra[i], rb[i])
		}
	}
	// 5 training iterations (evaluating at 0, 2, 4) and a final
	// evaluation-only iteration.
	last := ra[len(ra)-1]
	if len(ra) != 6 || !last.Done || last.Reason != "budget" || !last.HasEval || last.Episodes != 5*2*4 || last.EvalEpisodes != 4*3 {
		t.Fatalf("reports %d, last %+v", len(ra), last)
	}
	if slices.Equal(a.Theta(), make([]float64, len(a.Theta()))) {
		t.Fatal("θ never moved")
	}
	// Statistics cover every training state: count = training steps.
	var trainSteps int64
	for _, r := range ra {
		trainSteps += r.IterSteps
	}
	if a.Stats().Count <= 0 || a.Stats().Count >= float64(trainSteps) {
		t.Fatalf("stats count %v of %d steps (eval steps must not count)", a.Stats().Count, trainSteps)
	}
}

func TestTargetStopsWithoutUpdate(t *testing.T) {
	cfg := cartpoleConfig(t, 1)
	cfg.UseTarget, cfg.Target = true, -1 // any evaluation reaches it
	e, _ := env.Make("CartPole-v1")
	tr, err := RunLocal(cfg, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := tr.Last(); !r.Done || r.Reason != "target" || r.Iteration != 0 || r.Updated {
		t.Fatalf("report %+v", r)
	}
	if !slices.Equal(tr.Theta(), make([]float64, len(tr.Theta()))) {
		t.Fatal("θ moved though θ_0 reached the target")
	}
}

func TestFinishRejectsBadResultsUnchanged(t *testing.T) {
	tr, err := NewTrainer(cartpoleConfig(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Make("CartPole-v1")
	arch := tr.Arch()
	ev := NewEvaluator(e, &arch)
	good := make([]Result, 0)
	for _, task := range tr.Tasks() {
		good = append(good, ev.Run(tr.Current(), task))
	}
	mutate := []func([]Result) []Result{
		func(r []Result) []Result { return r[1:] },
		func(r []Result) []Result { r[0].RPlus = math.NaN(); return r },
		func(r []Result) []Result { r[1].Index = 0; return r },
		func(r []Result) []Result { r[0].Stats = NewStats(3); return r },
		func(r []Result) []Result { r[0].Steps++; return r },
		func(r []Result) []Result { r[len(r)-1].Steps = 0; return r },
	}
	for i, m := range mutate {
		rs := m(slices.Clone(good))
		if _, err := tr.Finish(rs); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("mutation %d: %v, want ErrInvalid", i, err)
		}
		if tr.Iter() != 0 || tr.Stats().Count != 0 {
			t.Fatalf("mutation %d changed the trainer", i)
		}
	}
	if _, err := tr.Finish(good); err != nil || tr.Iter() != 1 {
		t.Fatalf("good results: %v, iteration %d", err, tr.Iter())
	}
	// The refused results left no trace: the policy is the one a trainer
	// given only the good results makes (θ and the filter's statistics).
	clean, err := NewTrainer(cartpoleConfig(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clean.Finish(good); err != nil {
		t.Fatal(err)
	}
	got, err1 := tr.PolicyOf().Encode()
	want, err2 := clean.PolicyOf().Encode()
	if err1 != nil || err2 != nil || !bytes.Equal(got, want) {
		t.Fatalf("after refused results the policy differs from one trained on the good results alone (%v, %v)", err1, err2)
	}
}

func TestPolicyRoundTripAndValidation(t *testing.T) {
	for _, hidden := range [][]int{nil, {5, 3}} {
		cfg := cartpoleConfig(t, 4)
		cfg.Hidden = hidden
		e, _ := env.Make("CartPole-v1")
		tr, err := RunLocal(cfg, e, nil)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := tr.PolicyOf().Encode()
		if err != nil {
			t.Fatal(err)
		}
		p, err := DecodePolicy(blob)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Theta, tr.Theta()) || !slices.Equal(p.Stats.M2, tr.Stats().M2) || p.Stats.Count != tr.Stats().Count ||
			p.Version != V2t || p.Iteration != tr.Iter() || p.Hyper != tr.Config().Hyper || !slices.Equal(p.Arch.Hidden, hidden) {
			t.Fatalf("hidden %v: round trip differs: %+v", hidden, p)
		}
		// Same actions as the trainer's policy.
		fw1, fw2 := NewForward(&p.Arch), NewForward(&p.Arch)
		obs := []float64{0.1, -0.2, 0.03, 0.5}
		if a, b := fw1.Act(p.Theta, p.Filter(), obs)[0], fw2.Act(tr.Theta(), tr.Current().Filter, obs)[0]; a != b {
			t.Fatalf("actions %v vs %v", a, b)
		}
		// Truncations and corrupted bytes are rejected, never a panic.
		for _, n := range []int{0, 8, len(blob) / 2, len(blob) - 1} {
			if _, err := DecodePolicy(blob[:n]); !errors.Is(err, errs.ErrInvalid) {
				t.Errorf("truncated to %d: %v", n, err)
			}
		}
	}
}

func FuzzDecodePolicy(f *testing.F) {
	cfg := Config{Env: "x", Spec: env.Spec{ObsDim: 2, ActDim: 1}, Hyper: Hyper{Version: V2, Directions: 2, StepSize: 1, Noise: 1}, MaxIterations: 1}
	tr, err := NewTrainer(cfg)
	if err != nil {
		f.Fatal(err)
	}
	blob, _ := tr.PolicyOf().Encode()
	f.Add(blob)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePolicy(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if len(p.Theta) != p.Arch.NumParams() {
			t.Fatalf("θ has %d parameters, arch %d", len(p.Theta), p.Arch.NumParams())
		}
	})
}
