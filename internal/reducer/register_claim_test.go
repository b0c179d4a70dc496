package reducer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// TestGradientAdmittedForADeletedRegistrationIsNotApplied: a gradient
// admitted for a registration whose model is deleted before its batch is
// forwarded was computed on the deleted model. The registration is
// dropped at the delete (as the hub does: Primary.Deleted) — in memory,
// its stats, and its files, named for a cluster's standbys — and the
// model pushed again and registered again. The batch's forward is then
// refused, naming why, and not applied to the new model; its release
// releases it; the new registration's own gradients are applied.
func TestGradientAdmittedForADeletedRegistrationIsNotApplied(t *testing.T) {
	fs, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(t.TempDir(), "store"), Store: store.Config{Retain: 4},
		Logger: slog.New(slog.NewTextHandler(&testkit.Buffer{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	stateDir := t.TempDir()
	var namedMu sync.Mutex
	var named []string
	p, err := NewPrimary(PrimaryConfig{Store: store.Owned{Store: fs, Owner: "reducer"}, StateDir: stateDir,
		Logger: slog.New(slog.NewTextHandler(&testkit.Buffer{}, nil)),
		StateChanged: func(path string) {
			namedMu.Lock()
			named = append(named, path)
			namedMu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mc := ModelConfig{Model: "m", Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}
	pushModel(t, fs, "m", testLayout(3))
	if _, _, err := p.Register(ctx, mc); err != nil {
		t.Fatal(err)
	}
	sess, _, err := p.Attach(ctx, Secondary{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	old := reduce.ID{Client: "c", Seq: 1}
	w, _, err := p.Admit(ctx, sess, "m", old, 1, 0)
	if err != nil {
		t.Fatal(err)
	}

	if err := fs.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	p.Deleted(ctx, "m")
	regDir := filepath.Join(stateDir, store.ModelDir("m"))
	if _, err := os.Stat(regDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted model's registration files: %v, want removed", err)
	}
	namedMu.Lock()
	if !slices.Contains(named, regDir) {
		t.Errorf("the removal of %s was not named to StateChanged (named: %v)", regDir, named)
	}
	namedMu.Unlock()
	if _, ok := p.Stats().Models["m"]; ok {
		t.Errorf("stats list the dropped registration: %+v", p.Stats().Models)
	}
	if _, err := p.Describe(ctx, "m"); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("describe of the dropped registration: %v, want NOT_FOUND", err)
	}
	// A claim the dropped registration held in a step (settled, then the
	// step failed) is nowhere to release: nothing, no error. NOT_FOUND
	// made the secondary retry for 5 s and log the claims "pending".
	if n, err := p.Release(ctx, sess, "m", []reduce.ID{{Client: "c", Seq: 99}}); err != nil || n != 0 {
		t.Errorf("release on the dropped registration of a claim it did not hold: %d, %v; want 0 released, no error", n, err)
	}

	other := fill(testLayout(3), rand.New(rand.NewPCG(7, 7)), 100)
	blob, err := safetensors.Encode(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	if v, steps, err := p.Register(ctx, mc); err != nil || v != 1 || steps != 0 {
		t.Fatalf("register again: version %d, steps %d, %v; want version 1, a fresh optimizer", v, steps, err)
	}
	_, err = p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{old}, Weights: []float32{w}, Sum: gradFor(3, "c", 1)})
	if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("forward of a gradient admitted for the dropped registration: %v; want ABORTED naming the delete", err)
	}
	if snap, err := fs.Get(ctx, "m", 0); err != nil || snap.Version != 1 || !bytes.Equal(snap.Blob, blob) {
		t.Fatalf("the new model after the refused forward: %v; want its version 1, untouched", err)
	}
	if n, err := p.Release(ctx, sess, "m", []reduce.ID{old}); err != nil || n != 1 {
		t.Fatalf("release of the refused gradient: %d, %v; want 1 released", n, err)
	}
	// The new registration's gradients are applied.
	fresh := reduce.ID{Client: "c", Seq: 2}
	if w, _, err = p.Admit(ctx, sess, "m", fresh, 1, 0); err != nil {
		t.Fatal(err)
	}
	if v, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{fresh}, Weights: []float32{w}, Sum: gradFor(3, "c", 2)}); err != nil || v != 2 {
		t.Fatalf("forward to the new registration: version %d, %v; want 2", v, err)
	}
}

// TestRegisterAgainDropsTheRegistrationOfADeletedModel: a model deleted
// without the reducer being told (a Delete on the store itself, not the
// hub's) and pushed again: Register with the same config returned the
// deleted model's registration, and with another config failed
// ALREADY_EXISTS. Register now finds the registration stale and starts
// afresh.
func TestRegisterAgainDropsTheRegistrationOfADeletedModel(t *testing.T) {
	fs, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(t.TempDir(), "store"), Store: store.Config{Retain: 4},
		Logger: slog.New(slog.NewTextHandler(&testkit.Buffer{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	e := newTestEnv(t, Config{Store: store.Owned{Store: fs, Owner: "reducer"}, StateDir: t.TempDir(), Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(3))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("c", 1)
	pushModel(t, fs, e.model, testLayout(3))
	sgd := ModelConfig{Model: e.model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}
	if _, _, err := c.Register(ctx, sgd); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushGrad(ctx, e.model, 1, gradFor(3, "c", 1)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the first step", func() bool { return e.svc.Stats().Models[e.model].Version == 2 })
	for _, mc := range []ModelConfig{sgd, {Model: e.model, Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}} {
		if err := fs.Delete(ctx, e.model); err != nil {
			t.Fatal(err)
		}
		pushModel(t, fs, e.model, fill(testLayout(3), rand.New(rand.NewPCG(7, 7)), 100))
		if v, steps, err := c.Register(ctx, mc); err != nil || v != 1 || steps != 0 {
			t.Fatalf("register %s again: version %d, steps %d, %v; want version 1, a fresh optimizer", mc.Optimizer.Kind, v, steps, err)
		}
	}
}
