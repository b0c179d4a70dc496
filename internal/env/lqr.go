package env

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"gonum.org/v1/gonum/mat"
)

// The LQR task of Mania, Guy & Recht, "Simple random search provides a
// competitive approach to reinforcement learning" (2018), Section 4.3, on
// the instance of Dean, Mania, Matni, Recht & Tu, "On the sample complexity
// of the linear quadratic regulator" (2017):
//
//	x_{t+1} = A x_t + B u_t + w_t,  w_t ~ N(0, I),  x_0 ~ N(0, I)
//	cost_t  = x_tᵀ Q x_t + u_tᵀ R u_t,  reward_t = -cost_t
//
// with A = [[1.01, 0.01, 0], [0.01, 1.01, 0.01], [0, 0.01, 1.01]] (a
// marginally unstable graph Laplacian system), B = I, Q = 1e-3·I, R = I.
// Noise, initial state, cost and the observation (the full state, float64)
// follow the ARS authors' LQR environment (LQR_Env in the ARS code base,
// github.com/modestyachts/ARS: np_random.normal(0, 1, size=3) for x_0 and
// w_t, cost = x·Qx + u·Ru computed on the pre-step state). That code ends an
// episode when its step counter exceeds 300 (after 302 steps); rlhub uses
// exactly LQRHorizon = 300 steps, truncated by the time limit, and never
// terminates. Actions are not clipped (the reference's Box is ±1e8 and
// nominal).
//
// The optimum is the infinite-horizon discrete algebraic Riccati equation
// (DARE) P = Q + AᵀPA − AᵀPB(R + BᵀPB)⁻¹BᵀPA; the optimal policy is
// u = M* x with M* = −(R + BᵀPB)⁻¹BᵀPA and its average cost per step is
// tr(P·W) with W = I the noise covariance. LQROptimalGain, LQROptimalCost,
// LQRAverageCost and LQREpisodeCost expose these for comparisons.

// LQRHorizon is the LQR task's episode length.
const LQRHorizon = 300

// lqrN is the state and action dimension.
const lqrN = 3

var (
	lqrA = mat.NewDense(lqrN, lqrN, []float64{
		1.01, 0.01, 0,
		0.01, 1.01, 0.01,
		0, 0.01, 1.01,
	})
	lqrB = identity(lqrN)
	lqrQ = scaled(1e-3, identity(lqrN))
	lqrR = identity(lqrN)
	lqrW = identity(lqrN) // process noise covariance
	// lqrX0 is the covariance of the initial state.
	lqrX0 = identity(lqrN)
)

// lqrArrays holds the task matrices as arrays for Step's inner loops.
var lqrArrays = func() (m struct{ a, b, q, r [lqrN][lqrN]float64 }) {
	for i := range lqrN {
		for j := range lqrN {
			m.a[i][j], m.b[i][j] = lqrA.At(i, j), lqrB.At(i, j)
			m.q[i][j], m.r[i][j] = lqrQ.At(i, j), lqrR.At(i, j)
		}
	}
	return m
}()

// LQR is the environment. It keeps the rng passed to Reset and draws the
// process noise w_t from it in Step (see gaussian3), so an episode is determined by that
// rng; the caller must not use the rng elsewhere concurrently.
type LQR struct {
	x     [lqrN]float64
	next  [lqrN]float64
	obs   [lqrN]float64
	rng   *rand.Rand
	clock timeLimit
}

// NewLQR returns the LQR task; it must be Reset before stepping.
func NewLQR() *LQR { return &LQR{clock: timeLimit{max: LQRHorizon}} }

// Spec implements Env. The action bounds are the reference's nominal ±1e8.
func (l *LQR) Spec() Spec {
	return Spec{Name: "LQR", ObsDim: lqrN, ActDim: lqrN,
		ActLow: []float64{-1e8, -1e8, -1e8}, ActHigh: []float64{1e8, 1e8, 1e8},
		MaxEpisodeSteps: LQRHorizon}
}

// Reset implements Env: x_0 ~ N(0, I).
func (l *LQR) Reset(rng *rand.Rand) []float64 {
	l.rng = rng
	gaussian3(rng, &l.x)
	l.clock.reset()
	return l.observe()
}

