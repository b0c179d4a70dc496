package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// Relays announced in etcd are listed by kind and model while they live: a
// duplicate id is refused, Close removes one at once, and one whose
// process stopped sending keep-alives drops out after its lease's TTL.
func TestAnnouncedServicesAreListedWhileTheyLive(t *testing.T) {
	e := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{Endpoints: []string{e.Endpoint}, Cluster: "reg", LeaseTTL: time.Second, Logger: testkit.Logger()}
	announce := func(info ServiceInfo) *Announcement {
		t.Helper()
		a, err := Announce(ctx, cfg, info)
		if err != nil {
			t.Fatalf("announce %v: %v", info, err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	r1 := announce(ServiceInfo{Kind: KindRelay, ID: "r1", Addr: "127.0.0.1:1", Model: "m"})
	r2 := announce(ServiceInfo{Kind: KindRelay, ID: "r2", Addr: "127.0.0.1:2", Model: "m"})
	announce(ServiceInfo{Kind: KindRelay, ID: "r3", Addr: "127.0.0.1:3", Model: "other"})
	announce(ServiceInfo{Kind: KindSecondary, ID: "s1", Addr: "127.0.0.1:4"})
	if _, err := Announce(ctx, cfg, ServiceInfo{Kind: KindRelay, ID: "r1", Addr: "127.0.0.1:9", Model: "m"}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("a second r1: %v, want ErrExists", err)
	}
	for _, bad := range []ServiceInfo{{Kind: "relay", ID: "a b", Addr: "x:1"}, {Kind: "", ID: "a", Addr: "x:1"}, {Kind: "relay", ID: "a"}} {
		if _, err := Announce(ctx, cfg, bad); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("announce %+v: %v, want ErrInvalid", bad, err)
		}
	}
	rd, err := OpenReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ids := func(kind, model string) []string {
		t.Helper()
		ss, err := rd.Services(ctx, kind, model)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range ss {
			out = append(out, s.ID)
		}
		return out
	}
	if got := ids(KindRelay, "m"); len(got) != 2 || got[0] != "r1" || got[1] != "r2" {
		t.Fatalf("relays of m: %v", got)
	}
	if got := ids("", ""); len(got) != 4 {
		t.Fatalf("every service: %v", got)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ids(KindRelay, "m"); len(got) != 1 || got[0] != "r2" {
		t.Fatalf("after r1 closed: %v", got)
	}
	// r2's process "dies": its etcd client goes, no keep-alive follows.
	r2.cli.Close()
	testkit.Eventually(t, 15*time.Second, "r2 to drop out after its TTL", func() bool { return len(ids(KindRelay, "m")) == 0 })
}

// A process restarted at once after kill -9 finds its predecessor's
// announcement still there: Announce waits it out (the lease's TTL) instead
// of refusing, and the restarted process's entry is the one listed.
func TestAnnounceWaitsOutADeadPredecessor(t *testing.T) {
	e := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{Endpoints: []string{e.Endpoint}, Cluster: "reg2", LeaseTTL: time.Second, Logger: testkit.Logger()}
	old, err := Announce(ctx, cfg, ServiceInfo{Kind: KindRelay, ID: "r", Addr: "127.0.0.1:1", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	old.cli.Close() // the process dies: no keep-alive, no revoke
	a, err := Announce(ctx, cfg, ServiceInfo{Kind: KindRelay, ID: "r", Addr: "127.0.0.1:2", Model: "m"})
	if err != nil {
		t.Fatalf("announce after the predecessor died: %v", err)
	}
	defer a.Close()
	rd, err := OpenReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ss, err := rd.Services(ctx, KindRelay, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 || ss[0].Addr != "127.0.0.1:2" {
		t.Fatalf("relays after the restart: %+v, want only the new one", ss)
	}
	// A live holder is still refused (after the wait).
	if _, err := Announce(ctx, cfg, ServiceInfo{Kind: KindRelay, ID: "r", Addr: "127.0.0.1:3", Model: "m"}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("a second r while the first lives: %v, want ErrExists", err)
	}
}

// WatchServices reports the list at the start and after every change, and
// keeps reporting after etcd restarts (the watch is opened again from a
// fresh list); it returns when its context ends.
func TestWatchServicesFollowsChangesAcrossAnEtcdRestart(t *testing.T) {
	e := clustertest.Start(t)
	cfg := Config{Endpoints: []string{e.Endpoint}, Cluster: "watch", LeaseTTL: time.Second, DialTimeout: 2 * time.Second, Logger: testkit.Logger()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rd, err := OpenReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	lists := make(chan []string, 64)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- rd.WatchServices(wctx, KindSecondary, func(ss []ServiceInfo) {
			var ids []string
			for _, s := range ss {
				ids = append(ids, s.ID+"@"+s.Addr+"/"+strings.Join(s.Secondaries, "+"))
			}
			lists <- ids
		})
	}()
	want := func(what string, ids ...string) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, what, func() bool {
			select {
			case got := <-lists:
				return strings.Join(got, ",") == strings.Join(ids, ",")
			default:
				return false
			}
		})
	}
	want("the empty list first")
	a, err := Announce(ctx, cfg, ServiceInfo{Kind: KindSecondary, ID: "a", Addr: "127.0.0.1:1", Secondaries: []string{"s0", "s1"}})
	if err != nil {
		t.Fatal(err)
	}
	want("a announced", "a@127.0.0.1:1/s0+s1")
	// A relay is another kind: not reported.
	r, err := Announce(ctx, cfg, ServiceInfo{Kind: KindRelay, ID: "r", Addr: "127.0.0.1:3"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a.Close()
	want("a withdrawn")
	e.Kill()
	e.Restart()
	b, err := Announce(ctx, cfg, ServiceInfo{Kind: KindSecondary, ID: "b", Addr: "127.0.0.1:2", Secondaries: []string{"s0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want("b announced after etcd restarted", "b@127.0.0.1:2/s0")
	stop()
	if err := testkit.Recv(t, done, 10*time.Second, "WatchServices to return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("WatchServices returned %v", err)
	}
}
