package reducer

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkDurableSteps: gradients applied per second by the primary over
// a file-backed store (each version fsynced, as `rlhub serve --data`
// does), with and without the durable step state (journal record and
// Adam's optimizer state written and fsynced before each version), in one
// run. One gradient per step, Adam.
//
//	go test -run '^$' -bench BenchmarkDurableSteps -benchtime 100x ./internal/reducer/
func BenchmarkDurableSteps(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		for _, durable := range []bool{false, true} {
			b.Run(fmt.Sprintf("floats=%d/durable=%v", n, durable), func(b *testing.B) {
				dir := b.TempDir()
				logger := testkit.Logger()
				st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(dir, "store"), Logger: logger})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
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
				defer p.Close()
				ctx := context.Background()
				if _, _, err := p.Register(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.Adam, LR: 1e-3}}); err != nil {
					b.Fatal(err)
				}
				sess, _, _ := p.Attach(ctx, Secondary{ID: "b"})
				grad, _ := tensor.NewStateDict(tensor.NewF32("w", int64(n)))
				g, _ := grad.Get("w").Float32s()
				for i := range g {
					g[i] = 1e-3 * float32(i%7)
				}
				sum := grad.Clone()
				b.SetBytes(int64(4 * n))
				b.ResetTimer()
				for i := range b.N {
					id := reduce.ID{Client: "b", Seq: uint64(i + 1)}
					if _, _, err := p.Admit(ctx, sess, "m", id, 0); err != nil {
						b.Fatal(err)
					}
					copy(mustF32(sum), g)
					if _, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: sum, SumFinite: true}); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grads/s")
			})
		}
	}
}

func mustF32(sd *tensor.StateDict) []float32 {
	f, err := sd.Get("w").Float32s()
	if err != nil {
		panic(err)
	}
	return f
}
