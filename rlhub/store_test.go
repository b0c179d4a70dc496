package rlhub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/rlhub"
)

// WaitNewer whose ctx ends with nothing newer fails with ctx's error, on
// the data plane's long poll as on gRPC: a caller tells "nothing new in
// time" (context.DeadlineExceeded) from "hub down" (ErrUnavailable).
func TestStoreWaitNewerDeadlineIsContextError(t *testing.T) {
	addr := dataPlaneHub(t, false)
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(context.Background(), "policy", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		snap, err := s.WaitNewer(ctx, "policy", 1)
		cancel()
		if snap != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait %d: (%v, %v), want context.DeadlineExceeded", i, snap, err)
		}
	}
}
