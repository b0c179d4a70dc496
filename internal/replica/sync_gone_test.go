package replica_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
)

// sourceOf is an acks-all primary's Source at epoch whose registered
// standbys are members until register changes them, as etcd's list
// changes when a lease lapses.
func sourceOf(t *testing.T, epoch uint64, ackTimeout time.Duration, members ...string) (src *replica.Source, register func(...string)) {
	t.Helper()
	var mu sync.Mutex
	registered := members
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Epoch: epoch, Acks: replica.AcksAll, AckTimeout: ackTimeout,
		Logger: testkit.Logger(), Standbys: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return registered, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return src, func(m ...string) {
		mu.Lock()
		defer mu.Unlock()
		registered = m
	}
}

// A publish waiting for a registered standby that then leaves the
// cluster (its lease lapsed: killed, or stopped past its TTL) stops
// waiting for it at the next refresh of the standbys, instead of failing
// unacknowledged after AckTimeout (a failover test saw such a publish
// fail the reducer's model: docs/cluster.md's failure table).
func TestSyncStopsWaitingForAStandbyThatLeft(t *testing.T) {
	src, register := sourceOf(t, 3, 5*time.Minute, "s1")
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
	register() // s1's lease lapsed
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Sync after s1 left: %v", err)
	}
}
