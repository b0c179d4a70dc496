package reducer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestRefusedRegistrationLeavesTheModelUnclaimed: Register claimed the
// model for the reducer (store.Owned, as the hub gives it) before reading
// it, and a registration then refused left the claim behind: for a model
// not pushed yet (NOT_FOUND) its owner's first push was refused
// PERMISSION_DENIED ("managed by reducer"), for one the reducer cannot
// reduce (F16) so was every later push of it. A refused registration now
// leaves the model's owner as it was; the model is claimed once it is
// known to be reducible.
func TestRefusedRegistrationLeavesTheModelUnclaimed(t *testing.T) {
	fs, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(t.TempDir(), "store"), Store: store.Config{Retain: 4},
		Logger: slog.New(slog.NewTextHandler(&testkit.Buffer{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	e := newTestEnv(t, Config{Store: store.Owned{Store: fs, Owner: "reducer"}}, testLayout(3))
	c := e.client("reg", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mc := func(model string) ModelConfig {
		return ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}
	}
	push := func(name string, version uint64, sd *tensor.StateDict) error {
		blob, err := safetensors.Encode(sd, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fs.Push(ctx, store.PushRequest{Name: name, Version: version, Expect: version - 1, Blob: blob})
		return err
	}

	// Not pushed yet: refused, and its first push still lands.
	if _, _, err := c.Register(ctx, mc("early")); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("register of a model not in the store: %v, want NOT_FOUND", err)
	}
	if err := push("early", 1, testLayout(3)); err != nil {
		t.Fatalf("the first push of a model whose registration was refused (not pushed yet): %v", err)
	}
	if _, _, err := c.Register(ctx, mc("early")); err != nil {
		t.Fatalf("register once pushed: %v", err)
	}
	if err := push("early", 2, testLayout(3)); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("another writer's push to a registered model: %v, want PERMISSION_DENIED", err)
	}

	// Not reducible (F16): refused, and its writer can still push it.
	half, _ := tensor.NewStateDict(&tensor.Tensor{Name: "w", DType: tensor.F16, Shape: []int64{4}, Data: make([]byte, 8)})
	if err := push("half", 1, half); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Register(ctx, mc("half")); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("register of an F16 model: %v, want INVALID_ARGUMENT", err)
	}
	if err := push("half", 2, testLayout(3)); err != nil {
		t.Fatalf("a push to a model whose registration was refused (F16): %v", err)
	}
}

// TestStepNeverLandsOnTheModelDeletedAndPushedAgain: a registered model
// deleted (`rlhub model rm`) and pushed again from version 1 with other
// weights by another writer is another model, though it shares the
// version numbers. The reducer's next step was published on it as its
// version 2: the deleted model's weights minus a step, over the new
// model's, and the model claimed for the reducer again. The step now
// fails to publish (docs/store.md, Delete): the new model keeps its
// weights and its writer.
func TestStepNeverLandsOnTheModelDeletedAndPushedAgain(t *testing.T) {
	fs, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(t.TempDir(), "store"), Store: store.Config{Retain: 4},
		Logger: slog.New(slog.NewTextHandler(&testkit.Buffer{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	e := newTestEnv(t, Config{Store: store.Owned{Store: fs, Owner: "reducer"}, Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(3))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("c", 1)
	pushModel(t, fs, e.model, testLayout(3))
	if _, _, err := c.Register(ctx, ModelConfig{Model: e.model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Delete(ctx, e.model); err != nil {
		t.Fatal(err)
	}
	other := fill(testLayout(3), rand.New(rand.NewPCG(7, 7)), 100)
	blob, err := safetensors.Encode(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Push(ctx, store.PushRequest{Name: e.model, Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	_, err = c.PushGrad(ctx, e.model, 1, gradFor(3, "c", 1))
	testkit.Eventually(t, 10*time.Second, "the step to end", func() bool {
		return e.svc.Stats().Total.Dropped[reduce.ReasonPublish] == 1 || e.svc.Stats().Total.Applied == 1
	})
	snap, gerr := fs.Get(ctx, e.model, 0)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if snap.Version != 1 || !bytes.Equal(snap.Blob, blob) {
		t.Fatalf("the model pushed again is at version %d (push: %v); want its own version 1, untouched", snap.Version, err)
	}
	if applied := e.svc.Stats().Total.Applied; applied != 0 {
		t.Fatalf("%d gradients applied to a model deleted since its registration", applied)
	}
	// Its writer still writes it: the reducer did not claim it back.
	if _, err := fs.Push(ctx, store.PushRequest{Name: e.model, Version: 2, Expect: 1, Blob: blob}); err != nil {
		t.Fatalf("the new model's writer after the refused step: %v", err)
	}
}
