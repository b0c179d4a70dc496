//go:build goexperiment.simd && amd64

package kernels

import "simd/archsimd"

// The AVX2/FMA path. Each kernel runs a 4×8-lane unrolled main loop, one
// 8-lane loop, then hands the tail (< 8 elements) to the plain loop, and
// clears the upper AVX state before returning to SSE code (the Go runtime's
// memmove and friends).

func init() {
	if archsimd.X86.AVX2() && archsimd.X86.FMA() {
		active = avx2
		paths = append(paths, avx2)
	}
}

var avx2 = impl{
	name:           "avx2",
	add:            addAVX2,
	addScaled:      addScaledAVX2,
	addScaledTo:    addScaledToAVX2,
	addFinite:      addFiniteAVX2,
	addScaledFin:   addScaledFiniteAVX2,
	scale:          scaleAVX2,
	sumSquares:     sumSquaresAVX2,
	firstNonFinite: firstNonFiniteAVX2,
	addF64:         addF64AVX2,
	addBF16:        addBF16AVX2,
}

// addAVX2 is addFiniteAVX2 without its answer: the check's one fused
// multiply-add per vector rides on a loop bound by memory.
func addAVX2(dst, x []float32) { _ = addFiniteAVX2(dst, x) }

// addScaledAVX2 is addScaledToAVX2 with y = dst.
func addScaledAVX2(dst []float32, a float32, x []float32) { addScaledToAVX2(dst, dst, a, x) }

