//go:build mujoco && cgo

package mjenv

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/env"
)

func newEnv(t testing.TB, name string) *Env {
	t.Helper()
	e, err := New(name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// TestSpecs checks each task's spaces against Gymnasium 1.4.0's
// (observation_space.shape, action_space bounds, dt).
func TestSpecs(t *testing.T) {
	tests := []struct {
		name           string
		obs, act       int
		actLow, actHig float64
		dt             float64
	}{
		{"HalfCheetah-v5", 17, 6, -1, 1, 0.05},
		{"Hopper-v5", 11, 3, -1, 1, 0.008},
		{"Swimmer-v5", 8, 2, -1, 1, 0.04},
		{"Walker2d-v5", 17, 6, -1, 1, 0.008},
		{"Ant-v5", 105, 8, -1, 1, 0.05},
		{"Humanoid-v5", 348, 17, -0.4, 0.4, 0.015},
	}
	for _, tt := range tests {
		e := newEnv(t, tt.name)
		s := e.Spec()
		if s.Name != tt.name || s.ObsDim != tt.obs || s.ActDim != tt.act || s.Discrete != 0 || s.MaxEpisodeSteps != 1000 {
			t.Errorf("%s: spec = %+v, want obs %d act %d, 1000 steps", tt.name, s, tt.obs, tt.act)
		}
		if len(s.ActLow) != tt.act || slices.Min(s.ActLow) != tt.actLow || slices.Max(s.ActHigh) != tt.actHig {
			t.Errorf("%s: action bounds %v..%v, want %v..%v", tt.name, s.ActLow, s.ActHigh, tt.actLow, tt.actHig)
		}
		if math.Abs(e.Dt()-tt.dt) > 1e-12 {
			t.Errorf("%s: dt = %v, want %v", tt.name, e.Dt(), tt.dt)
		}
		if obs := e.Reset(rand.New(rand.NewPCG(1, 1))); len(obs) != tt.obs {
			t.Errorf("%s: Reset observation length %d, want %d", tt.name, len(obs), tt.obs)
		}
	}
}

// TestResetNoise checks the reset distribution's support: qpos within
// ±scale of the reference pose, qvel within ±scale (uniform) or spread like
// scale·N(0,1) (HalfCheetah, Ant), and that different seeds differ.
func TestResetNoise(t *testing.T) {
	for _, tk := range tasks {
		e := newEnv(t, tk.name)
		var absVel []float64
		for seed := range uint64(20) {
			e.Reset(rand.New(rand.NewPCG(seed, 0)))
			st := e.State()
			nq := len(e.initQpos)
			for i, q := range st[:nq] {
				if d := math.Abs(q - e.initQpos[i]); d > tk.noise {
					t.Fatalf("%s seed %d: qpos[%d] is %v from the reference pose, noise scale %v", tk.name, seed, i, d, tk.noise)
				}
			}
			for _, v := range st[nq:] {
				absVel = append(absVel, math.Abs(v))
			}
		}
		maxVel := slices.Max(absVel)
		if !tk.gaussQvel && maxVel > tk.noise {
			t.Errorf("%s: |qvel| up to %v, want ≤ %v (uniform noise)", tk.name, maxVel, tk.noise)
		}
		if tk.gaussQvel && maxVel <= tk.noise {
			t.Errorf("%s: |qvel| never above %v over %d draws; want Gaussian tails", tk.name, tk.noise, len(absVel))
		}
		if maxVel == 0 {
			t.Errorf("%s: no velocity noise", tk.name)
		}
	}
}

// TestDeterministic: same seed and actions give bit-identical trajectories
// in two instances.
func TestDeterministic(t *testing.T) {
	for _, name := range Names() {
		a, b := newEnv(t, name), newEnv(t, name)
		oa := slices.Clone(a.Reset(rand.New(rand.NewPCG(5, 6))))
		ob := b.Reset(rand.New(rand.NewPCG(5, 6)))
		if !slices.Equal(oa, ob) {
			t.Fatalf("%s: reset observations differ", name)
		}
		act := rand.New(rand.NewPCG(9, 9))
		u := make([]float64, a.Spec().ActDim)
		for k := range 50 {
			for i := range u {
				u[i] = 2*act.Float64() - 1
			}
			o1, r1, d1, _ := a.Step(u)
			o1 = slices.Clone(o1)
			o2, r2, d2, _ := b.Step(u)
			if !slices.Equal(o1, o2) || r1 != r2 || d1 != d2 {
				t.Fatalf("%s step %d: instances diverged", name, k)
			}
			if d1 {
				break
			}
		}
	}
}

// TestTimeLimit: Swimmer never terminates, so the 1000th step, and only
// it, truncates.
func TestTimeLimit(t *testing.T) {
	e := newEnv(t, "Swimmer-v5")
	e.Reset(rand.New(rand.NewPCG(0, 0)))
	u := []float64{0.3, -0.3}
	for k := 1; k <= 1000; k++ {
		_, _, term, trunc := e.Step(u)
		if term || trunc != (k == 1000) {
			t.Fatalf("step %d: terminated %v truncated %v", k, term, trunc)
		}
	}
	e.Reset(rand.New(rand.NewPCG(0, 0)))
	if _, _, _, trunc := e.Step(u); trunc {
		t.Error("Reset did not restart the step count")
	}
}

// TestFallTerminates: a Hopper driven hard one way falls and terminates
// with no healthy reward on that step.
func TestFallTerminates(t *testing.T) {
	e := newEnv(t, "Hopper-v5")
	e.Reset(rand.New(rand.NewPCG(0, 0)))
	for k := range 1000 {
		_, r, term, _ := e.Step([]float64{1, 1, 1})
		if term {
			if x := e.State()[1]; x > 0.7 && math.Abs(e.State()[2]) < 0.2 {
				t.Errorf("terminated at step %d while healthy (z=%v)", k, x)
			}
			return
		}
		if r < 1-0.003-10 { // healthy reward 1, ctrl cost 0.003, bounded speed
			t.Fatalf("step %d: reward %v while healthy", k, r)
		}
	}
	t.Error("a Hopper driven with full torque never fell")
}

func TestMisuse(t *testing.T) {
	e := newEnv(t, "Hopper-v5")
	if _, err := e.SetState(make([]float64, 3)); err == nil {
		t.Error("SetState with a short state succeeded")
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "before Reset") {
				t.Errorf("Step before Reset: recovered %v", r)
			}
		}()
		e.Step([]float64{0, 0, 0})
	}()
	e.Reset(rand.New(rand.NewPCG(0, 0)))
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "length 3") {
				t.Errorf("Step with a wrong action length: recovered %v", r)
			}
		}()
		e.Step([]float64{0})
	}()
}

