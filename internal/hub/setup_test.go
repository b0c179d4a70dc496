package hub

import (
	"context"
	"testing"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// startWithSGDModel starts a hub with cfg, stores model as "m" version 1
// and registers it with the hub's reducer (SGD, lr 0.1) through a reducer
// client, which it returns. The hub and the client close when the test
// ends.
func startWithSGDModel(t *testing.T, ctx context.Context, cfg Config, model *tensor.StateDict) (*Hub, *reducer.Client) {
	t.Helper()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	blob, err := safetensors.Encode(model, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	c, err := reducer.NewClient(reducer.ClientConfig{Hub: h.Addr().String(), ClientID: "c"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, _, err := c.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	return h, c
}
