package kernels

import "math"

// The plain loops: the fallback on every platform, the tail handlers of the
// SIMD paths, and the reference the tests compare against.

func addGeneric(dst, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += x[i]
	}
}

func addScaledGeneric(dst []float32, a float32, x []float32) { addScaledToGeneric(dst, dst, a, x) }

func addScaledToGeneric(dst, y []float32, a float32, x []float32) {
	y, x = y[:len(dst)], x[:len(dst)]
	for i := range dst {
		dst[i] = y[i] + a*x[i]
	}
}

// finite32 reports whether v is neither NaN nor ±Inf (its exponent bits
// are not all ones).
func finite32(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

func addFiniteGeneric(dst, x []float32) bool {
	x = x[:len(dst)]
	ok := true
	for i := range dst {
		dst[i] += x[i]
		ok = ok && finite32(dst[i])
	}
	return ok
}

func addScaledFiniteGeneric(dst []float32, a float32, x []float32) bool {
	x = x[:len(dst)]
	ok := true
	for i := range dst {
		dst[i] += a * x[i]
		ok = ok && finite32(dst[i])
	}
	return ok
}

func scaleGeneric(dst []float32, a float32) {
	for i := range dst {
		dst[i] *= a
	}
}

// sumBlock is the number of elements summed into fresh float64 accumulators
// before they are added to the running total. Blocking bounds the rounding
// error to about (sumBlock/lanes + n/sumBlock)·ε instead of (n/lanes)·ε: a
// relative error near 1e-13 rather than 1e-10 at 25M elements.
const sumBlock = 4096

func sumSquaresGeneric(x []float32) float64 {
	var total float64
	for len(x) > 0 {
		b := x[:min(len(x), sumBlock)]
		x = x[len(b):]
		// Four accumulators break the add dependency chain.
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= len(b); i += 4 {
			v0, v1, v2, v3 := float64(b[i]), float64(b[i+1]), float64(b[i+2]), float64(b[i+3])
			s0 += v0 * v0
			s1 += v1 * v1
			s2 += v2 * v2
			s3 += v3 * v3
		}
		for ; i < len(b); i++ {
			v := float64(b[i])
			s0 += v * v
		}
		total += (s0 + s1) + (s2 + s3)
	}
	return total
}

func firstNonFiniteGeneric(x []float32) int {
	for i, v := range x {
		if !finite32(v) {
			return i
		}
	}
	return -1
}

func addF64Generic(dst, x []float64) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += x[i]
	}
}

func addBF16Generic(dst []float32, x []uint16) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += math.Float32frombits(uint32(x[i]) << 16)
	}
}
