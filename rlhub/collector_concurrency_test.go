package rlhub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// Poll on a ViaDataPlane collector whose Run is waiting for the next
// version returns within Poll's own context, not when Run's long poll
// ends.
func TestCollectorViaDataPlanePollHonoursItsContextBesideRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr, _ := policyHub(t, ctx, false)
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaDataPlane,
		CollectorID: "go-dp-poll", Weights: weights(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer running(ctx, c)()
	testkit.Eventually(t, 20*time.Second, "the collector at v1", func() bool { return c.Version() == 1 })
	time.Sleep(100 * time.Millisecond) // Run is in its long poll for v2
	pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer pcancel()
	start := time.Now()
	_, err = c.Poll(pctx)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Poll with a 200ms context returned after %v (err %v)", took.Round(time.Millisecond), err)
	}
}

// Polls of a ViaDataPlane collector from several goroutines at once
// leave the snapshot of the version it ran before intact while only one
// newer version has arrived (its bytes are reused only after two).
func TestCollectorViaDataPlaneConcurrentPollsKeepTheOlderSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr, s := policyHub(t, ctx, false)
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaDataPlane,
		CollectorID: "go-dp-polls"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, err := c.Poll(ctx); !ok || err != nil {
		t.Fatalf("first poll: %v %v", ok, err)
	}
	v1 := c.Current()
	if _, err := s.Push(ctx, "policy", 2, 1, weights(2)); err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			<-start
			if _, err := c.Poll(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if c.Version() != 2 {
		t.Fatalf("collector at v%d, want v2", c.Version())
	}
	if w, _ := v1.Tensors.Get("w").Float32s(); w[0] != 1 || w[1] != -1 {
		t.Fatalf("the v%d snapshot holds %v after one newer version, want [1 -1]", v1.Version, w)
	}
}
