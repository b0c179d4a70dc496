package dial

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A RelayFinder learns this host's relay of its model from the watch
// (announced, replaced, withdrawn; other models and hosts ignored) and,
// once it has a list, answers from memory: with etcd killed it still
// answers at once, where a lookup per call would fail.
func TestRelayFinderFollowsAnnouncementsFromMemory(t *testing.T) {
	e := clustertest.Start(t)
	const name, model = "finder", "policy"
	cfg := cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name, LeaseTTL: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := Config{}.FindRelays("etcd://"+strings.TrimPrefix(e.Endpoint, "http://")+"/"+name, model)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	local := func() (string, bool) {
		t.Helper()
		addr, ok, err := f.Local(ctx)
		if err != nil {
			t.Fatalf("Local: %v", err)
		}
		return addr, ok
	}
	if addr, ok := local(); ok {
		t.Fatalf("a relay at %s before any was announced", addr)
	}
	announce := func(info cluster.ServiceInfo) *cluster.Announcement {
		t.Helper()
		info.Kind = cluster.KindRelay
		a, err := cluster.Announce(ctx, cfg, info)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	announce(cluster.ServiceInfo{ID: "other-model", Addr: "127.0.0.1:1", Model: "critic"})
	announce(cluster.ServiceInfo{ID: "other-host", Addr: "127.0.0.1:2", Model: model, Host: "not-this-host"})
	a := announce(cluster.ServiceInfo{ID: "r1", Addr: "127.0.0.1:3", Model: model})
	testkit.Eventually(t, 30*time.Second, "the finder to see r1", func() bool {
		addr, ok := local()
		return ok && addr == "127.0.0.1:3"
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the finder to see r1 withdrawn", func() bool {
		_, ok := local()
		return !ok
	})
	announce(cluster.ServiceInfo{ID: "r2", Addr: "127.0.0.1:4", Model: model})
	testkit.Eventually(t, 30*time.Second, "the finder to see r2", func() bool {
		addr, ok := local()
		return ok && addr == "127.0.0.1:4"
	})
	e.Kill()
	short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer stop()
	if addr, ok, err := f.Local(short); err != nil || !ok || addr != "127.0.0.1:4" {
		t.Fatalf("with etcd down: %q %v %v, want r2's address from memory", addr, ok, err)
	}
	if err := f.Close(); err != nil {
		t.Logf("Close with etcd down: %v", err)
	}
}

// Before its first list a RelayFinder waits at most its caller's context,
// then says etcd did not answer; a target without etcd has no relays.
func TestRelayFinderWithoutAnAnswer(t *testing.T) {
	f, err := Config{}.FindRelays("127.0.0.1:7070", "policy")
	if err != nil || f != nil {
		t.Fatalf("a hub address: %v, %v", f, err)
	}
	if addr, ok, err := f.Local(context.Background()); addr != "" || ok || err != nil {
		t.Fatalf("nil finder: %q %v %v", addr, ok, err)
	}
	// An etcd endpoint nobody listens on.
	f, err = Config{}.FindRelays("etcd://127.0.0.1:1/none", "policy")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, ok, err := f.Local(ctx); err == nil || ok || !strings.Contains(err.Error(), "no answer from etcd") {
		t.Fatalf("Local with etcd unreachable: %v %v", ok, err)
	}
}

// $RLHUB_HOST names the machine for both sides: a relay announced without
// a host is announced under it, and a collector's lookups (RelayFinder,
// CollectorTarget) match it rather than the hostname — two pods on one
// Kubernetes node have different hostnames but the same node name. A
// value that is not a host name is refused, by both sides, without being
// echoed.
func TestRelaysAreMatchedByRLHUBHost(t *testing.T) {
	e := clustertest.Start(t)
	const name, model = "nodes", "policy"
	cfg := cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name, LeaseTTL: 2 * time.Second}
	target := "etcd://" + strings.TrimPrefix(e.Endpoint, "http://") + "/" + name
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(cluster.HostEnv, "node-7")
	for _, info := range []cluster.ServiceInfo{
		{Kind: cluster.KindRelay, ID: "by-hostname", Addr: "127.0.0.1:1", Model: model, Host: hostname},
		{Kind: cluster.KindRelay, ID: "on-node-7", Addr: "127.0.0.1:2", Model: model},
	} {
		a, err := cluster.Announce(ctx, cfg, info)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
	}
	f, err := Config{}.FindRelays(target, model)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	testkit.Eventually(t, 30*time.Second, "the finder to pick node-7's relay", func() bool {
		addr, ok, err := f.Local(ctx)
		return err == nil && ok && addr == "127.0.0.1:2"
	})
	if addr, relay, err := (Config{}).CollectorTarget(ctx, target, model); err != nil || !relay || addr != "127.0.0.1:2" {
		t.Fatalf("CollectorTarget: %q %v %v, want node-7's relay", addr, relay, err)
	}

	bad := "node 7\n" + strings.Repeat("x", 300)
	t.Setenv(cluster.HostEnv, bad)
	if _, err := (Config{}).FindRelays(target, model); !errors.Is(err, errs.ErrInvalid) || strings.Contains(err.Error(), "xxx") || !strings.Contains(err.Error(), cluster.HostEnv) {
		t.Errorf("FindRelays with a bad $%s: %v, want ErrInvalid naming the variable, not its value", cluster.HostEnv, err)
	}
	if _, err := cluster.Announce(ctx, cfg, cluster.ServiceInfo{Kind: cluster.KindRelay, ID: "r9", Addr: "127.0.0.1:9", Model: model}); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("Announce with a bad $%s: %v, want ErrInvalid", cluster.HostEnv, err)
	}
}
