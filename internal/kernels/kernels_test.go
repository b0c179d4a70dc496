package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// lengths covers every tail length of the unrolled loops several times over,
// plus a few large sizes.
func lengths() []int {
	var ls []int
	for n := 0; n <= 200; n++ {
		ls = append(ls, n)
	}
	return append(ls, 1000, 4093, 65536, 100_003)
}

// forEachPath runs f once per implementation this build and CPU can run.
func forEachPath(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := active
	defer func() { active = saved }()
	for _, p := range paths {
		active = p
		t.Run(p.name, f)
	}
}

func randFloats(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		// A wide range of magnitudes and signs, including subnormals.
		x[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-20)))
	}
	return x
}

// offsets yields sub-slices starting 0..3 elements into a longer buffer, so
// the SIMD paths see unaligned starts.
var offsets = []int{0, 1, 2, 3}

func TestAddMatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, n := range lengths() {
			for _, off := range offsets {
				dst := randFloats(r, n+off)[off:]
				x := randFloats(r, n+off+1)[off+1:]
				want := make([]float32, n)
				for i := range want {
					want[i] = dst[i] + x[i]
				}
				Add(dst, x)
				for i := range want {
					if dst[i] != want[i] {
						t.Fatalf("n=%d off=%d: dst[%d] = %v, want %v", n, off, i, dst[i], want[i])
					}
				}
			}
		}
	})
}

func TestAddScaledMatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, n := range lengths() {
			for _, off := range offsets {
				a := float32(r.NormFloat64())
				dst := randFloats(r, n+off)[off:]
				x := randFloats(r, n+off+2)[off+2:]
				want := make([]float64, n)
				scale := make([]float64, n)
				for i := range want {
					want[i] = float64(dst[i]) + float64(a)*float64(x[i])
					scale[i] = math.Abs(float64(dst[i])) + math.Abs(float64(a)*float64(x[i]))
				}
				AddScaled(dst, a, x)
				for i := range want {
					// Fused or not, the result is within one float32
					// rounding of each operation of the exact value.
					if d := math.Abs(float64(dst[i]) - want[i]); d > 0x1p-23*scale[i] {
						t.Fatalf("n=%d off=%d: dst[%d] = %v, want %v (|diff| %g)", n, off, i, dst[i], want[i], d)
					}
				}
			}
		}
	})
}

func TestAddScaledToMatchesAddScaled(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(31, 32))
		for _, n := range lengths() {
			for _, off := range offsets {
				a := float32(r.NormFloat64())
				y := randFloats(r, n+off)[off:]
				x := randFloats(r, n+off+3)[off+3:]
				want := append([]float32(nil), y...)
				AddScaled(want, a, x)
				dst := randFloats(r, n+off+1)[off+1:]
				AddScaledTo(dst, y, a, x)
				for i := range want {
					if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d off=%d: dst[%d] = %v, want %v (AddScaled's)", n, off, i, dst[i], want[i])
					}
				}
				// dst may be either input itself.
				x2 := append([]float32(nil), x...)
				AddScaledTo(y, y, a, x)
				AddScaledTo(x2, want, 1, x2)
				for i := range want {
					if y[i] != want[i] {
						t.Fatalf("n=%d off=%d, dst = y: dst[%d] = %v, want %v", n, off, i, y[i], want[i])
					}
					if w := want[i] + x[i]; x2[i] != w {
						t.Fatalf("n=%d off=%d, dst = x: dst[%d] = %v, want %v", n, off, i, x2[i], w)
					}
				}
			}
		}
	})
}

// TestAddFiniteMatchesAdd checks AddFinite and AddScaledFinite compute what
// Add and AddScaled do and report a non-finite result wherever it is: a
// NaN or ±Inf in either input at any position (every tail included), or
// an overflow of finite inputs.
func TestAddFiniteMatchesAdd(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(33, 34))
		for _, n := range lengths() {
			for _, off := range offsets {
				a := float32(r.NormFloat64())
				base := randFloats(r, n+off)[off:]
				x := randFloats(r, n+off+1)[off+1:]
				want, wantS := append([]float32(nil), base...), append([]float32(nil), base...)
				Add(want, x)
				AddScaled(wantS, a, x)
				dst, dstS := append([]float32(nil), base...), append([]float32(nil), base...)
				if !AddFinite(dst, x) {
					t.Fatalf("n=%d off=%d: AddFinite of finite inputs reported non-finite", n, off)
				}
				if !AddScaledFinite(dstS, a, x) {
					t.Fatalf("n=%d off=%d: AddScaledFinite of finite inputs reported non-finite", n, off)
				}
				for i := range want {
					if math.Float32bits(dst[i]) != math.Float32bits(want[i]) || math.Float32bits(dstS[i]) != math.Float32bits(wantS[i]) {
						t.Fatalf("n=%d off=%d: [%d] = %v, %v, want %v, %v", n, off, i, dst[i], dstS[i], want[i], wantS[i])
					}
				}
				if n == 0 {
					continue
				}
				k := r.IntN(n)
				for _, c := range []struct {
					name   string
					d, x   float32
					scaled bool
				}{
					{"Inf in x", 1, inf, false}, {"NaN in x", 1, nan, false}, {"-Inf in dst", -inf, 1, false},
					{"NaN in dst", nan, 1, true}, {"overflow", 3e38, 3e38, false}, {"scaled overflow", 3e38, 3e38, true},
				} {
					d, xx := append([]float32(nil), base...), append([]float32(nil), x...)
					d[k], xx[k] = c.d, c.x
					var got bool
					if c.scaled {
						got = AddScaledFinite(d, 2, xx)
					} else {
						got = AddFinite(d, xx)
					}
					if got {
						t.Fatalf("n=%d off=%d: %s at %d reported finite", n, off, c.name, k)
					}
				}
			}
		}
	})
}

func TestScaleMatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, n := range lengths() {
			for _, off := range offsets {
				a := float32(r.NormFloat64())
				dst := randFloats(r, n+off)[off:]
				want := make([]float32, n)
				for i := range want {
					want[i] = dst[i] * a
				}
				Scale(dst, a)
				for i := range want {
					if dst[i] != want[i] {
						t.Fatalf("n=%d off=%d: dst[%d] = %v, want %v", n, off, i, dst[i], want[i])
					}
				}
			}
		}
	})
}

func TestSumSquaresMatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, n := range lengths() {
			for _, off := range offsets {
				x := randFloats(r, n+off)[off:]
				var want float64
				for _, v := range x {
					want += float64(v) * float64(v)
				}
				got := SumSquares(x)
				if math.Abs(got-want) > 1e-13*want {
					t.Fatalf("n=%d off=%d: SumSquares = %v, want %v", n, off, got, want)
				}
			}
		}
		if got := SumSquares([]float32{1, float32(math.Inf(-1))}); !math.IsInf(got, 1) {
			t.Errorf("SumSquares with -Inf = %v, want +Inf", got)
		}
		if got := SumSquares(append(make([]float32, 100), float32(math.NaN()))); !math.IsNaN(got) {
			t.Errorf("SumSquares with NaN = %v, want NaN", got)
		}
	})
}

// TestSumSquaresAccurateAt25M checks the global-norm use case: 25M elements
// of 0.1 must sum to n·0.1² with float64-level accuracy. A float32
// accumulator would be off by percents here.
func TestSumSquaresAccurateAt25M(t *testing.T) {
	const n = 25_000_000
	x := make([]float32, n)
	v := float32(0.1)
	for i := range x {
		x[i] = v
	}
	want := float64(n) * float64(v) * float64(v)
	forEachPath(t, func(t *testing.T) {
		got := SumSquares(x)
		rel := math.Abs(got-want) / want
		t.Logf("relative error %.3g", rel)
		if rel > 1e-12 {
			t.Fatalf("SumSquares(25M × 0.1) = %.17g, want %.17g (relative error %g)", got, want, rel)
		}
	})
}

func TestFirstNonFinite(t *testing.T) {
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 10))
		for _, n := range lengths() {
			for _, off := range offsets {
				x := randFloats(r, n+off)[off:]
				// Large finite values must not trip the scan.
				if n > 0 {
					x[r.IntN(n)] = math.MaxFloat32
					x[r.IntN(n)] = -math.MaxFloat32
					x[r.IntN(n)] = math.SmallestNonzeroFloat32
				}
				if got := FirstNonFinite(x); got != -1 {
					t.Fatalf("n=%d off=%d: FirstNonFinite(finite) = %d", n, off, got)
				}
				if HasNonFinite(x) {
					t.Fatalf("n=%d off=%d: HasNonFinite(finite) = true", n, off)
				}
				if n == 0 {
					continue
				}
				first := r.IntN(n)
				x[first] = specials[r.IntN(3)]
				if later := first + r.IntN(n-first); later > first {
					x[later] = specials[r.IntN(3)]
				}
				if got := FirstNonFinite(x); got != first {
					t.Fatalf("n=%d off=%d: FirstNonFinite = %d, want %d (value %v)", n, off, got, first, x[first])
				}
				if !HasNonFinite(x) {
					t.Fatalf("n=%d off=%d: HasNonFinite = false with %v at %d", n, off, x[first], first)
				}
			}
		}
	})
}