// addScaledToAVX2 computes each element with one fused multiply-add of
// x, a and y.
func addScaledToAVX2(dst, y []float32, a float32, x []float32) {
	n := len(dst)
	y, x = y[:n], x[:n]
	va := archsimd.BroadcastFloat32x8(a)
	i := 0
	for ; i+32 <= n; i += 32 {
		d, b, s := dst[i:i+32:i+32], y[i:i+32:i+32], x[i:i+32:i+32]
		a0 := archsimd.LoadFloat32x8Slice(s[0:]).MulAdd(va, archsimd.LoadFloat32x8Slice(b[0:]))
		a1 := archsimd.LoadFloat32x8Slice(s[8:]).MulAdd(va, archsimd.LoadFloat32x8Slice(b[8:]))
		a2 := archsimd.LoadFloat32x8Slice(s[16:]).MulAdd(va, archsimd.LoadFloat32x8Slice(b[16:]))
		a3 := archsimd.LoadFloat32x8Slice(s[24:]).MulAdd(va, archsimd.LoadFloat32x8Slice(b[24:]))
		a0.StoreSlice(d[0:])
		a1.StoreSlice(d[8:])
		a2.StoreSlice(d[16:])
		a3.StoreSlice(d[24:])
	}
	for ; i+8 <= n; i += 8 {
		archsimd.LoadFloat32x8Slice(x[i:]).MulAdd(va, archsimd.LoadFloat32x8Slice(y[i:])).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	addScaledToGeneric(dst[i:], y[i:], a, x[i:])
}

// addFiniteAVX2 is addAVX2 plus a finiteness check riding on the same
// registers: r*0 + c is c for a finite result r and NaN otherwise, so c
// (four accumulators, one fused multiply-add per vector) stays 0 exactly
// when every result is finite.
func addFiniteAVX2(dst, x []float32) bool {
	n := len(dst)
	x = x[:n]
	zero := archsimd.BroadcastFloat32x8(0)
	c0, c1, c2, c3 := zero, zero, zero, zero
	i := 0
	for ; i+32 <= n; i += 32 {
		d, s := dst[i:i+32:i+32], x[i:i+32:i+32]
		a0 := archsimd.LoadFloat32x8Slice(d[0:]).Add(archsimd.LoadFloat32x8Slice(s[0:]))
		a1 := archsimd.LoadFloat32x8Slice(d[8:]).Add(archsimd.LoadFloat32x8Slice(s[8:]))
		a2 := archsimd.LoadFloat32x8Slice(d[16:]).Add(archsimd.LoadFloat32x8Slice(s[16:]))
		a3 := archsimd.LoadFloat32x8Slice(d[24:]).Add(archsimd.LoadFloat32x8Slice(s[24:]))
		a0.StoreSlice(d[0:])
		a1.StoreSlice(d[8:])
		a2.StoreSlice(d[16:])
		a3.StoreSlice(d[24:])
		c0, c1, c2, c3 = a0.MulAdd(zero, c0), a1.MulAdd(zero, c1), a2.MulAdd(zero, c2), a3.MulAdd(zero, c3)
	}
	for ; i+8 <= n; i += 8 {
		a0 := archsimd.LoadFloat32x8Slice(dst[i:]).Add(archsimd.LoadFloat32x8Slice(x[i:]))
		a0.StoreSlice(dst[i:])
		c0 = a0.MulAdd(zero, c0)
	}
	ok := c0.Add(c1).Add(c2.Add(c3)).IsNaN().ToBits() == 0
	archsimd.ClearAVXUpperBits()
	return addFiniteGeneric(dst[i:], x[i:]) && ok
}

// addScaledFiniteAVX2 is addScaledAVX2 with addFiniteAVX2's check.
func addScaledFiniteAVX2(dst []float32, a float32, x []float32) bool {
	n := len(dst)
	x = x[:n]
	va := archsimd.BroadcastFloat32x8(a)
	zero := archsimd.BroadcastFloat32x8(0)
	c0, c1, c2, c3 := zero, zero, zero, zero
	i := 0
	for ; i+32 <= n; i += 32 {
		d, s := dst[i:i+32:i+32], x[i:i+32:i+32]
		a0 := archsimd.LoadFloat32x8Slice(s[0:]).MulAdd(va, archsimd.LoadFloat32x8Slice(d[0:]))
		a1 := archsimd.LoadFloat32x8Slice(s[8:]).MulAdd(va, archsimd.LoadFloat32x8Slice(d[8:]))
		a2 := archsimd.LoadFloat32x8Slice(s[16:]).MulAdd(va, archsimd.LoadFloat32x8Slice(d[16:]))
		a3 := archsimd.LoadFloat32x8Slice(s[24:]).MulAdd(va, archsimd.LoadFloat32x8Slice(d[24:]))
		a0.StoreSlice(d[0:])
		a1.StoreSlice(d[8:])
		a2.StoreSlice(d[16:])
		a3.StoreSlice(d[24:])
		c0, c1, c2, c3 = a0.MulAdd(zero, c0), a1.MulAdd(zero, c1), a2.MulAdd(zero, c2), a3.MulAdd(zero, c3)
	}
	for ; i+8 <= n; i += 8 {
		a0 := archsimd.LoadFloat32x8Slice(x[i:]).MulAdd(va, archsimd.LoadFloat32x8Slice(dst[i:]))
		a0.StoreSlice(dst[i:])
		c0 = a0.MulAdd(zero, c0)
	}
	ok := c0.Add(c1).Add(c2.Add(c3)).IsNaN().ToBits() == 0
	archsimd.ClearAVXUpperBits()
	return addScaledFiniteGeneric(dst[i:], a, x[i:]) && ok
}

func scaleAVX2(dst []float32, a float32) {
	n := len(dst)
	va := archsimd.BroadcastFloat32x8(a)
	i := 0
	for ; i+32 <= n; i += 32 {
		d := dst[i : i+32 : i+32]
		a0 := archsimd.LoadFloat32x8Slice(d[0:]).Mul(va)
		a1 := archsimd.LoadFloat32x8Slice(d[8:]).Mul(va)
		a2 := archsimd.LoadFloat32x8Slice(d[16:]).Mul(va)
		a3 := archsimd.LoadFloat32x8Slice(d[24:]).Mul(va)
		a0.StoreSlice(d[0:])
		a1.StoreSlice(d[8:])
		a2.StoreSlice(d[16:])
		a3.StoreSlice(d[24:])
	}
	for ; i+8 <= n; i += 8 {
		archsimd.LoadFloat32x8Slice(dst[i:]).Mul(va).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	scaleGeneric(dst[i:], a)
}

// sumSquaresAVX2 widens each float32 to float64 before squaring (exact) and
// accumulates with FMA in four independent float64×4 accumulators, 32
// elements per iteration (eight accumulators would not fit the registers
// with their inputs, and the spills cost more than they win), blocked like
// sumSquaresGeneric: each block's accumulators are added into a running
// float64×4 total. The total's lanes are added once, at the end, after the
// upper AVX state is cleared: on some CPUs (this project's 2-core VM:
// ~150 ns) every switch from dirty AVX state to legacy SSE code is costly,
// and the former per-block scalar adds paid it once per 4096 elements.
func sumSquaresAVX2(x []float32) float64 {
	var total archsimd.Float64x4
	i := 0
	for i+32 <= len(x) {
		end := min(len(x), i+sumBlock) &^ 31
		var acc0, acc1, acc2, acc3 archsimd.Float64x4
		for ; i < end; i += 32 {
			s := x[i : i+32 : i+32]
			v0 := archsimd.LoadFloat32x4Slice(s[0:]).ConvertToFloat64()
			v1 := archsimd.LoadFloat32x4Slice(s[4:]).ConvertToFloat64()
			v2 := archsimd.LoadFloat32x4Slice(s[8:]).ConvertToFloat64()
			v3 := archsimd.LoadFloat32x4Slice(s[12:]).ConvertToFloat64()
			acc0 = v0.MulAdd(v0, acc0)
			acc1 = v1.MulAdd(v1, acc1)
			acc2 = v2.MulAdd(v2, acc2)
			acc3 = v3.MulAdd(v3, acc3)
			v4 := archsimd.LoadFloat32x4Slice(s[16:]).ConvertToFloat64()
			v5 := archsimd.LoadFloat32x4Slice(s[20:]).ConvertToFloat64()
			v6 := archsimd.LoadFloat32x4Slice(s[24:]).ConvertToFloat64()
			v7 := archsimd.LoadFloat32x4Slice(s[28:]).ConvertToFloat64()
			acc0 = v4.MulAdd(v4, acc0)
			acc1 = v5.MulAdd(v5, acc1)
			acc2 = v6.MulAdd(v6, acc2)
			acc3 = v7.MulAdd(v7, acc3)
		}
		total = total.Add(acc0.Add(acc1).Add(acc2.Add(acc3)))
	}
	var lanes [4]float64
	total.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + sumSquaresGeneric(x[i:])
}

// firstNonFiniteAVX2 checks blocks of 64 floats at a time: x*0 is 0 for a
// finite x and NaN for ±Inf or NaN, so one NaN test per block finds the
// block, and the plain loop finds the index inside it.
func firstNonFiniteAVX2(x []float32) int {
	n := len(x)
	zero := archsimd.BroadcastFloat32x8(0)
	i := 0
	for ; i+64 <= n; i += 64 {
		s := x[i : i+64 : i+64]
		a0 := archsimd.LoadFloat32x8Slice(s[0:]).Mul(zero).Add(archsimd.LoadFloat32x8Slice(s[8:]).Mul(zero))
		a1 := archsimd.LoadFloat32x8Slice(s[16:]).Mul(zero).Add(archsimd.LoadFloat32x8Slice(s[24:]).Mul(zero))
		a2 := archsimd.LoadFloat32x8Slice(s[32:]).Mul(zero).Add(archsimd.LoadFloat32x8Slice(s[40:]).Mul(zero))
		a3 := archsimd.LoadFloat32x8Slice(s[48:]).Mul(zero).Add(archsimd.LoadFloat32x8Slice(s[56:]).Mul(zero))
		if a0.Add(a1).Add(a2.Add(a3)).IsNaN().ToBits() != 0 {
			archsimd.ClearAVXUpperBits()
			return i + firstNonFiniteGeneric(s)
		}
	}
	archsimd.ClearAVXUpperBits()
	if j := firstNonFiniteGeneric(x[i:]); j >= 0 {
		return i + j
	}
	return -1
}

func addF64AVX2(dst, x []float64) {
	n := len(dst)
	x = x[:n]
	i := 0
	for ; i+16 <= n; i += 16 {
		d, s := dst[i:i+16:i+16], x[i:i+16:i+16]
		a0 := archsimd.LoadFloat64x4Slice(d[0:]).Add(archsimd.LoadFloat64x4Slice(s[0:]))
		a1 := archsimd.LoadFloat64x4Slice(d[4:]).Add(archsimd.LoadFloat64x4Slice(s[4:]))
		a2 := archsimd.LoadFloat64x4Slice(d[8:]).Add(archsimd.LoadFloat64x4Slice(s[8:]))
		a3 := archsimd.LoadFloat64x4Slice(d[12:]).Add(archsimd.LoadFloat64x4Slice(s[12:]))
		a0.StoreSlice(d[0:])
		a1.StoreSlice(d[4:])
		a2.StoreSlice(d[8:])
		a3.StoreSlice(d[12:])
	}
	archsimd.ClearAVXUpperBits()
	addF64Generic(dst[i:], x[i:])
}

// addBF16AVX2 widens 8 bfloat16s at a time: zero-extend to 32 bits and
// shift into the top half, which is exactly the float32 with that prefix.
func addBF16AVX2(dst []float32, x []uint16) {
	n := len(dst)
	x = x[:n]
	i := 0
	for ; i+16 <= n; i += 16 {
		d, s := dst[i:i+16:i+16], x[i:i+16:i+16]
		w0 := archsimd.LoadUint16x8Slice(s[0:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
		w1 := archsimd.LoadUint16x8Slice(s[8:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
		archsimd.LoadFloat32x8Slice(d[0:]).Add(w0).StoreSlice(d[0:])
		archsimd.LoadFloat32x8Slice(d[8:]).Add(w1).StoreSlice(d[8:])
	}
	archsimd.ClearAVXUpperBits()
	addBF16Generic(dst[i:], x[i:])
}
