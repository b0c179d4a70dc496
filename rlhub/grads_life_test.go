package rlhub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/rlhub"
)

// A gradient pushed with the life of the version it was computed on is
// refused once the model was deleted and pushed again, though the new
// model is at the same version number; with the new model's life it is
// applied.
func TestGradClientPushLifeRefusesADeletedModelsGradient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := dataPlaneHub(t, false)
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr, ClientID: "learner"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	admin, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	train := rlhub.ModelTraining{Model: "policy", Optimizer: rlhub.Optimizer{Kind: rlhub.SGD, LR: 0.5}}

	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.RegisterModel(ctx, train); err != nil {
		t.Fatal(err)
	}
	old, err := s.Pull(ctx, "policy", 0)
	if err != nil {
		t.Fatal(err)
	}
	if old.Life() == 0 {
		t.Fatal("a pulled version names no life")
	}

	if err := admin.Delete(ctx, "policy"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(ctx, "policy", 1, 0, weights(7)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.RegisterModel(ctx, train); err != nil {
		t.Fatal(err)
	}
	fresh, err := s.Pull(ctx, "policy", 0)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Version != old.Version || fresh.Life() == old.Life() {
		t.Fatalf("new model v%d life %d, deleted v%d life %d: want the same version in another life",
			fresh.Version, fresh.Life(), old.Version, old.Life())
	}

	if _, err := g.PushLife(ctx, "policy", old.Version, old.Life(), weights(1)); !errors.Is(err, rlhub.ErrStaleVersion) {
		t.Fatalf("gradient of the deleted model: %v, want ErrStaleVersion", err)
	}
	if now, err := s.Pull(ctx, "policy", 0); err != nil || now.Version != fresh.Version {
		t.Fatalf("after the refused gradient the model is at %v (%v), want v%d unchanged", now, err, fresh.Version)
	}

	if _, err := g.PushLife(ctx, "policy", fresh.Version, fresh.Life(), weights(1)); err != nil {
		t.Fatalf("gradient of the new model: %v", err)
	}
	next, err := s.WaitNewer(ctx, "policy", fresh.Version)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := next.Tensors.Get("w").Float32s()
	if want := []float32{7 - 0.5, -7 + 0.5}; w[0] != want[0] || w[1] != want[1] {
		t.Fatalf("new model after one SGD step: %v, want %v", w, want)
	}
}
