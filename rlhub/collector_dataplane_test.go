package rlhub_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// A ViaDataPlane collector given a cluster (etcd://…) follows the
// primary's data plane; given a relay's address (a relay serves no data
// plane) it follows the relay's gRPC push stream.
func TestCollectorViaDataPlaneOnClusterAndRelay(t *testing.T) {
	e := clustertest.Start(t)
	const cluster, model = "godp", "policy"
	dir := t.TempDir()
	testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: filepath.Join(dir, "addr"), Args: []string{
		"serve", "--etcd", e.Endpoint, "--cluster", cluster, "--listen", "127.0.0.1:0", "--addr-file", filepath.Join(dir, "addr"),
		"--data", filepath.Join(dir, "data"), "--lease-ttl", "1s", "--member-id", "h"}})
	target := "etcd://" + strings.TrimPrefix(e.Endpoint, "http://") + "/" + cluster
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: target})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testkit.Eventually(t, time.Minute, "the hub to serve as primary", func() bool {
		_, err := s.Push(ctx, model, 1, 0, weights(1))
		return err == nil
	})
	seg := filepath.Join("/dev/shm", fmt.Sprintf("rlhub-godp-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() { os.Remove(seg) })
	testkit.StartProc(t, testkit.ProcConfig{Name: "relay", Args: []string{
		"relay", "--etcd", e.Endpoint, "--cluster", cluster, "--model", model, "--id", "r", "--listen", "127.0.0.1:0",
		"--shm", seg}})
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
