package env

import (
	"math"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// riccatiByIteration is the plain reference: value iteration on the
// Riccati recursion from P = Q until it stops changing.
func riccatiByIteration(t *testing.T) *mat.Dense {
	p := mat.DenseCopyOf(lqrQ)
	for it := 0; it < 1_000_000; it++ {
		var pa, atpa, pb, s, sinv, btpa, f, next mat.Dense
		pa.Mul(p, lqrA)
		atpa.Mul(lqrA.T(), &pa)
		pb.Mul(p, lqrB)
		s.Mul(lqrB.T(), &pb)
		s.Add(&s, lqrR)
		if err := sinv.Inverse(&s); err != nil {
			t.Fatal(err)
		}
		btpa.Mul(lqrB.T(), &pa)
		f.Mul(&sinv, &btpa)
		var atpb mat.Dense
		atpb.Mul(lqrA.T(), &pb)
		f.Mul(&atpb, &f)
		next.Add(lqrQ, &atpa)
		next.Sub(&next, &f)
		var d mat.Dense
		d.Sub(&next, p)
		p = &next
		if mat.Norm(&d, 1) < 1e-16 {
			return p
		}
	}
	t.Fatal("Riccati iteration did not converge")
	return nil
}

func TestLQRRiccatiMatchesIteration(t *testing.T) {
	got := mat.NewDense(3, 3, LQRRiccati())
	want := riccatiByIteration(t)
	if !mat.EqualApprox(got, want, 1e-10*mat.Norm(want, 1)) {
		t.Fatalf("doubling P =\n%v\niteration P =\n%v", mat.Formatted(got), mat.Formatted(want))
	}
	if res := dareResidual(lqrA, lqrB, lqrQ, lqrR, got); res > 1e-12 {
		t.Fatalf("DARE residual %g", res)
	}
	if !mat.EqualApprox(got, got.T(), 1e-15) {
		t.Fatalf("P not symmetric:\n%v", mat.Formatted(got))
	}
	if r := spectralRadius(closedLoop(mat.NewDense(3, 3, LQROptimalGain()))); r >= 1 {
		t.Fatalf("A + BM* has spectral radius %v, want < 1", r)
	}
	t.Logf("P* = %v\nM* = %v\nJ* = %v", LQRRiccati(), LQROptimalGain(), LQROptimalCost())
}

// TestLQROptimalIsMinimal checks that the Riccati gain's average cost is
// tr(P*) and that random perturbations of it all cost more.
func TestLQROptimalIsMinimal(t *testing.T) {
	opt := LQROptimalCost()
	mstar := LQROptimalGain()
	got, err := LQRAverageCost(mstar)
	if err != nil {
		t.Fatal(err)
	}
	if relDiff(got, opt) > 1e-9 {
		t.Fatalf("LQRAverageCost(M*) = %v, LQROptimalCost() = %v", got, opt)
	}
	rng := newRNG(11)
	for range 200 {
		m := append([]float64(nil), mstar...)
		for i := range m {
			m[i] += 0.05 * rng.NormFloat64()
		}
		c, err := LQRAverageCost(m)
		if err != nil {
			t.Fatal(err)
		}
		if c <= opt {
			t.Fatalf("perturbed gain %v costs %v ≤ optimum %v", m, c, opt)
		}
	}
}

func TestLQRAverageCostUnstable(t *testing.T) {
	c, err := LQRAverageCost(make([]float64, 9)) // u = 0: A itself, eigenvalues > 1
	if err != nil || !math.IsInf(c, 1) {
		t.Fatalf("LQRAverageCost(0) = %v, %v; want +Inf, nil", c, err)
	}
}

func TestLQRCostRejectsBadGain(t *testing.T) {
	for _, m := range [][]float64{nil, make([]float64, 8), {0, 0, 0, 0, math.NaN(), 0, 0, 0, 0}} {
		if _, err := LQRAverageCost(m); err == nil || !strings.Contains(err.Error(), "LQR gain") {
			t.Errorf("LQRAverageCost(%v) error = %v", m, err)
		}
		if _, err := LQREpisodeCost(m); err == nil || !strings.Contains(err.Error(), "LQR gain") {
			t.Errorf("LQREpisodeCost(%v) error = %v", m, err)
		}
	}
}

// TestLQREpisodeCostMatchesSimulation runs the environment under u = M x
// and checks the mean episode cost against LQREpisodeCost within four
// standard errors (deterministic seed).
func TestLQREpisodeCostMatchesSimulation(t *testing.T) {
	gains := map[string][]float64{
		"optimal": LQROptimalGain(),
		"-0.5I":   {-0.5, 0, 0, 0, -0.5, 0, 0, 0, -0.5},
	}
	for name, m := range gains {
		want, err := LQREpisodeCost(m)
		if err != nil {
			t.Fatal(err)
		}
		e := NewLQR()
		rng := newRNG(12)
		const episodes = 2000
		var sum, sumSq float64
		u := make([]float64, 3)
		for range episodes {
			x := e.Reset(rng)
			cost := 0.0
			for {
				for i := range 3 {
					u[i] = m[3*i]*x[0] + m[3*i+1]*x[1] + m[3*i+2]*x[2]
				}
				var r float64
				var trunc bool
				x, r, _, trunc = e.Step(u)
				cost -= r
				if trunc {
					break
				}
			}
			sum += cost
			sumSq += cost * cost
		}
		mean := sum / episodes
		se := math.Sqrt((sumSq/episodes - mean*mean) / episodes)
		if math.Abs(mean-want) > 4*se {
			t.Errorf("%s: simulated mean episode cost %v ± %v, LQREpisodeCost %v", name, mean, se, want)
		}
		t.Logf("%s: simulated %.4f ± %.4f, exact %.4f", name, mean, se, want)
	}
}

// TestLQREpisodeCostOptimalIsBest: over the fixed horizon the Riccati gain
// beats perturbed static gains too (the infinite-horizon gain is not
// exactly optimal for 300 steps, but perturbations of this size cost more).
func TestLQREpisodeCostOrdering(t *testing.T) {
	opt, _ := LQREpisodeCost(LQROptimalGain())
	avg := LQROptimalCost()
	// 300 steps from x_0 ~ N(0, I) cost about 300 × the average per step.
	if r := opt / (LQRHorizon * avg); r < 0.9 || r > 1.1 {
		t.Fatalf("episode cost %v vs %d × average %v: ratio %v", opt, LQRHorizon, avg, r)
	}
	rng := newRNG(13)
	for range 100 {
		m := LQROptimalGain()
		for i := range m {
			m[i] += 0.1 * rng.NormFloat64()
		}
		c, _ := LQREpisodeCost(m)
		if c <= opt {
			t.Fatalf("perturbed gain costs %v ≤ optimum %v over the episode", c, opt)
		}
	}
}

// TestLQRStepByHand checks one transition against the formula, drawing the
// expected noise from a second rng with the same seed.
func TestLQRStepByHand(t *testing.T) {
	e := NewLQR()
	rng, twin := newRNG(14), newRNG(14)
	x0 := e.Reset(rng)
	var w [3]float64
	gaussian3(twin, &w)
	for i := range 3 {
		if x0[i] != w[i] {
			t.Fatalf("x0[%d] = %v, want the N(0,1) draw %v", i, x0[i], w[i])
		}
	}
	x := []float64{0.5, -2, 3}
	if _, err := e.SetState(x); err != nil {
		t.Fatal(err)
	}
	u := []float64{0.25, 1, -4}
	obs, r, term, trunc := e.Step(u)
	wantR := -(1e-3*(0.25+4+9) + (0.0625 + 1 + 16))
	if relDiff(r, wantR) > 1e-15 || term || trunc {
		t.Fatalf("reward %v terminated %v truncated %v, want %v false false", r, term, trunc, wantR)
	}
	ax := []float64{
		1.01*0.5 + 0.01*-2,
		0.01*0.5 + 1.01*-2 + 0.01*3,
		0.01*-2 + 1.01*3,
	}
	gaussian3(twin, &w)
	for i := range 3 {
		want := ax[i] + u[i] + w[i]
		if relDiff(obs[i], want) > 1e-14 {
			t.Fatalf("x1[%d] = %v, want %v", i, obs[i], want)
		}
	}
}

// TestGaussian3Moments checks the polar sampler's first four moments and
// the independence of its three outputs on 200000 draws (fixed seed;
// bounds are ≥ 5 standard errors).
func TestGaussian3Moments(t *testing.T) {
	rng := newRNG(15)
	const n = 200000
	var m1, m2, m4 [3]float64
	var c01, c02, c12 float64
	var w [3]float64
	for range n {
		gaussian3(rng, &w)
		for i, v := range w {
			m1[i] += v
			m2[i] += v * v
			m4[i] += v * v * v * v
		}
		c01 += w[0] * w[1]
		c02 += w[0] * w[2]
		c12 += w[1] * w[2]
	}
	for i := range 3 {
		mean, variance, kurt := m1[i]/n, m2[i]/n, m4[i]/n
		if math.Abs(mean) > 0.012 || math.Abs(variance-1) > 0.016 || math.Abs(kurt-3) > 0.11 {
			t.Errorf("coordinate %d: mean %v variance %v fourth moment %v, want 0, 1, 3", i, mean, variance, kurt)
		}
	}
	for name, c := range map[string]float64{"01": c01, "02": c02, "12": c12} {
		if math.Abs(c/n) > 0.012 {
			t.Errorf("correlation %s = %v, want ≈ 0", name, c/n)
		}
	}
}