// Step implements Env: reward -(xᵀQx + uᵀRu) on the current state, then
// x ← Ax + Bu + w.
func (l *LQR) Step(action []float64) ([]float64, float64, bool, bool) {
	continuousAction("LQR", action, lqrN)
	truncated := l.clock.tick("LQR")
	x, u := &l.x, action[:lqrN]
	m := &lqrArrays
	cost := 0.0
	for i := range lqrN {
		qx, ru := 0.0, 0.0
		for j := range lqrN {
			qx += float64(m.q[i][j] * x[j])
			ru += float64(m.r[i][j] * u[j])
		}
		cost += float64(x[i]*qx) + float64(u[i]*ru)
	}
	gaussian3(l.rng, &l.next) // w_t
	for i := range lqrN {
		v := 0.0
		for j := range lqrN {
			v += m.a[i][j]*x[j] + m.b[i][j]*u[j]
		}
		l.next[i] += v
	}
	l.x = l.next
	return l.observe(), -cost, false, truncated
}

// State implements StateSetter: the state x (also the observation).
func (l *LQR) State() []float64 { return append([]float64(nil), l.x[:]...) }

// SetState implements StateSetter.
func (l *LQR) SetState(s []float64) ([]float64, error) {
	if len(s) != lqrN {
		return nil, fmt.Errorf("env: LQR state has %d values, got %d", lqrN, len(s))
	}
	copy(l.x[:], s)
	return l.observe(), nil
}

func (l *LQR) observe() []float64 {
	l.obs = l.x
	return l.obs[:]
}

// gaussian3 fills dst with independent N(0, 1) draws from rng by
// Marsaglia's polar method: two pairs, the fourth value discarded, so each
// call consumes whole pairs and an episode depends only on the rng.
//
// It is used instead of rng.NormFloat64, whose ziggurat calls math.Exp on
// ~1% of draws: under GOEXPERIMENT=simd on the project's machines Go's
// assembly math.Exp intermittently costs microseconds (measured 2.8–5.9 µs
// per call in long runs, against 20–33 ns without the experiment); with
// NormFloat64 a profile of the LQR step benchmark spent 64% of its time in
// math.Exp.
func gaussian3(rng *rand.Rand, dst *[lqrN]float64) {
	a, b := polarPair(rng)
	c, _ := polarPair(rng)
	dst[0], dst[1], dst[2] = a, b, c
}

// polarPair returns two independent standard normal values.
func polarPair(rng *rand.Rand) (float64, float64) {
	for {
		u := float64(2*rng.Float64()) - 1
		v := float64(2*rng.Float64()) - 1
		s := float64(u*u) + float64(v*v)
		if s > 0 && s < 1 {
			f := math.Sqrt(-2 * math.Log(s) / s)
			return u * f, v * f
		}
	}
}

// lqrOpt caches the DARE solution; it depends only on constants.
var lqrOpt = sync.OnceValues(func() (*mat.Dense, *mat.Dense) {
	p, err := solveDARE(lqrA, lqrB, lqrQ, lqrR)
	if err != nil {
		panic("env: LQR Riccati solution failed: " + err.Error())
	}
	return p, optimalGain(lqrA, lqrB, lqrR, p)
})

// LQRRiccati returns the stabilising solution P of the task's DARE,
// row-major 3×3 (a fresh copy).
func LQRRiccati() []float64 {
	p, _ := lqrOpt()
	return denseData(p)
}

// LQROptimalGain returns M*, row-major 3×3, such that the optimal policy is
// u = M* x (ARS's linear policy form; M* = −K* in the usual u = −K x
// convention). A fresh copy.
func LQROptimalGain() []float64 {
	_, m := lqrOpt()
	return denseData(m)
}

// LQROptimalCost is the optimal infinite-horizon average cost per step,
// tr(P·W).
func LQROptimalCost() float64 {
	p, _ := lqrOpt()
	return traceProd(p, lqrW)
}

