package replica_test

import (
	"context"
	"errors"
	"fmt"
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
	// Closed after the server stops (cleanups run last first): Close
	// waits for the streams, which a running server keeps open.
	t.Cleanup(func() { src.Close() })
	addr := testkit.ServeGRPC(t, nil, src.Register)
	ctx := context.Background()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	stop := followSource(t, src, addr, "late", "unit-hold:2")

	standbys, err := src.Prepare(ctx)
	if err != nil || len(standbys) != 0 {
		t.Fatalf("registered standbys %v (%v), want none", standbys, err)
	}
	if err := src.Sync(ctx, standbys); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Sync with a connected follower that does not acknowledge: %v, want Unavailable (not acknowledged)", err)
	}
	stop()
	if err := src.Sync(ctx, standbys); err != nil {
		t.Fatalf("Sync with the follower gone: %v", err)
	}
}

// The in-sync record (SourceConfig.InSync) lists the followers that
// applied every acknowledged publish: one that caught up is added (at a
// publish, at once when its full sync is acknowledged, or by UpdateInSync);
// one that left is dropped before
// the next publish is acknowledged, and a publish whose drop cannot be
// recorded is not acknowledged.
func TestSourceKeepsTheInSyncRecord(t *testing.T) {
	var mu sync.Mutex
	var recorded [][]string
	var fail error
	registered := []string{"s1"}
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Epoch: 5, Acks: replica.AcksAll, AckTimeout: 5 * time.Second,
		Standbys: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return registered, nil
		},
		InSync: func(_ context.Context, standbys []string) error {
			mu.Lock()
			defer mu.Unlock()
			if fail != nil {
				return fail
			}
			recorded = append(recorded, standbys)
			return nil
		},
		Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the server stops (cleanups run last first): Close
	// waits for the streams, which a running server keeps open.
	t.Cleanup(func() { src.Close() })
	addr := testkit.ServeGRPC(t, nil, src.Register)
	ctx := context.Background()
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(recorded) == 0 {
			return "(none)"
		}
		return fmt.Sprint(recorded[len(recorded)-1])
	}
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	stop := followSource(t, src, addr, "s1", "")
	// Caught up with no publish yet: recorded when its full sync's
	// acknowledgement reaches the Source (just after the follower says it
	// is synced), with no UpdateInSync or publish: a primary killed before
	// either still leaves s1 to take over.
	recordedOnSync := func(what string) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, what, func() bool { return last() == "[s1]" })
	}
	recordedOnSync("s1 recorded once its full sync was acknowledged")
	if err := src.Sync(ctx, []string{"s1"}); err != nil || last() != "[s1]" {
		t.Fatalf("Sync with s1 following: %v, recorded %s", err, last())
	}

	stop() // s1 dies, and its registration lapses
	mu.Lock()
	registered, fail = nil, errors.New("etcd unreachable")
	mu.Unlock()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := src.UpdateInSync(ctx); err != nil {
		t.Fatalf("UpdateInSync with s1 gone and no publish: %v (it drops no one)", err)
	}
	if err := src.Sync(ctx, nil); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Sync that must drop s1 from the record, which cannot be written: %v, want Unavailable", err)
	}
	mu.Lock()
	fail = nil
	mu.Unlock()
	if err := src.Sync(ctx, nil); err != nil || last() != "[]" {
		t.Fatalf("Sync without s1: %v, recorded %s; want []", err, last())
	}

	mu.Lock()
	registered = []string{"s1"}
	mu.Unlock()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	stop = followSource(t, src, addr, "s1", "") // back, and caught up
	defer stop()
	recordedOnSync("s1 recorded again once it caught up")
}

// followSource runs a follower (member, crash points crashAt) of the
// Source served at addr (epoch 5) until its full sync applied; stop ends
// it and waits until the Source has dropped its stream.
func followSource(t *testing.T, src *replica.Source, addr, member, crashAt string) (stop func()) {
	t.Helper()
	f, err := replica.NewFollower(replica.FollowerConfig{DataDir: t.TempDir(), Member: member, CrashAt: crashAt, Logger: testkit.Logger(),
		Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
			return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Follow(ctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5}) })
	testkit.Eventually(t, 30*time.Second, "the follower's full sync", f.Synced)
	return func() {
		cancel()
		wg.Wait()
		testkit.Eventually(t, 30*time.Second, "the follower's stream to end at the primary", func() bool {
			acked, _ := src.Followers()
			return len(acked) == 0
		})
	}
}
