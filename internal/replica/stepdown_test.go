package replica_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A primary that steps down hands its socket to the standby server
// without waiting for a standby that reads nothing (SIGSTOPped: its
// connection stays open, what a standby across a partition looks like),
// though --stop-timeout would let it wait 10 minutes. The standby follows
// over gRPC, where the stalled stream's handler ends only when the
// stream is cut; the step-down bounds the hub's graceful stop
// (Hub.CloseWithin). Before, a deposed primary stayed closing for the
// whole --stop-timeout (5 s by default), and its clients waited, unanswered,
// for the standby refusal (TestPartitionedPrimaryPublishesNothing).
func TestStepDownDoesNotWaitForAStoppedStandby(t *testing.T) {
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 2, "2s", "--replica-transport", "grpc", "--stop-timeout", "10m")
	l, p := c.leader(0)
	sb := c.standbys(p)[0]
	c.synced(sb, l)
	c.push("m", 1, 0, storetest.Blob(t, 1, 64)) // acknowledged by sb: its stream is live

	sb.signal(syscall.SIGSTOP)
	t.Cleanup(func() { sb.signal(syscall.SIGCONT) }) // before its kill at cleanup
	// Depose the primary: its election key's lease revoked, as etcd does
	// when the lease lapses.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/rlhub/"+c.name+"/election/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) != 1 || uint64(resp.Kvs[0].CreateRevision) != l.Epoch {
		t.Fatalf("the primary's election key: %v %v, want one of revision %d", resp, err, l.Epoch)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}

	testkit.Eventually(t, 60*time.Second, "the deposed primary to step down and stop its hub", func() bool {
		out := p.out.String()
		i := strings.Index(out, `msg="cluster: this hub is no longer the primary; stepping down"`)
		return i >= 0 && strings.Contains(out[i:], `msg="hub stopped"`)
	})
}
