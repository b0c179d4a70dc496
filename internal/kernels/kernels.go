// Package kernels holds rlhub's hot numeric loops over float32 (and the
// half-precision and float64 buffers the gradient reducer meets): add,
// scaled add (in place, into a third buffer, or reporting whether the
// result is finite), scale, sum of squares and the NaN/Inf scan.
//
// Contracts, in the style of gonum's kernels:
//   - The destination comes first and is updated in place; nothing allocates.
//   - Mismatched lengths are a bug in rlhub's own code and panic. Bytes that
//     arrived over the network are validated (package safetensors) before
//     they reach a kernel.
//   - Results equal the plain loops in generic.go up to floating-point
//     reassociation: element-wise kernels (Add, AddScaled, Scale, AddBF16,
//     AddF16, AddF64) are exact (AddScaled may fuse the multiply-add, i.e.
//     round once instead of twice); SumSquares accumulates in float64 in a
//     different order.
//
// On amd64 built with GOEXPERIMENT=simd the kernels use AVX2/FMA through
// simd/archsimd when the CPU has them; elsewhere they are plain Go loops.
// Path reports which implementation runs.
package kernels

import (
	"fmt"
)

// impl is the selected implementation. Tests swap it to exercise every path.
type impl struct {
	name           string
	add            func(dst, x []float32)
	addScaled      func(dst []float32, a float32, x []float32)
	addScaledTo    func(dst, y []float32, a float32, x []float32)
	addFinite      func(dst, x []float32) bool
	addScaledFin   func(dst []float32, a float32, x []float32) bool
	scale          func(dst []float32, a float32)
	sumSquares     func(x []float32) float64
	firstNonFinite func(x []float32) int
	addF64         func(dst, x []float64)
	addBF16        func(dst []float32, x []uint16)
}

var generic = impl{
	name:           "generic",
	add:            addGeneric,
	addScaled:      addScaledGeneric,
	addScaledTo:    addScaledToGeneric,
	addFinite:      addFiniteGeneric,
	addScaledFin:   addScaledFiniteGeneric,
	scale:          scaleGeneric,
	sumSquares:     sumSquaresGeneric,
	firstNonFinite: firstNonFiniteGeneric,
	addF64:         addF64Generic,
	addBF16:        addBF16Generic,
}

// active is set once at init (see simd_amd64.go) and only swapped by tests.
var active = generic

// paths lists every implementation this build and CPU can run, generic
// first; tests run each against the plain references.
var paths = []impl{generic}

// Path names the implementation in use: "avx2" (simd/archsimd, AVX2+FMA) or
// "generic" (plain Go loops).
func Path() string { return active.name }

func checkLen(op string, dst, x int) {
	if dst != x {
		panic(fmt.Sprintf("kernels.%s: len(dst)=%d, len(x)=%d", op, dst, x))
	}
}

// Add sets dst[i] += x[i]. It panics if the lengths differ.
func Add(dst, x []float32) {
	checkLen("Add", len(dst), len(x))
	active.add(dst, x)
}

// AddScaled sets dst[i] += a*x[i] (axpy). It panics if the lengths differ.
// The multiply-add may be fused (rounded once).
func AddScaled(dst []float32, a float32, x []float32) {
	checkLen("AddScaled", len(dst), len(x))
	active.addScaled(dst, a, x)
}

// AddScaledTo sets dst[i] = y[i] + a*x[i]: copy(dst, y) followed by
// AddScaled(dst, a, x) in one pass, with exactly AddScaled's results. dst
// may be y or x itself but must not otherwise overlap them. It panics if
// the lengths differ.
func AddScaledTo(dst, y []float32, a float32, x []float32) {
	checkLen("AddScaledTo", len(dst), len(y))
	checkLen("AddScaledTo", len(dst), len(x))
	active.addScaledTo(dst, y, a, x)
}

// AddFinite is Add that also reports whether every dst[i] is finite
// afterwards, in the same pass. A non-finite operand makes its sum
// non-finite, so true also means both inputs were finite. It panics if the
// lengths differ.
func AddFinite(dst, x []float32) bool {
	checkLen("AddFinite", len(dst), len(x))
	return active.addFinite(dst, x)
}

// AddScaledFinite is AddScaled that also reports whether every dst[i] is
// finite afterwards. It panics if the lengths differ.
func AddScaledFinite(dst []float32, a float32, x []float32) bool {
	checkLen("AddScaledFinite", len(dst), len(x))
	return active.addScaledFin(dst, a, x)
}

// Scale sets dst[i] *= a.
func Scale(dst []float32, a float32) { active.scale(dst, a) }

// SumSquares returns Σ x[i]², for global-norm gradient clipping. Squares are
// taken exactly in float64 and summed in blocks, so the relative error stays
// near 1e-13 at 25M elements (a float32 accumulator would be off by
// percents). It is +Inf or NaN when x holds Inf or NaN.
func SumSquares(x []float32) float64 { return active.sumSquares(x) }

// FirstNonFinite returns the index of the first NaN or ±Inf in x, or -1.
func FirstNonFinite(x []float32) int { return active.firstNonFinite(x) }

// HasNonFinite reports whether x holds a NaN or ±Inf.
func HasNonFinite(x []float32) bool { return active.firstNonFinite(x) >= 0 }

// AddF64 sets dst[i] += x[i] for float64. It panics if the lengths differ.
func AddF64(dst, x []float64) {
	checkLen("AddF64", len(dst), len(x))
	active.addF64(dst, x)
}

// FirstNonFiniteF64 returns the index of the first NaN or ±Inf in x, or -1.
func FirstNonFiniteF64(x []float64) int {
	for i, v := range x {
		if v-v != 0 { // NaN-NaN and Inf-Inf are NaN; finite-finite is 0
			return i
		}
	}
	return -1
}