// LQRAverageCost is the infinite-horizon average cost per step of the policy
// u = M x (M row-major 3×3): tr(P_M·W) with P_M the solution of the
// Lyapunov equation P_M = Q + MᵀRM + (A+BM)ᵀ P_M (A+BM). It is +Inf when
// A+BM is not stable (spectral radius ≥ 1). The relative cost of M is
// LQRAverageCost(M)/LQROptimalCost() − 1.
func LQRAverageCost(m []float64) (float64, error) {
	M, err := gainMatrix(m)
	if err != nil {
		return 0, err
	}
	acl := closedLoop(M)
	if spectralRadius(acl) >= 1 {
		return math.Inf(1), nil
	}
	p, err := solveLyapunov(acl, stageCost(M))
	if err != nil {
		return 0, err
	}
	return traceProd(p, lqrW), nil
}

// LQREpisodeCost is the expected total cost (minus the expected return) of
// one episode of the task under u = M x: x_0 ~ N(0, I), LQRHorizon steps,
// computed exactly as Σ_t tr((Q + MᵀRM) Σ_t) with Σ_0 = I and
// Σ_{t+1} = (A+BM) Σ_t (A+BM)ᵀ + W. LQREpisodeCost(LQROptimalGain()) is the
// Riccati optimum's cost over the same horizon and noise.
func LQREpisodeCost(m []float64) (float64, error) {
	M, err := gainMatrix(m)
	if err != nil {
		return 0, err
	}
	acl := closedLoop(M)
	c := stageCost(M)
	sigma := mat.DenseCopyOf(lqrX0)
	var tmp, next mat.Dense
	total := 0.0
	for range LQRHorizon {
		total += traceProd(c, sigma)
		tmp.Mul(acl, sigma)
		next.Mul(&tmp, acl.T())
		next.Add(&next, lqrW)
		sigma.Copy(&next)
	}
	return total, nil
}

func gainMatrix(m []float64) (*mat.Dense, error) {
	if len(m) != lqrN*lqrN {
		return nil, fmt.Errorf("env: LQR gain has %d values, want %d (row-major %d×%d)", len(m), lqrN*lqrN, lqrN, lqrN)
	}
	for i, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("env: LQR gain value %d is %v", i, v)
		}
	}
	return mat.NewDense(lqrN, lqrN, append([]float64(nil), m...)), nil
}

// closedLoop is A + B M.
func closedLoop(m *mat.Dense) *mat.Dense {
	var acl mat.Dense
	acl.Mul(lqrB, m)
	acl.Add(&acl, lqrA)
	return &acl
}

// stageCost is Q + MᵀRM, the per-step cost matrix of u = M x.
func stageCost(m *mat.Dense) *mat.Dense {
	var rm, c mat.Dense
	rm.Mul(lqrR, m)
	c.Mul(m.T(), &rm)
	c.Add(&c, lqrQ)
	return &c
}

// solveDARE solves P = Q + AᵀPA − AᵀPB(R + BᵀPB)⁻¹BᵀPA for the stabilising
// P by the structure-preserving doubling algorithm (Chu, Fan, Lin & Wang
// 2004): with A_0 = A, G_0 = BR⁻¹Bᵀ, H_0 = Q,
//
//	A_{k+1} = A_k (I + G_k H_k)⁻¹ A_k
//	G_{k+1} = G_k + A_k (I + G_k H_k)⁻¹ G_k A_kᵀ
//	H_{k+1} = H_k + A_kᵀ H_k (I + G_k H_k)⁻¹ A_k
//
// H_k converges quadratically to P. The result is checked by its residual.
func solveDARE(a, b, q, r mat.Matrix) (*mat.Dense, error) {
	n, _ := a.Dims()
	var rinv, g mat.Dense
	if err := rinv.Inverse(r); err != nil {
		return nil, fmt.Errorf("R is singular: %w", err)
	}
	var tmp mat.Dense
	tmp.Mul(b, &rinv)
	g.Mul(&tmp, b.T())
	ak, gk, hk := mat.DenseCopyOf(a), mat.DenseCopyOf(&g), mat.DenseCopyOf(q)
	eye := identity(n)
	for iter := 0; iter < 100; iter++ {
		var w, winv mat.Dense
		w.Mul(gk, hk)
		w.Add(&w, eye)
		if err := winv.Inverse(&w); err != nil {
			return nil, fmt.Errorf("doubling step %d: %w", iter, err)
		}
		var wa, an, gn, hn, t1 mat.Dense
		wa.Mul(&winv, ak) // (I+GH)⁻¹ A
		an.Mul(ak, &wa)
		t1.Mul(&winv, gk)
		t1.Mul(&t1, ak.T())
		gn.Mul(ak, &t1)
		gn.Add(&gn, gk)
		t1.Mul(hk, &wa)
		hn.Mul(ak.T(), &t1)
		hn.Add(&hn, hk)
		var d mat.Dense
		d.Sub(&hn, hk)
		ak, gk, hk = &an, &gn, &hn
		if mat.Norm(&d, 1) <= 1e-15*mat.Norm(hk, 1) {
			break
		}
	}
	if res := dareResidual(a, b, q, r, hk); res > 1e-10*mat.Norm(hk, 1) {
		return nil, fmt.Errorf("no convergence: residual %g", res)
	}
	return hk, nil
}

