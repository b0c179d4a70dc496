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

// A follower connected to the primary but not yet among the registered
// standbys it last read (it registered since) is waited for all the
// same: it may have taken its full sync before the commit and campaign
// next. Here it holds after its full sync (unit-hold), so the publish is
// not acknowledged; once it leaves, nothing is waited for.
func TestSyncWaitsForAConnectedFollowerNotYetRegistered(t *testing.T) {
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Epoch: 5, Acks: replica.AcksAll, AckTimeout: 500 * time.Millisecond,
		Standbys: func(context.Context) ([]string, error) { return nil, nil }, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	defer src.Close()
	ctx := context.Background()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := replica.NewFollower(replica.FollowerConfig{DataDir: t.TempDir(), Member: "late", CrashAt: "unit-hold:2", Logger: testkit.Logger(),
		Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
			return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Follow(fctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5}) })
	testkit.Eventually(t, 30*time.Second, "the follower's full sync", f.Synced)

	standbys, err := src.Prepare(ctx)
	if err != nil || len(standbys) != 0 {
		t.Fatalf("registered standbys %v (%v), want none", standbys, err)
	}
	if err := src.Sync(ctx, standbys); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Sync with a connected follower that does not acknowledge: %v, want Unavailable (not acknowledged)", err)
	}
	cancel()
	wg.Wait()
	testkit.Eventually(t, 30*time.Second, "the follower's stream to end at the primary", func() bool {
		acked, _ := src.Followers()
		return len(acked) == 0
	})
	if err := src.Sync(ctx, standbys); err != nil {
		t.Fatalf("Sync with the follower gone: %v", err)
	}
}
