package rlhub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/rlhub"
)

// Close ends a gradient push in flight that is retrying a hub it cannot
// reach (the default MaxAttempts retries until the push's ctx ends): the
// push returns ErrUnavailable soon after, as does a push after Close.
func TestGradClientCloseEndsARetryingPush(t *testing.T) {
	addr, stop := startHub()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	g, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.RegisterModel(ctx, rlhub.ModelTraining{Model: "policy",
		Optimizer: rlhub.Optimizer{Kind: rlhub.SGD, LR: 0.5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Push(ctx, "policy", 1, weights(1)); err != nil {
		t.Fatal(err)
	}
	stop() // the hub goes away: the next push retries until its ctx ends
	pushed := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := g.Push(ctx, "policy", 1, weights(1))
		pushed <- err
	}()
	time.Sleep(300 * time.Millisecond)
	g.Close()
	select {
	case err := <-pushed:
		t.Logf("push returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if !errors.Is(err, rlhub.ErrUnavailable) {
			t.Fatalf("push after Close: %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("push still retrying 10s after Close (returned %v once its ctx was canceled)", <-pushed)
	}
	// A push after Close fails at once, as unavailable.
	if _, err := g.Push(context.Background(), "policy", 1, weights(1)); !errors.Is(err, rlhub.ErrUnavailable) {
		t.Fatalf("push after Close: %v, want ErrUnavailable", err)
	}
}

// A nil gradient is refused ErrInvalid (it panicked in the encoder).
func TestGradClientRefusesANilGradient(t *testing.T) {
	addr, stop := startHub()
	defer stop()
	g, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := g.Push(ctx, "policy", 1, nil); !errors.Is(err, rlhub.ErrInvalid) {
		t.Fatalf("push of a nil gradient: %v, want ErrInvalid", err)
	}
}
