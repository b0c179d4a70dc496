package replica_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// The public rlhub.Collector with ViaPush given a cluster (a hub list)
// holds its push stream under a wsync.Failover: when the primary it
// streams from is SIGKILLed, the stream is attached again to the new
// primary and the collector gets the later versions, whole, without Run
// ever returning.
func TestPublicCollectorViaPushFollowsThePrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs and a failover")
	}
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	const model = "pol"
	sums := map[uint64][32]byte{}
	publish := func(v uint64) {
		t.Helper()
		blob := storetest.Blob(t, v, 1024)
		c.push(model, v, v-1, blob)
		sums[v] = sha256.Sum256(blob)
	}
	l1, p1 := c.leader(0)
	publish(1)
	var hubs []string
	for _, h := range c.hubs {
		hubs = append(hubs, h.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	col, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: strings.Join(hubs, ","), Model: model,
		CollectorID: "go-public-push", Via: rlhub.ViaPush, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- col.Run(runCtx) }()
	defer func() { stop(); <-done }()
	at := func(v uint64) {
		t.Helper()
		testkit.Eventually(t, 2*time.Minute, "the collector at the new version", func() bool {
			select {
			case err := <-done:
				done <- err // for the deferred wait
				t.Fatalf("Run returned %v while the cluster failed over", err)
			default:
			}
			return col.Version() >= v
		})
		cur := col.Current()
		if got, want := sha256.Sum256(cur.Blob), sums[v]; cur.Version != v || !bytes.Equal(got[:], want[:]) {
			t.Fatalf("the collector runs v%d, whose bytes are not v%d's", cur.Version, v)
		}
	}
	at(1)
	p1.kill() // the collector is streaming from p1
	c.leader(l1.Epoch)
	for v := uint64(2); v <= 4; v++ {
		publish(v)
	}
	at(4)
}
