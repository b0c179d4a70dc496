package kernels

import (
	"math"
	"unsafe"
)

// Half-precision inputs arrive as little-endian bytes (a tensor's Data).
// They are read as []uint16 in place when 2-byte aligned (the usual case:
// safetensors aligns every tensor to its element size) and element by
// element otherwise, so no byte is copied either way.

// BF16ToFloat32 widens one bfloat16 (the top half of a float32) exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even, keeping NaN
// a (quiet) NaN.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep sign, force a quiet payload
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// f16Table maps every IEEE half to its exact float32 value (256 KiB, built
// once at init; half→single conversion is exact, so a table is the simplest
// correct and fast path without F16C intrinsics).
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16ToFloat32Slow(uint16(i))
	}
	return &t
}()

// F16ToFloat32 widens one IEEE 754 half exactly.
func F16ToFloat32(h uint16) float32 { return f16Table[h] }

func f16ToFloat32Slow(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = mant × 2^-24
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// halves views b as little-endian uint16s without copying when b is 2-byte
// aligned; ok is false otherwise.
func halves(b []byte) (h []uint16, ok bool) {
	if len(b) == 0 {
		return nil, true
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2), true
}

func checkHalf(op string, dst []float32, x []byte) {
	if len(x) != 2*len(dst) {
		panic("kernels." + op + ": len(x) must be 2*len(dst) bytes")
	}
}

// AddBF16 sets dst[i] += bf16(x[2i:2i+2]), x being little-endian bfloat16
// bytes. It panics unless len(x) == 2*len(dst).
func AddBF16(dst []float32, x []byte) {
	checkHalf("AddBF16", dst, x)
	if h, ok := halves(x); ok {
		active.addBF16(dst, h)
		return
	}
	for i := range dst {
		dst[i] += BF16ToFloat32(uint16(x[2*i]) | uint16(x[2*i+1])<<8)
	}
}

// AddF16 sets dst[i] += f16(x[2i:2i+2]), x being little-endian IEEE half
// bytes. It panics unless len(x) == 2*len(dst).
func AddF16(dst []float32, x []byte) {
	checkHalf("AddF16", dst, x)
	if h, ok := halves(x); ok {
		h = h[:len(dst)]
		for i := range dst {
			dst[i] += f16Table[h[i]]
		}
		return
	}
	for i := range dst {
		dst[i] += f16Table[uint16(x[2*i])|uint16(x[2*i+1])<<8]
	}
}

// FirstNonFiniteBF16 returns the index of the first NaN or ±Inf among the
// little-endian bfloat16 values in x (len(x) must be even), or -1.
func FirstNonFiniteBF16(x []byte) int { return firstHalfExpAllOnes(x, 0x7f80) }

// FirstNonFiniteF16 returns the index of the first NaN or ±Inf among the
// little-endian IEEE half values in x (len(x) must be even), or -1.
func FirstNonFiniteF16(x []byte) int { return firstHalfExpAllOnes(x, 0x7c00) }

// firstHalfExpAllOnes finds the first 16-bit value whose exponent bits
// (expMask) are all set: that is exactly Inf or NaN in both formats.
func firstHalfExpAllOnes(x []byte, expMask uint16) int {
	if len(x)%2 != 0 {
		panic("kernels: odd number of half-precision bytes")
	}
	for i := 0; i+1 < len(x); i += 2 {
		if (uint16(x[i])|uint16(x[i+1])<<8)&expMask == expMask {
			return i / 2
		}
	}
	return -1
}
