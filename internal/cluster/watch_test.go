package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A Reader's leader watch does not go deaf with a silent etcd member
// (SIGSTOPped: its sockets stay open and it answers nothing, as a member
// whose machine was cut off or died): each member of a three-member etcd
// is stopped in turn, and while it is stopped the primary changes; the watch reports the new primary before
// the member is resumed. Before, the watch stayed on the stopped
// member's connection until gRPC's keepalive gave up on it (≥ 12 s), and
// the 9 s each round allows ran out.
func TestWatchLeaderPassesOverASilentMember(t *testing.T) {
	es := clustertest.StartCluster(t, 3)
	r, err := OpenReader(Config{Endpoints: clustertest.Endpoints(es), Cluster: "deaf", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	waitFor := leaderWatch(ctx, &wg, r)
	// A primary on endpoint ep only (so that closing it never waits on
	// a stopped member).
	elect := func(ep int, id string) *Member {
		t.Helper()
		return electOn(ctx, t, Config{Endpoints: []string{es[ep].Endpoint}, Cluster: "deaf"}, id)
	}
	prev := elect(2, "1000")
	if _, ok := waitFor("127.0.0.1:1000", 20*time.Second); !ok {
		prev.Close()
		t.Fatal("the watch never reported the first primary")
	}
	var epoch uint64
	for i := range es {
		prev.Close() // the term ends: no primary until the next one's
		es[i].Stop()
		stopped := time.Now()
		next := (i + 1) % len(es)
		id := fmt.Sprint(1001 + i)
		prev = elect(next, id)
		elected := time.Since(stopped)
		// Within 9 s of the stop, or 3 s of the election if etcd took
		// longer to elect a leader of its own (when the stopped member was
		// its leader).
		l, ok := waitFor("127.0.0.1:"+id, max(9*time.Second-elected, 3*time.Second))
		es[i].Cont()
		if !ok {
			prev.Close()
			t.Fatalf("member %d stopped: the new primary %s (elected after %v) was not reported in time (the watch moved %d times)", i, id, elected.Round(time.Millisecond), r.eps.passed.Load())
		}
		if l.Epoch <= epoch {
			t.Errorf("member %d stopped: epoch %d after %d", i, l.Epoch, epoch)
		}
		epoch = l.Epoch
		t.Logf("member %d stopped: new primary elected %v and reported %v after the stop", i, elected.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
		es[i].Wait()
	}
	prev.Close()
	// Whichever member the watch started on was stopped in a round (it
	// moves only forward, and only off a member that fails it): it moved.
	if r.eps.passed.Load() == 0 {
		t.Fatal("the watch never moved to another endpoint")
	}
}

// leaderWatch runs r.WatchLeader until ctx ends (wg waits for it) and
// returns waitFor, which waits up to within for the watch to report addr
// as the primary.
func leaderWatch(ctx context.Context, wg *sync.WaitGroup, r *Reader) (waitFor func(addr string, within time.Duration) (Leader, bool)) {
	seen := make(chan Leader, 64)
	wg.Go(func() {
		_ = r.WatchLeader(ctx, func(l Leader) {
			select {
			case seen <- l:
			default: // the test reads them all; never block the watch
			}
		})
	})
	return func(addr string, within time.Duration) (Leader, bool) {
		deadline := time.After(within)
		for {
			select {
			case l := <-seen:
				if l.Addr == addr {
					return l, true
				}
			case <-deadline:
				return Leader{}, false
			}
		}
	}
}

// electOn joins id (at 127.0.0.1:id) with cfg, whose endpoints it alone
// uses, and campaigns until elected (20 s at most), with a 30 s lease
// that outlives a test's stops and cuts.
func electOn(ctx context.Context, t *testing.T, cfg Config, id string) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cfg.ID, cfg.Addr, cfg.LeaseTTL, cfg.Logger = id, "127.0.0.1:"+id, 30*time.Second, testkit.Logger()
	m, err := Join(ctx, cfg)
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	if _, err := m.Campaign(ctx); err != nil {
		m.Close()
		t.Fatalf("campaign %s: %v", id, err)
	}
	return m
}

// A Reader's reads pass over a silent etcd member too: with a follower
// of a three-member etcd stopped, every Status answers within its 5 s
// (the calls that start at the stopped member's client move on after
// readerAttempt). Before, the Reader's one client spread its calls over
// the members' connections, and those sent to the stopped member waited
// until gRPC's keepalive gave up on it (≥ 12 s), past their deadline.
func TestReaderReadsPassOverASilentMember(t *testing.T) {
	es := clustertest.StartCluster(t, 3)
	r, err := OpenReader(Config{Endpoints: clustertest.Endpoints(es), Cluster: "deaf", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.eps.eps { // every endpoint's client connected, and the Reader's own
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := r.eps.client(cctx, i)
		if err == nil {
			_, err = r.cli.Get(cctx, "warm")
		}
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	stopped := (etcdLeader(t, es) + 1) % len(es)
	es[stopped].Stop()
	defer es[stopped].Wait()
	defer es[stopped].Cont()
	for i := range 2 * len(es) {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.Status(cctx)
		cancel()
		if err != nil {
			t.Fatalf("read %d with member %d stopped: %v", i, stopped, err)
		}
	}
	if r.eps.passed.Load() == 0 {
		t.Fatal("no read started at the stopped member: the test proves nothing")
	}
}
