package env

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time. Under -cpu 1 the
// benchmark loop is the only busy thread, so steps per CPU-second is the
// per-core rate, far less disturbed by other processes' load than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStep measures single-goroutine env steps per second (wall and
// CPU time) for each environment: random valid actions from a fixed table, Reset whenever an
// episode ends (its cost is included, as in a rollout).
//
//	GOEXPERIMENT=simd go test -run '^$' -bench Step -benchtime 2s -cpu 1 ./internal/env
func BenchmarkStep(b *testing.B) {
	for _, n := range builtinNames() {
		b.Run(n, func(b *testing.B) {
			e, err := Make(n)
			if err != nil {
				b.Fatal(err)
			}
			sp := e.Spec()
			rng := newRNG(1)
			const nActs = 1024
			dim := max(sp.ActDim, 1)
			acts := make([]float64, nActs*dim)
			for i := range acts {
				if sp.Discrete > 0 {
					acts[i] = float64(rng.IntN(sp.Discrete))
				} else {
					j := i % dim
					acts[i] = sp.ActLow[j] + (sp.ActHigh[j]-sp.ActLow[j])*rng.Float64()
					if sp.ActHigh[j] > 100 { // LQR's nominal bounds: use unit-scale actions
						acts[i] = rng.NormFloat64()
					}
				}
			}
			e.Reset(rng)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; b.Loop(); i++ {
				k := (i % nActs) * dim
				_, _, term, trunc := e.Step(acts[k : k+dim])
				if term || trunc {
					e.Reset(rng)
				}
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
			if cpu > 0 {
				b.ReportMetric(float64(b.N)/cpu.Seconds(), "steps/cpu-s")
			}
		})
	}
}
