package reducer

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkDurableSteps: gradients applied per second by the primary over
// a file-backed store (each version fsynced, as `rlhub serve --data`
// does), with the durable step state (journal record and Adam's
// optimizer state written and fsynced before each version) and without
// it, in one run: b.N steps of each, in turns of a tenth. One gradient
// per step, Adam.
//
//	go test -run '^$' -bench BenchmarkDurableSteps -benchtime 300x ./internal/reducer/
func BenchmarkDurableSteps(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("floats=%d", n), func(b *testing.B) {
			durable, volatile := newDurableBench(b, n, true), newDurableBench(b, n, false)
			b.SetBytes(int64(4 * n))
			b.ResetTimer()
			turn := max(b.N/10, 1)
			for done := 0; done < b.N; done += turn {
				k := min(turn, b.N-done)
				durable.steps(b, k)
				volatile.steps(b, k)
			}
			b.StopTimer()
			d, v := float64(durable.n)/durable.took.Seconds(), float64(volatile.n)/volatile.took.Seconds()
			b.ReportMetric(d, "grads/s")
			b.ReportMetric(v, "grads/s_volatile")
			b.ReportMetric(d/v, "x_volatile")
		})
	}
}

// durableBench is one primary of BenchmarkDurableSteps, over a store of
// its own.
type durableBench struct {
	p    *Primary
	sess uint64
	sum  *tensor.StateDict
	grad []float32
	n    int           // steps taken
	took time.Duration // in them
}

func newDurableBench(b *testing.B, n int, durable bool) *durableBench {
	dir := b.TempDir()
	logger := testkit.Logger()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(dir, "store"), Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	init, _ := tensor.NewStateDict(tensor.NewF32("w", int64(n)))
	pushModel(b, st, "m", init)
	cfg := PrimaryConfig{Store: st, Logger: logger}
	if durable {
		cfg.StateDir = filepath.Join(dir, "reducer")
	}
	p, err := NewPrimary(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	ctx := context.Background()
	if _, _, err := p.Register(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.Adam, LR: 1e-3}}); err != nil {
		b.Fatal(err)
	}
	sess, _, err := p.Attach(ctx, Secondary{ID: "b"})
	if err != nil {
		b.Fatal(err)
	}
	grad, _ := tensor.NewStateDict(tensor.NewF32("w", int64(n)))
	g := mustF32(grad)
	for i := range g {
		g[i] = 1e-3 * float32(i%7)
	}
	return &durableBench{p: p, sess: sess, sum: grad.Clone(), grad: g}
}

// steps takes k steps, timed.
func (d *durableBench) steps(b *testing.B, k int) {
	ctx := context.Background()
	start := time.Now()
	for range k {
		d.n++
		id := reduce.ID{Client: "b", Seq: uint64(d.n)}
		if _, _, err := d.p.Admit(ctx, d.sess, "m", id, 0, 0); err != nil {
			b.Fatal(err)
		}
		copy(mustF32(d.sum), d.grad)
		if _, err := d.p.Forward(ctx, Batch{Session: d.sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: d.sum, SumFinite: true}); err != nil {
			b.Fatal(err)
		}
	}
	d.took += time.Since(start)
}

func mustF32(sd *tensor.StateDict) []float32 {
	f, err := sd.Get("w").Float32s()
	if err != nil {
		panic(err)
	}
	return f
}
