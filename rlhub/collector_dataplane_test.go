package rlhub_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// A ViaDataPlane collector given a cluster (etcd://…) follows the
// primary's data plane; given a relay's address (a relay serves no data
// plane) it follows the relay's gRPC push stream.
func TestCollectorViaDataPlaneOnClusterAndRelay(t *testing.T) {
	const model = "policy"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := startEtcdCluster(t, ctx, "godp", model)
	target := cl.target
	seg := filepath.Join("/dev/shm", fmt.Sprintf("rlhub-godp-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() { os.Remove(seg) })
	cl.startRelay(t, "relay", model, seg)
	var relayAddr string
	testkit.Eventually(t, time.Minute, "the relay announced in etcd", func() bool {
		a, ok, err := dial.Config{}.CollectorTarget(ctx, target, model)
		relayAddr = a
		return err == nil && ok
	})
	for _, tc := range []struct{ name, hub, transport string }{{"cluster", target, "dataplane"}, {"relay", relayAddr, "grpc"}} {
		local := weights(0)
		c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: tc.hub, Model: model, Via: rlhub.ViaDataPlane,
			CollectorID: "go-dp-" + tc.name, Weights: local, Logger: testkit.Logger()})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		stop := running(ctx, c)
		testkit.Eventually(t, time.Minute, tc.name+": the collector at v1", func() bool { return c.Version() >= 1 })
		if got := c.Transport(); got != tc.transport {
			t.Errorf("%s: transport %q, want %q", tc.name, got, tc.transport)
		}
		stop()
		c.Close()
	}
}
