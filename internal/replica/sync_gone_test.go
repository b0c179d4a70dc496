package replica_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A publish waiting for a registered standby that then leaves the
// cluster (its lease lapsed: killed, or stopped past its TTL) stops
// waiting for it at the next refresh of the standbys, instead of failing
// unacknowledged after AckTimeout (a failover test saw such a publish
// fail the reducer's model: docs/cluster.md's failure table).
func TestSyncStopsWaitingForAStandbyThatLeft(t *testing.T) {
	var mu sync.Mutex
	registered := []string{"s1"}
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Epoch: 3, Acks: replica.AcksAll, AckTimeout: 5 * time.Minute,
		Logger: testkit.Logger(), Standbys: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return registered, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	standbys, err := src.Prepare(ctx)
	if err != nil || len(standbys) != 1 {
		t.Fatalf("Prepare = %v, %v; want [s1]", standbys, err)
	}
	done := make(chan error, 1)
	go func() { done <- src.Sync(ctx, standbys) }()
	select {
	case err := <-done:
		t.Fatalf("Sync returned %v with s1 registered and silent", err)
	case <-time.After(300 * time.Millisecond):
	}
	mu.Lock()
	registered = nil // s1's lease lapsed
	mu.Unlock()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Sync after s1 left: %v", err)
	}
}
