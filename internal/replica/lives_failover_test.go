package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestFailoverKeepsTheModelsLife: three hubs on one etcd; the life the
// primary names for a model (BlobInfo.life of a pull) is the one the
// standby it fails over to names, SIGKILLed mid-run: a failover changes
// no model's history, so a follower that follows lives neither takes the
// newest again nor moves to a lower version as if the model had been
// deleted. A Delete and the model pushed again start a new life, which
// the next primary names as well.
func TestFailoverKeepsTheModelsLife(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	life := func(v uint64) uint64 {
		t.Helper()
		snap := c.newest("pol")
		if snap.Version != v || snap.Life() == 0 {
			t.Fatalf("the primary serves pol v%d of life %d, want v%d of a named life", snap.Version, snap.Life(), v)
		}
		return snap.Life()
	}
	l1, p1 := c.leader(0)
	for v := uint64(1); v <= 3; v++ {
		c.push("pol", v, v-1, storetest.Blob(t, v, 256))
	}
	first := life(3)

	p1.kill()
	l2, p2 := c.leader(l1.Epoch)
	if got := life(3); got != first {
		t.Fatalf("after a failover the primary names life %d, want %d (no Delete)", got, first)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.client(p2.addr).Delete(ctx, "pol"); err != nil {
		t.Fatal(err)
	}
	c.push("pol", 1, 0, storetest.Blob(t, 11, 256))
	c.push("pol", 2, 1, storetest.Blob(t, 12, 256))
	second := life(2)
	if second == first {
		t.Fatalf("the model deleted and pushed again names life %d, the deleted model's", second)
	}

	p2.kill()
	c.leader(l2.Epoch)
	if got := life(2); got != second {
		t.Fatalf("after a second failover the primary names life %d, want %d (the model pushed again)", got, second)
	}
}