// TestFirstNonFiniteBlocks puts one NaN/Inf at every position around the
// SIMD scan's block and vector boundaries of a buffer several blocks long
// (and subnormals, ±MaxFloat32 and -0 elsewhere, which must not trip it),
// and checks the index against the plain loop's on every path.
func TestFirstNonFiniteBlocks(t *testing.T) {
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00000)} // a signalling NaN, a negative quiet NaN
	const n = 3*4096 + 200
	var positions []int
	for _, b := range []int{0, 64, 4096, 2 * 4096, 3 * 4096} {
		for d := -9; d <= 9; d++ {
			if p := b + d; p >= 0 && p < n {
				positions = append(positions, p)
			}
		}
	}
	positions = append(positions, n-1, n-63, n-64, n-65)
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, off := range offsets {
			x := randFloats(r, n+off)[off:]
			x[5], x[4100], x[n-2] = math.MaxFloat32, -math.MaxFloat32, float32(math.Copysign(0, -1))
			x[8000] = math.SmallestNonzeroFloat32
			for _, p := range positions {
				for _, v := range specials {
					saved := x[p]
					x[p] = v
					if got, want := FirstNonFinite(x), firstNonFiniteGeneric(x); got != want || want != p {
						t.Fatalf("off=%d: %v at %d: FirstNonFinite = %d, plain loop %d", off, v, p, got, want)
					}
					// A later second one does not move the answer.
					if q := p + 1 + r.IntN(n-p); q < n {
						s2 := x[q]
						x[q] = specials[r.IntN(len(specials))]
						if got := FirstNonFinite(x); got != p {
							t.Fatalf("off=%d: first at %d, another at %d: FirstNonFinite = %d", off, p, q, got)
						}
						x[q] = s2
					}
					x[p] = saved
				}
			}
			if got := FirstNonFinite(x); got != -1 {
				t.Fatalf("off=%d: finite buffer: FirstNonFinite = %d", off, got)
			}
		}
	})
}

func TestAddF64MatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, n := range lengths() {
			for _, off := range offsets {
				dst := make([]float64, n+off)[off:]
				x := make([]float64, n+off+1)[off+1:]
				want := make([]float64, n)
				for i := range want {
					dst[i], x[i] = r.NormFloat64(), r.NormFloat64()*1e10
					want[i] = dst[i] + x[i]
				}
				AddF64(dst, x)
				for i := range want {
					if dst[i] != want[i] {
						t.Fatalf("n=%d off=%d: dst[%d] = %v, want %v", n, off, i, dst[i], want[i])
					}
				}
			}
		}
	})
	x := []float64{0, 1, math.Inf(1), math.NaN()}
	if got := FirstNonFiniteF64(x[:2]); got != -1 {
		t.Errorf("FirstNonFiniteF64(finite) = %d", got)
	}
	if got := FirstNonFiniteF64(x); got != 2 {
		t.Errorf("FirstNonFiniteF64 = %d, want 2", got)
	}
}

func TestConversions(t *testing.T) {
	f16 := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0}, {0x3c00, 1}, {0xc000, -2}, {0x3555, 0.333251953125},
		{0x7bff, 65504}, {0x0001, 0x1p-24}, {0x03ff, 0x3ffp-24}, {0x0400, 0x1p-14},
		{0x7c00, float32(math.Inf(1))}, {0xfc00, float32(math.Inf(-1))},
	}
	for _, tt := range f16 {
		if got := F16ToFloat32(tt.h); got != tt.want {
			t.Errorf("F16ToFloat32(%#04x) = %v, want %v", tt.h, got, tt.want)
		}
	}
	if got := F16ToFloat32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("F16ToFloat32(0x7e00) = %v, want NaN", got)
	}
	if got := math.Float32bits(F16ToFloat32(0x8000)); got != 0x80000000 {
		t.Errorf("F16ToFloat32(-0) bits = %#x", got)
	}
	bf := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {float32(math.Inf(1)), 0x7f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie → even
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie → even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above tie
	}
	for _, tt := range bf {
		if got := Float32ToBF16(tt.f); got != tt.want {
			t.Errorf("Float32ToBF16(%v) = %#04x, want %#04x", tt.f, got, tt.want)
		}
	}
	if got := Float32ToBF16(math.Float32frombits(0x7f800001)); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("Float32ToBF16(NaN with low payload) = %#04x, not a NaN", got)
	}
	for h := range 1 << 16 {
		if got := BF16ToFloat32(uint16(h)); math.Float32bits(got) != uint32(h)<<16 {
			t.Fatalf("BF16ToFloat32(%#04x) bits = %#x", h, math.Float32bits(got))
		}
	}
}