// dareResidual is ‖Q + AᵀPA − AᵀPB(R + BᵀPB)⁻¹BᵀPA − P‖₁.
func dareResidual(a, b, q, r mat.Matrix, p *mat.Dense) float64 {
	var pa, atpa, pb, btpb, s, sinv, btpa, t, f mat.Dense
	pa.Mul(p, a)
	atpa.Mul(a.T(), &pa)
	pb.Mul(p, b)
	btpb.Mul(b.T(), &pb)
	s.Add(r, &btpb)
	if err := sinv.Inverse(&s); err != nil {
		return math.Inf(1)
	}
	btpa.Mul(b.T(), &pa)
	t.Mul(&sinv, &btpa)
	var atpb mat.Dense
	atpb.Mul(a.T(), &pb)
	f.Mul(&atpb, &t)
	var res mat.Dense
	res.Add(q, &atpa)
	res.Sub(&res, &f)
	res.Sub(&res, p)
	return mat.Norm(&res, 1)
}

// optimalGain is M = −(R + BᵀPB)⁻¹BᵀPA.
func optimalGain(a, b, r mat.Matrix, p *mat.Dense) *mat.Dense {
	var pb, s, pa, btpa, m mat.Dense
	pb.Mul(p, b)
	s.Mul(b.T(), &pb)
	s.Add(&s, r)
	pa.Mul(p, a)
	btpa.Mul(b.T(), &pa)
	if err := m.Solve(&s, &btpa); err != nil {
		panic("env: R + BᵀPB singular: " + err.Error())
	}
	m.Scale(-1, &m)
	return &m
}

// solveLyapunov solves P = C + AᵀPA exactly through the Kronecker form
// (I − Aᵀ⊗Aᵀ) vec(P) = vec(C); A must be stable.
func solveLyapunov(a, c *mat.Dense) (*mat.Dense, error) {
	n, _ := a.Dims()
	var k mat.Dense
	k.Kronecker(a.T(), a.T())
	var lhs mat.Dense
	lhs.Sub(identity(n*n), &k)
	// Row-major vec on both sides: (Aᵀ⊗Aᵀ) vec_r(P) = vec_r(AᵀPA).
	rhs := mat.NewVecDense(n*n, denseData(c))
	var v mat.VecDense
	if err := v.SolveVec(&lhs, rhs); err != nil {
		return nil, fmt.Errorf("env: Lyapunov equation: %w", err)
	}
	return mat.NewDense(n, n, v.RawVector().Data), nil
}

func spectralRadius(a *mat.Dense) float64 {
	var eig mat.Eigen
	if !eig.Factorize(a, mat.EigenNone) {
		return math.Inf(1)
	}
	r := 0.0
	for _, v := range eig.Values(nil) {
		r = math.Max(r, math.Hypot(real(v), imag(v)))
	}
	return r
}

// traceProd is tr(X·Y).
func traceProd(x, y mat.Matrix) float64 {
	var p mat.Dense
	p.Mul(x, y)
	return mat.Trace(&p)
}

func identity(n int) *mat.Dense {
	m := mat.NewDense(n, n, nil)
	for i := range n {
		m.Set(i, i, 1)
	}
	return m
}

func scaled(f float64, m *mat.Dense) *mat.Dense {
	m.Scale(f, m)
	return m
}

func denseData(m *mat.Dense) []float64 {
	r, c := m.Dims()
	out := make([]float64, 0, r*c)
	for i := range r {
		for j := range c {
			out = append(out, m.At(i, j))
		}
	}
	return out
}
