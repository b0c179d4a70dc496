package optim

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rlhub/rlhub/internal/tensor"
)

// BenchmarkStepTo times one optimizer step of a 1M-parameter tensor into
// another buffer (as the reducer's primary steps), per kind.
//
//	GOEXPERIMENT=simd go test -run '^$' -bench StepTo ./internal/optim/
func BenchmarkStepTo(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	mk := func() *tensor.StateDict {
		tn := tensor.NewF32("w", n)
		f, _ := tn.Float32s()
		for i := range f {
			f[i] = float32(r.NormFloat64())
		}
		sd, _ := tensor.NewStateDict(tn)
		return sd
	}
	p, g, dst := mk(), mk(), mk()
	for _, cfg := range []Config{{Kind: SGD, LR: 1e-3}, {Kind: SGD, LR: 1e-3, WeightDecay: 1e-4},
		{Kind: SGD, LR: 1e-3, Momentum: 0.9}, {Kind: SGD, LR: 1e-3, Momentum: 0.9, Nesterov: true, WeightDecay: 1e-4},
		{Kind: Adam, LR: 1e-3}, {Kind: AdamW, LR: 1e-3}, {Kind: RMSprop, LR: 1e-3}} {
		name := fmt.Sprintf("%s/wd=%v/mom=%v/nesterov=%v", cfg.Kind, cfg.WeightDecay, cfg.Momentum, cfg.Nesterov)
		b.Run(name, func(b *testing.B) {
			o, err := New(cfg, p)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(3 * 4 * n)
			for b.Loop() {
				if err := o.StepTo(dst, p, g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
