package env

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

func TestMakeKnowsEveryName(t *testing.T) {
	names := Names()
	if !slices.IsSorted(names) || len(names) == 0 {
		t.Fatalf("Names() = %v, want a sorted non-empty list", names)
	}
	want := []string{"Acrobot-v1", "CartPole-v1", "LQR", "MountainCarContinuous-v0", "Pendulum-v1"}
	if got := builtinNames(); !slices.Equal(got, want) {
		t.Fatalf("built-in names %v, want %v", got, want)
	}
	for _, n := range want {
		if !slices.Contains(names, n) {
			t.Errorf("Names() = %v lacks %q", names, n)
		}
		e, err := Make(n)
		if err != nil {
			t.Fatalf("Make(%q): %v", n, err)
		}
		if got := e.Spec().Name; got != n {
			t.Errorf("Make(%q).Spec().Name = %q", n, got)
		}
		if _, ok := e.(StateSetter); !ok {
			t.Errorf("%s does not implement StateSetter", n)
		}
	}
}

func TestMakeUnknownListsNames(t *testing.T) {
	_, err := Make("CartPole-v0")
	if err == nil {
		t.Fatal("Make(CartPole-v0) succeeded, want error")
	}
	for _, n := range builtinNames() {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %q", err, n)
		}
	}
	if !strings.Contains(err.Error(), `"CartPole-v0"`) {
		t.Errorf("error %q does not quote the bad name", err)
	}
}

// TestSpecsAndBasics checks every environment's spec shape, that Reset and
// Step return observations of ObsDim values, and that Step allocates nothing.
func TestSpecsAndBasics(t *testing.T) {
	for _, n := range builtinNames() {
		t.Run(n, func(t *testing.T) {
			e, _ := Make(n)
			sp := e.Spec()
			if sp.MaxEpisodeSteps <= 0 || sp.ObsDim <= 0 {
				t.Fatalf("spec %+v: want positive MaxEpisodeSteps and ObsDim", sp)
			}
			if (sp.Discrete > 0) == (sp.ActDim > 0) {
				t.Fatalf("spec %+v: exactly one of Discrete, ActDim must be positive", sp)
			}
			if len(sp.ActLow) != sp.ActDim || len(sp.ActHigh) != sp.ActDim {
				t.Fatalf("spec %+v: bounds must have ActDim values", sp)
			}
			rng := newRNG(1)
			obs := e.Reset(rng)
			if len(obs) != sp.ObsDim {
				t.Fatalf("Reset returned %d values, want %d", len(obs), sp.ObsDim)
			}
			act := zeroAction(sp)
			allocs := testing.AllocsPerRun(100, func() {
				o, _, term, trunc := e.Step(act)
				if len(o) != sp.ObsDim {
					t.Fatalf("Step returned %d values, want %d", len(o), sp.ObsDim)
				}
				if term || trunc {
					e.Reset(rng)
				}
			})
			if allocs != 0 {
				t.Errorf("Step allocates %v times per call, want 0", allocs)
			}
		})
	}
}

func zeroAction(sp Spec) []float64 {
	if sp.Discrete > 0 {
		return []float64{0}
	}
	return make([]float64, sp.ActDim)
}

// TestTimeLimitTruncates holds each environment at its reset state (so it
// never terminates) and checks that exactly step MaxEpisodeSteps truncates.
func TestTimeLimitTruncates(t *testing.T) {
	for _, n := range builtinNames() {
		t.Run(n, func(t *testing.T) {
			e, _ := Make(n)
			ss := e.(StateSetter)
			sp := e.Spec()
			e.Reset(newRNG(2))
			start := ss.State()
			act := zeroAction(sp)
			for i := 1; i <= sp.MaxEpisodeSteps; i++ {
				if _, err := ss.SetState(start); err != nil {
					t.Fatal(err)
				}
				_, _, term, trunc := e.Step(act)
				if term {
					t.Fatalf("step %d terminated from the reset state", i)
				}
				if trunc != (i == sp.MaxEpisodeSteps) {
					t.Fatalf("step %d: truncated = %v, want %v", i, trunc, i == sp.MaxEpisodeSteps)
				}
			}
			e.Reset(newRNG(3))
			if _, _, _, trunc := e.Step(act); trunc {
				t.Fatal("first step after Reset truncated")
			}
		})
	}
}

func TestSetStateRejectsWrongLength(t *testing.T) {
	for _, n := range builtinNames() {
		e, _ := Make(n)
		ss := e.(StateSetter)
		e.Reset(newRNG(4))
		before := ss.State()
		if _, err := ss.SetState(append(before, 1)); err == nil || !strings.Contains(err.Error(), n) {
			t.Errorf("%s: SetState(too long) error = %v, want one naming the env", n, err)
		}
		if got := ss.State(); !slices.Equal(got, before) {
			t.Errorf("%s: failed SetState changed the state: %v -> %v", n, before, got)
		}
	}
}

func TestMisusePanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	for _, n := range builtinNames() {
		e, _ := Make(n)
		sp := e.Spec()
		mustPanic(n+" step before reset", func() { e.Step(zeroAction(sp)) })
		e.Reset(newRNG(5))
		mustPanic(n+" empty action", func() { e.Step(nil) })
		if sp.Discrete > 0 {
			mustPanic(n+" index too large", func() { e.Step([]float64{float64(sp.Discrete)}) })
			mustPanic(n+" negative index", func() { e.Step([]float64{-1}) })
			mustPanic(n+" fractional index", func() { e.Step([]float64{0.5}) })
		}
	}
}

// TestResetDistribution checks reset states lie in Gymnasium's ranges and
// that Reset depends only on the rng passed in.
func TestResetDistribution(t *testing.T) {
	for _, n := range builtinNames() {
		e1, _ := Make(n)
		e2, _ := Make(n)
		r1, r2 := newRNG(7), newRNG(7)
		for range 50 {
			o1 := slices.Clone(e1.Reset(r1))
			o2 := e2.Reset(r2)
			if !slices.Equal(o1, o2) {
				t.Fatalf("%s: same seed gave %v and %v", n, o1, o2)
			}
		}
	}
}

// TestResetRanges checks each environment's reset state against
// Gymnasium's initial-state distribution bounds.
func TestResetRanges(t *testing.T) {
	pi := math.Pi
	cases := []struct {
		name   string
		lo, hi []float64 // closed bounds per state variable
		check  func(s []float64) string
	}{
		{"CartPole-v1", []float64{-0.05, -0.05, -0.05, -0.05}, []float64{0.05, 0.05, 0.05, 0.05}, nil},
		{"Pendulum-v1", []float64{-pi, -1}, []float64{pi, 1}, nil},
		{"MountainCarContinuous-v0", []float64{-0.6, 0}, []float64{-0.4, 0}, nil},
		{"Acrobot-v1", []float64{-0.1, -0.1, -0.1, -0.1}, []float64{0.1, 0.1, 0.1, 0.1}, func(s []float64) string {
			for _, v := range s {
				if float64(float32(v)) != v {
					return "not rounded to float32"
				}
			}
			return ""
		}},
	}
	for _, c := range cases {
		e, _ := Make(c.name)
		rng := newRNG(8)
		for range 2000 {
			e.Reset(rng)
			s := e.(StateSetter).State()
			for i, v := range s {
				if v < c.lo[i] || v > c.hi[i] {
					t.Fatalf("%s: reset state[%d] = %v outside [%v, %v]", c.name, i, v, c.lo[i], c.hi[i])
				}
			}
			if c.check != nil {
				if msg := c.check(s); msg != "" {
					t.Fatalf("%s: reset state %v %s", c.name, s, msg)
				}
			}
		}
	}
}

// TestLQRResetIsStandardNormal checks x_0's sample mean and variance (fixed
// seed, 30000 draws per coordinate: bounds are > 5 standard errors).
func TestLQRResetIsStandardNormal(t *testing.T) {
	e := NewLQR()
	rng := newRNG(9)
	const n = 30000
	var sum, sumSq [3]float64
	for range n {
		x := e.Reset(rng)
		for i, v := range x {
			sum[i] += v
			sumSq[i] += v * v
		}
	}
	for i := range 3 {
		mean := sum[i] / n
		variance := sumSq[i]/n - mean*mean
		if math.Abs(mean) > 0.035 || math.Abs(variance-1) > 0.05 {
			t.Errorf("x0[%d]: mean %v variance %v, want ≈ 0 and 1", i, mean, variance)
		}
	}
}

// TestCartPoleRewardAfterTermination follows Gymnasium: the terminating step
// earns 1, later steps without Reset earn 0 and stay terminated.
func TestCartPoleRewardAfterTermination(t *testing.T) {
	c := NewCartPole()
	c.Reset(newRNG(9))
	if _, err := c.SetState([]float64{2.39, 1, 0, 0}); err != nil {
		t.Fatal(err)
	}
	_, r, term, _ := c.Step([]float64{1})
	if !term || r != 1 {
		t.Fatalf("terminating step: reward %v terminated %v, want 1 true", r, term)
	}
	_, r, term, _ = c.Step([]float64{1})
	if !term || r != 0 {
		t.Fatalf("step after termination: reward %v terminated %v, want 0 true", r, term)
	}
}
