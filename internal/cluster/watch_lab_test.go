package cluster

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A Reader's leader watch leaves an etcd member cut off from its peers
// (a partition between etcd's machines, not between the member and its
// clients): three members on three lab hosts; the member the watch is on
// is cut off from the other two, which elect a new primary meanwhile. The
// cut-off member keeps the watch open and answers its progress requests
// from memory, but no event reaches it: only the watch's leader
// requirement (etcd cancels it once its member has no leader) moves it
// to a member that hears the election. The new primary must be reported
// while the member is still cut off. Without WithRequireLeader the watch
// stays where it is, deaf, until the partition heals.
func TestWatchLeaderLeavesAMemberCutOffFromItsPeers(t *testing.T) {
	lab := testkit.NewLab(t, "m1", "m2", "m3")
	e := clustertest.StartOnLab(t, lab.Hosts, "--pre-vote")
	eps := strings.Split(e.Endpoints, ",")
	r, err := OpenReader(Config{Endpoints: eps, Cluster: "cut", Logger: testkit.Logger(), Security: EtcdSecurity{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// A primary through endpoint ep alone.
	elect := func(ep int, id string) *Member {
		t.Helper()
		return electOn(ctx, t, Config{Endpoints: []string{eps[ep]}, Cluster: "cut", Security: EtcdSecurity{Insecure: true}}, id)
	}
	first := elect(0, "1000")
	defer first.Close() // after the heal: it joined through m1 alone
	// The member the watch is on is the one whose count of watchers it
	// raises (etcd's, at each member; the campaign's watch may linger).
	counts := func() []int {
		var ns []int
		for _, ep := range eps {
			ns = append(ns, watchers(t, ep))
		}
		return ns
	}
	before := counts()
	waitFor := leaderWatch(ctx, &wg, r)
	l1, ok := waitFor("127.0.0.1:1000", 20*time.Second)
	if !ok {
		t.Fatal("the watch never reported the first primary")
	}

	w, now := -1, []int(nil)
	defer func() { t.Logf("etcd's watchers at each member: %v before the watch, %v with it", before, now) }()
	testkit.Eventually(t, 10*time.Second, "one member with the watch", func() bool {
		w = -1
		now = counts()
		for i, n := range now {
			if n > before[i] {
				if w >= 0 {
					return false
				}
				w = i
			}
		}
		return w >= 0
	})
	cut := lab.Hosts[w]
	var peers []*testkit.Host
	for i, h := range lab.Hosts {
		if i != w {
			peers = append(peers, h)
		}
	}
	passed := r.eps.passed.Load()
	cut.CutFrom(t, peers...)
	defer cut.HealFrom(t, peers...)
	cutAt := time.Now()
	// The term ends through a live member (first may have joined the
	// cut-off one): its key deleted, as its lease running out would.
	live := (w + 1) % len(eps)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{eps[live]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// (Retried while the two elect a leader of their own, when the cut-off
	// member was etcd's.)
	testkit.Eventually(t, 30*time.Second, "the first term ended through a live member", func() bool {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		_, err := cli.Delete(dctx, r.cfg.electionPrefix(), clientv3.WithPrefix())
		return err == nil
	})
	next := elect(live, "1001")
	defer next.Close()
	elected := time.Since(cutAt)
	l2, ok := waitFor("127.0.0.1:1001", 30*time.Second)
	if !ok {
		t.Fatalf("the watch on %s, cut off from its peers, never reported the primary elected meanwhile (it moved %d times)", cut.Name, r.eps.passed.Load()-passed)
	}
	t.Logf("watch on %s; cut off: new primary elected after %v, reported after %v; the watch moved %d times",
		cut.Name, elected.Round(time.Millisecond), time.Since(cutAt).Round(time.Millisecond), r.eps.passed.Load()-passed)
	if l2.Epoch <= l1.Epoch {
		t.Errorf("epoch %d after %d", l2.Epoch, l1.Epoch)
	}
	if r.eps.passed.Load() == passed {
		t.Error("the new primary was reported, yet the watch never left the cut-off member")
	}
}

// watchers is etcd's count of watchers at the member at ep ("IP:2379"):
// its etcd_debugging_mvcc_watcher_total gauge.
func watchers(t *testing.T, ep string) int {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + ep + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", ep, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics of %s: %q", ep, sc.Text())
			}
			return int(n)
		}
	}
	t.Fatalf("metrics of %s: no etcd_debugging_mvcc_watcher_total (%v)", ep, sc.Err())
	return 0
}