func halfBytes(hs []uint16, off int) []byte {
	b := make([]byte, 2*len(hs)+off)[off:]
	for i, h := range hs {
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
	return b
}

func TestAddHalfMatchesNaive(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(13, 14))
		for _, n := range lengths() {
			// Byte offset 1 forces the unaligned element-by-element path.
			for _, off := range []int{0, 1, 2} {
				hs := make([]uint16, n)
				for i := range hs {
					hs[i] = uint16(r.Uint32())
					for hs[i]&0x7c00 == 0x7c00 || hs[i]&0x7f80 == 0x7f80 {
						hs[i] = uint16(r.Uint32()) // finite in both formats
					}
				}
				x := halfBytes(hs, off)
				base := randFloats(r, n)
				dst := append([]float32(nil), base...)
				AddBF16(dst, x)
				for i := range dst {
					if want := base[i] + BF16ToFloat32(hs[i]); dst[i] != want {
						t.Fatalf("AddBF16 n=%d off=%d: dst[%d] = %v, want %v", n, off, i, dst[i], want)
					}
				}
				dst = append(dst[:0], base...)
				AddF16(dst, x)
				for i := range dst {
					if want := base[i] + f16ToFloat32Slow(hs[i]); dst[i] != want {
						t.Fatalf("AddF16 n=%d off=%d: dst[%d] = %v, want %v", n, off, i, dst[i], want)
					}
				}
				if got := FirstNonFiniteBF16(x); got != -1 {
					t.Fatalf("FirstNonFiniteBF16(finite) = %d", got)
				}
				if got := FirstNonFiniteF16(x); got != -1 {
					t.Fatalf("FirstNonFiniteF16(finite) = %d", got)
				}
				if n > 0 {
					k := r.IntN(n)
					hs[k] = 0xff80 // -Inf in BF16
					if got := FirstNonFiniteBF16(halfBytes(hs, off)); got != k {
						t.Fatalf("FirstNonFiniteBF16 = %d, want %d", got, k)
					}
					hs[k] = 0x7e00 // NaN in F16
					if got := FirstNonFiniteF16(halfBytes(hs, off)); got != k {
						t.Fatalf("FirstNonFiniteF16 = %d, want %d", got, k)
					}
				}
			}
		}
	})
}

func TestKernelsDoNotAllocate(t *testing.T) {
	const n = 1037
	dst, x := make([]float32, n), make([]float32, n)
	d64, x64 := make([]float64, n), make([]float64, n)
	h := make([]byte, 2*n+1)
	forEachPath(t, func(t *testing.T) {
		for name, f := range map[string]func(){
			"Add":                func() { Add(dst, x) },
			"AddScaled":          func() { AddScaled(dst, 0.5, x) },
			"AddScaledTo":        func() { AddScaledTo(dst, dst, 0.5, x) },
			"AddFinite":          func() { _ = AddFinite(dst, x) },
			"AddScaledFinite":    func() { _ = AddScaledFinite(dst, 0.5, x) },
			"Scale":              func() { Scale(dst, 0.5) },
			"SumSquares":         func() { _ = SumSquares(x) },
			"FirstNonFinite":     func() { _ = FirstNonFinite(x) },
			"AddF64":             func() { AddF64(d64, x64) },
			"AddBF16":            func() { AddBF16(dst, h[:2*n]) },
			"AddBF16/unaligned":  func() { AddBF16(dst, h[1:]) },
			"AddF16":             func() { AddF16(dst, h[:2*n]) },
			"FirstNonFiniteBF16": func() { _ = FirstNonFiniteBF16(h[:2*n]) },
		} {
			if a := testing.AllocsPerRun(10, f); a != 0 {
				t.Errorf("%s allocates %v times per call", name, a)
			}
		}
	})
}

func TestLengthMismatchPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Add":             func() { Add(make([]float32, 3), make([]float32, 4)) },
		"AddScaled":       func() { AddScaled(make([]float32, 4), 1, make([]float32, 3)) },
		"AddScaledTo/y":   func() { AddScaledTo(make([]float32, 4), make([]float32, 3), 1, make([]float32, 4)) },
		"AddScaledTo/x":   func() { AddScaledTo(make([]float32, 4), make([]float32, 4), 1, make([]float32, 5)) },
		"AddFinite":       func() { AddFinite(make([]float32, 3), make([]float32, 4)) },
		"AddScaledFinite": func() { AddScaledFinite(make([]float32, 4), 1, make([]float32, 3)) },
		"AddF64":          func() { AddF64(make([]float64, 1), nil) },
		"AddBF16":         func() { AddBF16(make([]float32, 2), make([]byte, 3)) },
		"AddF16":          func() { AddF16(make([]float32, 2), make([]byte, 5)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with mismatched lengths did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestPathReported(t *testing.T) {
	if Path() != paths[len(paths)-1].name {
		t.Fatalf("Path() = %q, but the best available path is %q", Path(), paths[len(paths)-1].name)
	}
	t.Logf("kernels path: %s", Path())
}
