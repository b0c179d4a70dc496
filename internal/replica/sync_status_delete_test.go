package replica_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// On a cluster, sync status after a model is deleted and pushed again
// from version 1 (rlhub model rm, then a fresh start) names the new
// model's newest version, as on a single hub
// (wsync.TestStatusFollowsAModelDeletedAndPushedAgain): the primary's
// store (replica.Fenced) tells the lives apart too. It kept showing the
// deleted model's newest version, and a collector of the new one lagging
// behind it, until the new model's versions passed it.
func TestClusterSyncStatusFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 1)
	_, primary := c.leader(0)
	for v := uint64(1); v <= 5; v++ {
		c.push("m", v, v-1, storetest.Blob(t, v, 64))
	}
	conn, err := grpc.NewClient(primary.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	report := func(v uint64) {
		t.Helper()
		if err := wsync.Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "c", Model: "m", Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	newest := func() (uint64, uint64) {
		t.Helper()
		st, err := wsync.Status(ctx, conn, "m")
		if err != nil || len(st) != 1 || len(st[0].Collectors) != 1 {
			t.Fatalf("status %+v, %v; want model m with one collector", st, err)
		}
		return st[0].Newest, st[0].Collectors[0].Lag
	}
	report(5)
	if n, lag := newest(); n != 5 || lag != 0 {
		t.Fatalf("before the Delete: newest %d, lag %d; want 5 and 0", n, lag)
	}
	if err := c.client(primary.addr).Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	c.push("m", 1, 0, storetest.Blob(t, 11, 64))
	report(1)
	if n, lag := newest(); n != 1 || lag != 0 {
		t.Fatalf("after the Delete and a push of v1: newest %d, the collector at v1 lags %d; want newest 1, lag 0", n, lag)
	}
	c.push("m", 2, 1, storetest.Blob(t, 12, 64))
	if n, lag := newest(); n != 2 || lag != 1 {
		t.Fatalf("after v2 of the new model: newest %d, lag %d; want 2 and 1", n, lag)
	}
}

// On a primary, sync status names no version readers cannot see yet: a
// version of the model pushed again after its Delete that waits for its
// standby's acknowledgement is hidden from the status too, which shows
// the newest acknowledged version of the new model (not the deleted
// model's newest, nor the hidden one).
func TestFencedSyncStatusHidesUnacknowledgedVersionsOfANewLife(t *testing.T) {
	x := newFencedFixture(t, nil)
	f := x.f
	ctx := context.Background()
	svc, err := wsync.NewService(wsync.ServiceConfig{Versions: f})
	if err != nil {
		t.Fatal(err)
	}
	var srv *grpc.Server
	addr := testkit.ServeGRPC(t, nil, func(s *grpc.Server) {
		srv = s
		svc.Register(s)
	})
	t.Cleanup(func() { // before ServeGRPC's: drains the service first
		svc.Drain()
		srv.GracefulStop()
		svc.Close()
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	newest := func(at uint64) (uint64, uint64) {
		t.Helper()
		if err := wsync.Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "c", Model: "m", Version: at}); err != nil {
			t.Fatal(err)
		}
		st, err := wsync.Status(ctx, conn, "m")
		if err != nil || len(st) != 1 || len(st[0].Collectors) != 1 {
			t.Fatalf("status %+v, %v; want model m with one collector", st, err)
		}
		return st[0].Newest, st[0].Collectors[0].Lag
	}

	x.pushAcked(5, "m") // no standby: every push is acknowledged at once
	if n, lag := newest(5); n != 5 || lag != 0 {
		t.Fatalf("before the Delete: newest %d, lag %d; want 5 and 0", n, lag)
	}
	if err := f.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	x.pushAcked(2, "m")
	x.setStandbys("s1") // s1 never acknowledges: v3 stays hidden
	x.notAcked("push of v3 with s1 silent", x.pushNext("m", 3, 3))
	if _, err := f.Get(ctx, "m", 3); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("v3 readable before its acknowledgement: %v", err)
	}
	if n, lag := newest(2); n != 2 || lag != 0 {
		t.Fatalf("with v3 of the new model hidden: newest %d, the collector at v2 lags %d; want newest 2, lag 0", n, lag)
	}
	x.setStandbys() // s1 left: v4 is acknowledged, and v3 with it
	if err := x.pushNext("m", 4, 4); err != nil {
		t.Fatal(err)
	}
	if n, lag := newest(2); n != 4 || lag != 2 {
		t.Fatalf("after v4 was acknowledged: newest %d, lag %d; want 4 and 2", n, lag)
	}
}
