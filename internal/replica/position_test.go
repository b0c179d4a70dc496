package replica_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A standby's position survives its restart (a cluster restarted all at
// once): the follower opened again on the same --data answers with the
// newest unit it applied and acknowledged, not 0; a damaged saved
// position counts as 0 (the copy only yields, never wins, on it).
func TestStandbyPositionSurvivesARestart(t *testing.T) {
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Epoch: 5, Acks: replica.AcksAll, AckTimeout: time.Minute,
		Standbys: func(context.Context) ([]string, error) { return []string{"sb"}, nil }, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	defer src.Close()
	ctx := context.Background()
	data := t.TempDir()
	open := func() *replica.Follower {
		f, err := replica.NewFollower(replica.FollowerConfig{DataDir: data, Member: "sb", Logger: testkit.Logger(),
			Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
				return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := open()
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Follow(fctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5}) })
	for range 3 { // three publishes, each acknowledged by the standby
		standbys, err := src.Prepare(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Sync(ctx, standbys); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	cancel()
	wg.Wait()
	epoch, unit := f.PositionForTest()
	if epoch != 5 || unit < 3 {
		t.Fatalf("position after three acknowledged units: epoch %d unit %d", epoch, unit)
	}

	if e, u := open().PositionForTest(); e != epoch || u != unit {
		t.Errorf("restarted standby's position: epoch %d unit %d, want %d and %d", e, u, epoch, unit)
	}

	if err := os.WriteFile(filepath.Join(data, ".replica", "position"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, u := open().PositionForTest(); e != 0 || u != 0 {
		t.Errorf("position from a damaged file: epoch %d unit %d, want 0", e, u)
	}
}
