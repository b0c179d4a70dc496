package reducer

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
)

// A finite gradient whose step overflows (SGD with a large rate: p − lr·g
// is −Inf; centered RMSprop: Inf − Inf; Adam: the second moment is Inf
// while the weights stay finite) was pushed over gRPC, admitted, and its
// non-finite weights published to every puller (Adam's Inf state was kept
// silently). The primary now publishes nothing of such a step: the batch
// counts step_nonfinite, the store keeps the version before, and the
// model stops with an error saying why and where it resumes.
func TestStepWithNonFiniteResultIsNotPublished(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  optim.Config
		big  float32
		what string
	}{
		{"sgd", optim.Config{Kind: optim.SGD, LR: 10}, 1e38, "weight"},
		{"rmsprop-centered", optim.Config{Kind: optim.RMSprop, LR: 0.01, Centered: true}, 1e30, "weight"},
		{"adam", optim.Config{Kind: optim.Adam, LR: 0.01}, 1e30, "optimizer state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 8
			init := fill(testLayout(n), rand.New(rand.NewPCG(5, 6)), 1)
			e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Minute}, init)
			e.register(ModelConfig{Optimizer: tc.opt})
			waitAttached(t, e.svc.Primary(), 1)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c := e.client("big", 1)
			before := e.newest()
			g := gradFor(n, "big", 1)
			f32(t, g, "fc.bias")[2] = tc.big
			if _, err := c.PushSeq(ctx, "m", before.Version, 1, g); err != nil {
				t.Fatalf("push of a finite gradient: %v", err)
			}
			st := e.waitSettled().Total
			if st.Dropped[reduce.ReasonStepNonFinite] != 1 || st.Applied != 0 {
				t.Fatalf("dropped %v, applied %d; want 1 step_nonfinite, 0 applied", st.Dropped, st.Applied)
			}
			if after := e.newest(); after.Version != before.Version || !slices.Equal(after.Blob, before.Blob) {
				t.Fatalf("a step with non-finite results published version %d (was %d)", after.Version, before.Version)
			}
			_, err := c.PushSeq(ctx, "m", before.Version, 2, gradFor(n, "big", 2))
			if err == nil || !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), "non-finite") {
				t.Fatalf("a push after the refused step: %v; want the model stopped, naming the non-finite %s", err, tc.what)
			}
		})
	}
}
