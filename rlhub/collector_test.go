package rlhub_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// dataPlaneHub starts a hub on 127.0.0.1:0; noDataPlane keeps its store
// and weight sync on gRPC only (a hub that predates the data plane).
// policyHub is dataPlaneHub holding "policy" v1 (weights(1)), with a
// store client of it that the test's cleanup closes.
func policyHub(t *testing.T, ctx context.Context, noDataPlane bool) (string, *rlhub.StoreClient) {
	t.Helper()
	addr := dataPlaneHub(t, noDataPlane)
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	return addr, s
}

func dataPlaneHub(t *testing.T, noDataPlane bool) string {
	t.Helper()
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), StoreNoDataPlane: noDataPlane})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Addr().String()
}

// running runs c until the returned stop is called, which waits for Run
// to return.
func running(ctx context.Context, c *rlhub.Collector) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	return func() { cancel(); <-done }
}

// A ViaDataPlane collector follows the hub's push fan-out on the data
// plane, writing each version into its weights; against a hub without the
// data plane it falls back to the gRPC push stream and still gets every
// version.
func TestCollectorViaDataPlane(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noDataPlane bool
		transport   string
	}{{"data plane", false, "dataplane"}, {"fallback to gRPC", true, "grpc"}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			addr, s := policyHub(t, ctx, tc.noDataPlane)
			local := weights(0)
			c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaDataPlane,
				CollectorID: "go-dp", Weights: local})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			defer running(ctx, c)()
			for v := uint64(1); v <= 3; v++ {
				if v > 1 {
					if _, err := s.Push(ctx, "policy", v, v-1, weights(float32(v))); err != nil {
						t.Fatal(err)
					}
				}
				testkit.Eventually(t, 20*time.Second, "the collector at the new version", func() bool { return c.Version() == v })
				w, _ := local.Get("w").Float32s()
				if w[0] != float32(v) || w[1] != -float32(v) {
					t.Fatalf("version %d: weights %v", v, w)
				}
			}
			if got := c.Transport(); got != tc.transport {
				t.Fatalf("transport %q, want %q", got, tc.transport)
			}
		})
	}
	if _, err := rlhub.NewCollector(context.Background(), rlhub.CollectorConfig{Hub: "127.0.0.1:1", Model: "m", Via: "carrier-pigeon"}); err == nil {
		t.Fatal("an unknown Via was accepted")
	}
}

// etcdCluster is a cluster of one `rlhub serve` process on a real etcd,
// holding model v1 (weights(1)) once it serves as primary.
type etcdCluster struct {
	endpoint, name, target string
	store                  *rlhub.StoreClient // of target; the test's cleanup closes it
}

func startEtcdCluster(t *testing.T, ctx context.Context, name, model string) *etcdCluster {
	t.Helper()
	e := clustertest.Start(t)
	dir := t.TempDir()
	testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: filepath.Join(dir, "addr"), Args: []string{
		"serve", "--etcd", e.Endpoint, "--cluster", name, "--listen", "127.0.0.1:0", "--addr-file", filepath.Join(dir, "addr"),
		"--data", filepath.Join(dir, "data"), "--lease-ttl", "1s", "--member-id", "h"}})
	cl := &etcdCluster{endpoint: e.Endpoint, name: name, target: "etcd://" + strings.TrimPrefix(e.Endpoint, "http://") + "/" + name}
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: cl.target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testkit.Eventually(t, time.Minute, "the hub to serve as primary", func() bool {
		_, err := s.Push(ctx, model, 1, 0, weights(1))
		return err == nil
	})
	cl.store = s
	return cl
}

// startRelay starts `rlhub relay` of model on the cluster, its segment at seg.
func (cl *etcdCluster) startRelay(t *testing.T, name, model, seg string) *testkit.Proc {
	t.Helper()
	return testkit.StartProc(t, testkit.ProcConfig{Name: name, Args: []string{
		"relay", "--etcd", cl.endpoint, "--cluster", cl.name, "--model", model, "--id", "r", "--listen", "127.0.0.1:0",
		"--shm", seg}})
}

// A ViaPush collector given etcd://… takes the push stream of the relay
// announced for its model on this host (a real `rlhub relay --etcd`), and
// when the relay is SIGKILLed, continues from the cluster's primary.
func TestCollectorViaPushOnEtcdPrefersThisHostsRelay(t *testing.T) {
	const model = "policy"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := startEtcdCluster(t, ctx, "gorelay", model)
	s, target := cl.store, cl.target
	seg := filepath.Join("/dev/shm", fmt.Sprintf("rlhub-gorelay-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() { os.Remove(seg) })
	relay := cl.startRelay(t, "relay", model, seg)
	testkit.Eventually(t, time.Minute, "the relay announced in etcd, holding v1", func() bool {
		_, ok, err := dial.Config{}.CollectorTarget(ctx, target, model)
		_, serr := os.Stat(seg) // written with the relay's first version
		return err == nil && ok && serr == nil
	})
	local := weights(0)
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: target, Model: model, CollectorID: "go-relay",
		Weights: local, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer running(ctx, c)()
	at := func(v uint64) {
		t.Helper()
		testkit.Eventually(t, time.Minute, fmt.Sprintf("the collector at v%d", v), func() bool { return c.Version() >= v })
		if w, err := local.Tensors()[0].Float32s(); err != nil || w[0] != float32(v) || w[1] != -float32(v) {
			t.Fatalf("weights %v (%v) at v%d", w, err, v)
		}
	}
	at(1)
	if c.Transport() != "relay" {
		t.Fatalf("Transport %q with a relay on this host, want relay", c.Transport())
	}
	relay.Kill()
	if _, err := s.Push(ctx, model, 2, 1, weights(2)); err != nil {
		t.Fatal(err)
	}
	at(2)
	if c.Transport() != "push" {
		t.Fatalf("Transport %q after the relay died, want push (the primary)", c.Transport())
	}
	// The relay is started again (its dead predecessor's entry waited
	// out): the collector goes back to it by itself, at a probe.
	cl.startRelay(t, "relay again", model, seg)
	testkit.Eventually(t, time.Minute, "the collector back on the restarted relay", func() bool { return c.Transport() == "relay" })
	if _, err := s.Push(ctx, model, 3, 2, weights(3)); err != nil {
		t.Fatal(err)
	}
	at(3)
	if c.Transport() != "relay" {
		t.Fatalf("Transport %q taking v3 with the relay back, want relay", c.Transport())
	}
}
