package hub

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestHostileStorePushCannotStopReducer is issue 16's first abuse: a plain
// store push of version v+1 over a reducer-managed model used to make the
// reducer's next step fail ("model stops taking gradients") and every later
// gradient was acknowledged but never applied. The model is owned by the
// reducer since its registration: the push is refused with PermissionDenied,
// changes nothing, and the next 20 gradients are all applied.
func TestHostileStorePushCannotStopReducer(t *testing.T) {
	for _, dir := range []string{"", "file"} {
		t.Run("store="+map[string]string{"": "memory", "file": "file"}[dir], func(t *testing.T) {
			cfg := Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{BatchSize: 1}}
			if dir != "" {
				cfg.DataDir = t.TempDir()
			}
			h, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Start(); err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			model, _ := tensor.NewStateDict(tensor.NewF32("w", 8))
			blob, _ := safetensors.Encode(model, nil)
			if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
				t.Fatal(err)
			}
			c, err := reducer.NewClient(reducer.ClientConfig{Hub: h.Addr().String(), ClientID: "c"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, _, err := c.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
				t.Fatal(err)
			}

			sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			hostile, _ := safetensors.Encode(model, map[string]string{"by": "attacker"})
			_, err = sc.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: hostile})
			if !errors.Is(err, errs.ErrPermission) {
				t.Fatalf("hostile push over a reducer-managed model: err %v, want PermissionDenied", err)
			}
			snap, err := sc.Get(ctx, "m", 0)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Version != 1 || snap.Metadata["by"] != "" {
				t.Fatalf("after the refused push the model is version %d metadata %v, want version 1 untouched", snap.Version, snap.Metadata)
			}

			const n = 20
			for i := range n {
				if _, err := c.PushGrad(ctx, "m", 0, model); err != nil {
					t.Fatalf("gradient %d: %v", i, err)
				}
			}
			testkit.Eventually(t, 30*time.Second, "all 20 gradients applied", func() bool {
				st := h.Reducer().Stats()
				return st.Total.Applied == n && st.QueueDepth == 0
			})
			st := h.Reducer().Stats()
			if st.Models["m"].Version != 1+n {
				t.Fatalf("model at version %d after %d applied gradients, want %d", st.Models["m"].Version, n, 1+n)
			}
		})
	}
}
