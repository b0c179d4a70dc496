package replica_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A registered standby whose lease lapses while its stream stays open
// and silent — its machine cut off by a partition: nothing resets the
// connection — is waited for by no publish after the refresh that found
// it gone: neither as a registered standby nor as a connected follower.
// Before, every publish waited AckTimeout for it and failed, for as long
// as the stream seemed alive (minutes, in the lab:
// TestPartitionedStandbyDropsOutAndCatchesUp).
func TestSyncDoesNotWaitForAFollowerWhoseLeaseLapsed(t *testing.T) {
	src, register := sourceOf(t, 5, 500*time.Millisecond, "cut")
	addr := testkit.ServeGRPC(t, nil, src.Register)
	defer src.Close()
	ctx := context.Background()
	// It holds after its full sync (unit-hold): connected, never acknowledging.
	f, err := replica.NewFollower(replica.FollowerConfig{DataDir: t.TempDir(), Member: "cut", CrashAt: "unit-hold:2", Logger: testkit.Logger(),
		Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
			return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = f.Follow(fctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5}) })
	testkit.Eventually(t, 30*time.Second, "the follower's full sync", f.Synced)
	testkit.Eventually(t, 30*time.Second, "the follower's stream at the primary", func() bool {
		acked, _ := src.Followers()
		_, ok := acked["cut"]
		return ok
	})
	if err := src.RefreshStandbys(ctx); err != nil { // read after it connected
		t.Fatal(err)
	}
	standbys, err := src.Prepare(ctx)
	if err != nil || len(standbys) != 1 {
		t.Fatalf("registered standbys %v (%v), want [cut]", standbys, err)
	}
	if err := src.Sync(ctx, standbys); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Sync with the registered standby silent: %v, want Unavailable (not acknowledged)", err)
	}

	register() // its lease lapsed; its stream stays open
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	standbys, err = src.Prepare(ctx)
	if err != nil || len(standbys) != 0 {
		t.Fatalf("registered standbys %v (%v), want none", standbys, err)
	}
	for i := range 3 {
		if err := src.Sync(ctx, standbys); err != nil {
			t.Fatalf("publish %d after the standby's lease lapsed: %v", i, err)
		}
	}
}
