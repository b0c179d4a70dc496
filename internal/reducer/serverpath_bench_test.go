package reducer

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkServerPath is the reducer's own per-gradient work without the
// transport: a gradient's safetensors bytes are fed to an in-process
// secondary's Push in 16 KiB pieces (as gRPC's frame buffers hand them
// over), then reduced, forwarded to the in-process primary, stepped (plain
// SGD) and published to an in-memory store; one push at a time, each
// batch (1 gradient, or 2 as in the learner loop of
// scripts/bench_learner_loop.py) waiting for its version. It isolates what this package controls from
// gRPC and the kernel, so its CPU time per gradient (cpu_ms/grad) is the
// figure to compare between builds on a loaded machine.
func BenchmarkServerPath(b *testing.B) {
	for _, n := range []int{1 << 20, 25 << 20} {
		for _, clip := range []float64{0, 1e9} {
			for _, batch := range []int{1, 2} {
				b.Run(fmt.Sprintf("params=%dM/clip=%v/batch=%d", n>>20, clip > 0, batch), func(b *testing.B) { benchServerPath(b, n, clip, batch) })
			}
		}
	}
}

func benchServerPath(b *testing.B, n int, clip float64, batch int) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	model := testLayout(n / 4)
	pushModel(b, st, "m", model)
	applied := make(chan struct{}, 1)
	quiet := testkit.Logger()
	p, err := NewPrimary(PrimaryConfig{Store: st, Logger: quiet, OnApply: func(string, uint64, []reduce.ID, []float32) { applied <- struct{}{} }})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, _, err := p.Register(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 1e-6}, GradientMax: clip, CheckpointEvery: 1 << 40}); err != nil {
		b.Fatal(err)
	}
	s, err := NewSecondary(SecondaryConfig{ID: "s", Upstream: p, BatchSize: batch, MaxWait: time.Minute, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for !s.Attached() {
		time.Sleep(time.Millisecond)
	}
	g := gradFor(n/4, "c", 1)
	blob, _ := safetensors.Encode(g, nil)
	const piece = 16 << 10
	b.SetBytes(int64(len(blob) * batch))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, _ := ProcessUsage()
	for i := range b.N {
		for j := range batch {
			off := 0
			recv := func(write func([]byte) error) error {
				if off == len(blob) {
					return io.EOF
				}
				k := min(piece, len(blob)-off)
				err := write(blob[off : off+k])
				off += k
				return err
			}
			id := reduce.ID{Client: "c", Seq: uint64(i*batch + j + 1)}
			if _, err := s.Push(ctx, PushHeader{Model: "m", ID: id, TotalBytes: uint64(len(blob))}, chunks(recv)); err != nil {
				b.Fatal(err)
			}
		}
		<-applied
	}
	b.StopTimer()
	cpu, _ := ProcessUsage()
	b.ReportMetric(float64((cpu-cpu0).Microseconds())/1000/float64(b.N*batch), "cpu_ms/grad")
}

// ProcessUsage is this process's CPU time so far (user + system, every
// thread: clients, hubs and the runtime, all of it the push path's work in
// these benchmarks; per gradient it stays comparable when other processes
// load the machine, unlike the wall clock) and its minor page faults
// (touching memory the OS had not mapped yet, e.g. heap pages the Go
// runtime returned to it and allocates again). Exported for the external
// benchmarks of package reducer_test.
func ProcessUsage() (cpu time.Duration, minorFaults int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Minflt
}
