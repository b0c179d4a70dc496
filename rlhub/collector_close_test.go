package rlhub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// Close ends a ViaPush collector on a cluster (a hub list) while its Run
// waits for the next version: Close returns, and Run with ErrUnavailable.
func TestCollectorViaPushOnClusterCloseEndsRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr, _ := policyHub(t, ctx, false)
	// The second hub of the list is down: the collector follows the first.
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr + ",127.0.0.1:1", Model: "policy",
		CollectorID: "go-push-close", Weights: weights(0)})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	testkit.Eventually(t, 20*time.Second, "the collector at v1", func() bool { return c.Version() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		cancel() // lets Run, and with it Close, return
		<-closed
		t.Fatal("Close did not return within 10s while Run waited for a version")
	}
	select {
	case err := <-ran:
		if !errors.Is(err, rlhub.ErrUnavailable) {
			t.Fatalf("Run after Close: %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of Close")
	}
}
