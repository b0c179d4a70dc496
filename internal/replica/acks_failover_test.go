package replica_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// campaigning counts the keys in c's election: the primary and every
// standby waiting in line, in the order they campaigned.
func campaigning(t *testing.T, c *testCluster) int {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcd}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/rlhub/"+c.name+"/election/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return -1
	}
	return int(resp.Count)
}

// TestFailoverKeepsPublishesAcknowledgedByOneStandby: --replica-acks 1
// with two standbys, arranged so that the standby next in line for the
// election (h1, which stops applying units after its full sync:
// RLHUB_TEST_REPLICA_CRASH=unit-hold) is not the one that acknowledges
// (h2). The primary is SIGKILLed; h1 wins the election, finds h2's copy
// ahead of its own and resigns for it; every acknowledged version is
// still served, byte for byte.
func TestFailoverKeepsPublishesAcknowledgedByOneStandby(t *testing.T) {
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 1, "2s", "--replica-acks", "1")
	l1, p0 := c.leader(0)
	blobs := map[uint64][]byte{1: storetest.Blob(t, 1, 256)}
	c.push("pol", 1, 0, blobs[1])

	lag := &hubProc{t: t, id: "h1", data: t.TempDir(), args: []string{"--replica-acks", "1"}}
	c.hubs = append(c.hubs, lag)
	t.Setenv("RLHUB_TEST_REPLICA_CRASH", "unit-hold:2") // applies the full sync, then holds
	c.start(lag)
	os.Unsetenv("RLHUB_TEST_REPLICA_CRASH")
	testkit.Eventually(t, 60*time.Second, "h1 in line for the election", func() bool { return campaigning(t, c) == 2 })
	acker := &hubProc{t: t, id: "h2", data: t.TempDir(), args: []string{"--replica-acks", "1"}}
	c.hubs = append(c.hubs, acker)
	c.start(acker)
	testkit.Eventually(t, 60*time.Second, "h2 in line after h1", func() bool { return campaigning(t, c) == 3 })

	const last = 6
	for v := uint64(2); v <= last; v++ { // acknowledged by h2 alone: h1 holds
		blobs[v] = storetest.Blob(t, v, 256)
		if info := c.push("pol", v, v-1, blobs[v]); info.Epoch != l1.Epoch {
			t.Fatalf("v%d landed at epoch %d, want %d (no failover yet)", v, info.Epoch, l1.Epoch)
		}
	}
	p0.kill()
	l2, _ := c.leader(l1.Epoch)
	snap := c.newest("pol")
	if snap.Version != last || !bytes.Equal(snap.Blob, blobs[last]) {
		t.Fatalf("after the failover the primary %s serves pol v%d, want every acknowledged version up to v%d\nh1:\n%s", l2, snap.Version, last, lag.out)
	}
	if !bytes.Contains([]byte(lag.out.String()), []byte("resigning for it")) {
		t.Logf("h1 did not win the first round (the election went to %s directly)", l2.ID)
	}
	t.Logf("primary after the kill: %s", l2)
}