func TestMissingAssets(t *testing.T) {
	_, err := New("Ant-v5", Options{AssetsDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "pip install") || !strings.Contains(err.Error(), AssetsEnvVar) {
		t.Errorf("New with an empty assets dir: err = %v, want a hint to install gymnasium or set %s", err, AssetsEnvVar)
	}
	t.Setenv(AssetsEnvVar, "/nonexistent/dir")
	if _, err := New("Ant-v5", Options{}); err == nil || !strings.Contains(err.Error(), AssetsEnvVar) {
		t.Errorf("New with %s pointing nowhere: err = %v", AssetsEnvVar, err)
	}
}

func TestRegistered(t *testing.T) {
	for _, name := range Names() {
		ctor, ok := env.Lookup(name)
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		e, err := ctor()
		if err != nil {
			t.Fatal(err)
		}
		if e.Spec().Name != name {
			t.Errorf("constructor for %s made %s", name, e.Spec().Name)
		}
		e.(*Env).Close()
		if !slices.Contains(env.Names(), name) {
			t.Errorf("env.Names() = %v, missing %s", env.Names(), name)
		}
		e, err = env.Make(name)
		if err != nil {
			t.Fatalf("env.Make(%q): %v", name, err)
		}
		e.(*Env).Close()
	}
}

// BenchmarkStep measures env steps per second for each task, with uniformly
// random actions in the bounds and a Reset whenever an episode ends:
// steps/s over wall time, and steps/cpu-s over the process's CPU time
// (user + system), which is what one core delivers and is less disturbed
// by other load on a shared machine. scripts/bench_mujoco.py runs it next to
// Gymnasium.
func BenchmarkStep(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			e := newEnv(b, name)
			rng := rand.New(rand.NewPCG(1, 2))
			s := e.Spec()
			acts := make([][]float64, 1024)
			for i := range acts {
				acts[i] = make([]float64, s.ActDim)
				for j := range acts[i] {
					acts[i][j] = s.ActLow[j] + (s.ActHigh[j]-s.ActLow[j])*rng.Float64()
				}
			}
			e.Reset(rng)
			n := 0
			cpu0 := cpuSeconds(b)
			for b.Loop() {
				if _, _, term, trunc := e.Step(acts[n%len(acts)]); term || trunc {
					e.Reset(rng)
				}
				n++
			}
			cpu := cpuSeconds(b) - cpu0
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "steps/s")
			b.ReportMetric(float64(n)/cpu, "steps/cpu-s")
		})
	}
}

func TestStepDoesNotAllocate(t *testing.T) {
	for _, name := range Names() {
		e := newEnv(t, name)
		rng := rand.New(rand.NewPCG(3, 3))
		e.Reset(rng)
		u := make([]float64, e.Spec().ActDim)
		allocs := testing.AllocsPerRun(50, func() {
			if _, _, term, trunc := e.Step(u); term || trunc {
				e.Reset(rng)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Step allocates %v times per call", name, allocs)
		}
	}
}

// cpuSeconds is the CPU time (user + system) this process has used.
func cpuSeconds(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// TestConcurrentInstances makes and steps instances of every task from
// several goroutines at once (as ARS workers do); with -race it checks that
// instances share nothing mutable, and that concurrent runs stay identical.
func TestConcurrentInstances(t *testing.T) {
	const workers = 4
	for _, name := range Names() {
		sums := make([]float64, workers)
		errs := make([]error, workers)
		done := make(chan int)
		for w := range workers {
			go func() {
				defer func() { done <- w }()
				e, err := New(name, Options{})
				if err != nil {
					errs[w] = err
					return
				}
				defer e.Close()
				e.Reset(rand.New(rand.NewPCG(4, 4)))
				u := make([]float64, e.Spec().ActDim)
				for k := range 30 {
					for i := range u {
						u[i] = math.Sin(float64(k + i))
					}
					_, r, term, _ := e.Step(u)
					sums[w] += r
					if term {
						break
					}
				}
			}()
		}
		for range workers {
			<-done
		}
		for w := range workers {
			if errs[w] != nil {
				t.Fatal(errs[w])
			}
			if sums[w] != sums[0] {
				t.Errorf("%s: worker %d return %v, worker 0 %v", name, w, sums[w], sums[0])
			}
		}
	}
}
