package clusterrpc_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's client keeps a resolver goroutine per process.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"))
}

func ask(t *testing.T, addr string) *rlhubv1.PrimaryResponse {
	t.Helper()
	conn, err := dial.Config{}.GRPC(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rlhubv1.NewClusterClient(conn).Primary(ctx, &rlhubv1.PrimaryRequest{})
	if err != nil {
		t.Fatalf("Cluster/Primary on %s: %v", addr, err)
	}
	return r
}

// A hub without a cluster is its own primary at epoch 0.
func TestHubWithoutClusterAnswersItself(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	r := ask(t, h.Addr().String())
	if r.GetAddress() != h.Addr().String() || !r.GetSelf() || r.GetEpoch() != 0 || r.GetMemberId() != "" {
		t.Fatalf("answer %v, want itself (%s) at epoch 0", r, h.Addr())
	}
}

// Cluster/Replication: a hub in no cluster says so (FAILED_PRECONDITION);
// a member answers what its node reports, each standby's acknowledged
// unit counted back from the unit and its lag, sorted by member id.
func TestReplicationAnswer(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	conn, err := dial.Config{}.GRPC(h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := rlhubv1.NewClusterClient(conn)
	if _, err := c.Replication(ctx, &rlhubv1.ReplicationRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replication of a hub in no cluster: %v, want FailedPrecondition", err)
	}
	h.Cluster().SetReplication(func() clusterrpc.Replication {
		return clusterrpc.Replication{MemberID: "a", Primary: true, Epoch: 7, Unit: 12, Lag: map[string]uint64{"c": 3, "b": 0}}
	})
	r, err := c.Replication(ctx, &rlhubv1.ReplicationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs := r.GetFollowers()
	if r.GetMemberId() != "a" || !r.GetPrimary() || r.GetEpoch() != 7 || r.GetUnit() != 12 || len(fs) != 2 ||
		fs[0].GetMemberId() != "b" || fs[0].GetLag() != 0 || fs[1].GetMemberId() != "c" || fs[1].GetAcked() != 9 || fs[1].GetLag() != 3 {
		t.Fatalf("replication answer %v", r)
	}
}

// Two hubs in one cluster on a real etcd: both name the same primary, only
// the primary says self, and after the primary leaves the other names
// itself at a larger epoch.
func TestMembersNameTheElectedPrimary(t *testing.T) {
	e := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var hubs [2]*hub.Hub
	var members [2]*cluster.Member
	for i := range hubs {
		hubs[i] = hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
		m, err := cluster.Join(ctx, cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: "c", ID: []string{"a", "b"}[i],
			Addr: hubs[i].Addr().String(), LeaseTTL: time.Second, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		members[i] = m
		hubs[i].Cluster().SetSource(clusterrpc.FromMember(m, "c"))
	}
	// Before anyone campaigns there is no primary: an empty answer.
	if r := ask(t, hubs[1].Addr().String()); r.GetAddress() != "" || r.GetCluster() != "c" {
		t.Fatalf("answer with no election %v, want no address", r)
	}
	t0, err := members[0].Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *cluster.Term, 1)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	go func() {
		t1, err := members[1].Campaign(cctx)
		if err == nil {
			won <- t1
		}
		close(won)
	}()
	for i, h := range hubs {
		r := ask(t, h.Addr().String())
		if r.GetAddress() != hubs[0].Addr().String() || r.GetEpoch() != t0.Epoch || r.GetMemberId() != "a" || r.GetSelf() != (i == 0) {
			t.Fatalf("hub %d answers %v, want a@%s epoch %d self=%v", i, r, hubs[0].Addr(), t0.Epoch, i == 0)
		}
	}
	if err := members[0].Close(); err != nil {
		t.Fatal(err)
	}
	t1 := testkit.Recv(t, won, 20*time.Second, "the standby's election")
	if t1 == nil || t1.Epoch <= t0.Epoch {
		t.Fatalf("new term %v, want an epoch above %d", t1, t0.Epoch)
	}
	r := ask(t, hubs[1].Addr().String())
	if r.GetAddress() != hubs[1].Addr().String() || !r.GetSelf() || r.GetEpoch() != t1.Epoch {
		t.Fatalf("after failover hub 1 answers %v, want itself at epoch %d", r, t1.Epoch)
	}
}
