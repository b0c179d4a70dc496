package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/benchclock"
	"github.com/rlhub/rlhub/internal/kernels/cref"
)

// Benchmarks sweep 1, 16 and 256 MiB of float32 destination. The machine is
// shared and its load changes by the second, so every iteration runs the
// baseline(s) and the kernel back to back on the same buffers and times
// each separately, on the wall clock and on the thread's CPU clock (package
// benchclock): the ratios compare measurements taken microseconds apart, and
// the CPU-clock ratios are not skewed by the thread losing its core. Each
// sub-benchmark reports
//
//	GB/s         the kernel's memory traffic (bytes read + written) per
//	             wall-clock second
//	copyGB/s     the same for copy(dst, x) (Go's memmove), interleaved
//	x_copy       GB/s over copyGB/s; x_copy_cpu the same ratio in CPU time
//	CGB/s, x_C   (float32 add only) the C -O3 loop (package cref),
//	             interleaved, and the kernel's GB/s over it; x_C_cpu likewise
//
// ns/op is the wall time of the whole iteration (baselines included); Go's
// MB/s column is therefore not the kernel's speed: read GB/s.
//
//	GOEXPERIMENT=simd go test -run '^$' -bench BenchmarkKernels ./internal/kernels/

var benchSizes = []struct {
	name  string
	bytes int
}{{"1MiB", 1 << 20}, {"16MiB", 16 << 20}, {"256MiB", 256 << 20}}

func filled(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, seed))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func BenchmarkKernels(b *testing.B) {
	for _, sz := range benchSizes {
		n := sz.bytes / 4
		// Touch every page before timing: first-touch faults are not kernel work.
		dst, x := filled(n, 1), filled(n, 2)
		d64, x64 := make([]float64, n/2), make([]float64, n/2)
		half := make([]byte, 2*n)
		for i := range half {
			half[i] = byte(i*7) & 0x3f // finite in BF16 and F16
		}
		run := func(name string, traffic int, withC bool, f func()) {
			b.Run(fmt.Sprintf("size=%s/%s", sz.name, name), func(b *testing.B) {
				b.ReportAllocs()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var tCopy, tC, tK benchclock.Span
				for b.Loop() {
					t0 := benchclock.Now()
					copy(dst, x)
					t1 := benchclock.Now()
					f()
					t2 := benchclock.Now()
					tCopy.Add(t1.Sub(t0))
					tK.Add(t2.Sub(t1))
					if withC {
						cref.Add(dst, x)
						tC.Add(benchclock.Now().Sub(t2))
					}
				}
				per := func(bytes int, d time.Duration) float64 {
					return float64(bytes) * float64(b.N) / d.Seconds() / 1e9
				}
				g, gc := per(traffic, tK.Wall), per(2*sz.bytes, tCopy.Wall)
				b.ReportMetric(g, "GB/s")
				b.ReportMetric(gc, "copyGB/s")
				b.ReportMetric(g/gc, "x_copy")
				if benchclock.HasCPU() {
					b.ReportMetric(per(traffic, tK.CPU)/per(2*sz.bytes, tCopy.CPU), "x_copy_cpu")
				}
				if withC && cref.Available {
					c := per(3*sz.bytes, tC.Wall)
					b.ReportMetric(c, "CGB/s")
					b.ReportMetric(g/c, "x_C")
					if benchclock.HasCPU() {
						b.ReportMetric(per(traffic, tK.CPU)/per(3*sz.bytes, tC.CPU), "x_C_cpu")
					}
				}
			})
		}
		run("Add", 3*sz.bytes, cref.Available, func() { Add(dst, x) })
		run("Add-generic", 3*sz.bytes, cref.Available, func() { addGeneric(dst, x) })
		run("AddScaled", 3*sz.bytes, false, func() { AddScaled(dst, 1e-3, x) })
		run("Scale", 2*sz.bytes, false, func() { Scale(dst, 0.999) })
		run("SumSquares", sz.bytes, false, func() { _ = SumSquares(x) })
		run("FirstNonFinite", sz.bytes, false, func() { _ = FirstNonFinite(x) })
		run("AddF64", 3*sz.bytes, false, func() { AddF64(d64, x64) })
		run("AddBF16", 2*sz.bytes+sz.bytes/2, false, func() { AddBF16(dst, half) })
		run("AddF16", 2*sz.bytes+sz.bytes/2, false, func() { AddF16(dst, half) })
	}
}
