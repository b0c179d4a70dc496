package replica_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// delivery is one version a collector applied.
type delivery struct {
	version, epoch uint64
	sum            [32]byte
	at             time.Time
}

// followingCollector is a Receiver over a Source that follows a cluster,
// recording every version it applies (with a hash of its bytes, taken
// while the snapshot is valid).
type followingCollector struct {
	name    string
	src     wsync.Source
	skipped func() uint64 // version numbers the source reported or saw skipped
	closer  func()
	recv    *wsync.Receiver
	mu      sync.Mutex
	got     []delivery
	done    chan error
}

func startFollowing(t *testing.T, ctx context.Context, wg *sync.WaitGroup, name string, src interface {
	wsync.Source
	Skipped() uint64
	Close() error
}) *followingCollector {
	t.Helper()
	fc := &followingCollector{name: name, src: src, skipped: src.Skipped, closer: func() { src.Close() }, done: make(chan error, 1)}
	r, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: src, Apply: func(s *store.Snapshot) error {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		fc.got = append(fc.got, delivery{version: s.Version, epoch: s.Epoch, sum: sha256.Sum256(s.Blob), at: time.Now()})
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	fc.recv = r
	wg.Go(func() { fc.done <- r.Run(ctx) })
	return fc
}

func (fc *followingCollector) deliveries() []delivery {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return append([]delivery(nil), fc.got...)
}

// collectorSet is the three kinds of weight collector given only a
// cluster: the Go data-plane client (etcd target), the gRPC push stream
// through Failover (hub-list target), and a Failover over the data plane
// (etcd target).
type collectorSet struct {
	all    []*followingCollector
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startCollectors(t *testing.T, c *testCluster, etcd, model string) (*collectorSet, *wsync.DataPlaneClient) {
	t.Helper()
	etcdTarget := dial.EtcdTarget(strings.TrimPrefix(etcd, "http://"), c.name)
	var hubs []string
	for _, h := range c.hubs {
		hubs = append(hubs, h.addr)
	}
	listTarget := strings.Join(hubs, ",")
	cfg := dial.Config{}
	conn := func(target string) *grpc.ClientConn {
		cc, err := cfg.GRPC(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &collectorSet{cancel: cancel}

	dpConn := conn(etcdTarget)
	dp, err := wsync.NewDataPlaneClient(wsync.DataPlaneConfig{Addr: etcdTarget, Conn: dpConn, Bulk: cfg.Bulk(),
		CollectorID: "go-dp", Model: model, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "go data plane (etcd)", dp))

	pushConn := conn(listTarget)
	push, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.PushDialer("push", pushConn, "go-push", model)}})
	if err != nil {
		t.Fatal(err)
	}
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "go push stream (hub list)", push))

	fdConn := conn(etcdTarget)
	fd, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.DataPlaneDialer("dp", etcdTarget, cfg.Bulk(), fdConn, "go-failover-dp", model)}})
	if err != nil {
		t.Fatal(err)
	}
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "go failover over the data plane (etcd)", fd))
	t.Cleanup(s.stop)
	return s, dp
}

func (s *collectorSet) stop() {
	s.cancel()
	s.wg.Wait()
	for _, fc := range s.all {
		fc.closer()
	}
	s.all = nil
}

// waitAll waits until every collector applied version v, failing with
// what each one runs.
func (s *collectorSet) waitAll(t *testing.T, timeout time.Duration, v uint64) {
	t.Helper()
	testkit.Eventually(t, timeout, fmt.Sprintf("every collector on v%d", v), func() bool {
		for _, fc := range s.all {
			select {
			case err := <-fc.done:
				t.Fatalf("collector %s stopped: %v", fc.name, err)
			default:
			}
			if fc.recv.Version() < v {
				return false
			}
		}
		return true
	})
}

// TestCollectorsFollowThePrimaryAcrossTwoKills: three `serve --etcd`
// hubs on a real etcd; weight collectors given only the cluster (etcd or
// the hub list) follow the primary while it is SIGKILLed twice: every one
// ends on the final version; each applied versions that only grow, with
// epochs that never go back, and every version's bytes are the ones
// published under that number (no deposed or stale primary's version).
func TestCollectorsFollowThePrimaryAcrossTwoKills(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs and two failovers")
	}
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	const model = "pol"
	sums := map[uint64][32]byte{}
	epochs := map[uint64]uint64{}
	publish := func(v uint64) {
		t.Helper()
		blob := storetest.Blob(t, v, 1024)
		info := c.push(model, v, v-1, blob)
		sums[v], epochs[v] = sha256.Sum256(blob), info.Epoch
	}
	l1, p1 := c.leader(0)
	publish(1)
	set, dp := startCollectors(t, c, e.Endpoint, model)
	for v := uint64(2); v <= 5; v++ {
		publish(v)
	}
	set.waitAll(t, time.Minute, 5)

	p1.kill() // the collectors are long-polling / streaming from p1
	l2, p2 := c.leader(l1.Epoch)
	for v := uint64(6); v <= 10; v++ {
		publish(v)
	}
	set.waitAll(t, 2*time.Minute, 10)

	p2.kill()
	l3, _ := c.leader(l2.Epoch)
	for v := uint64(11); v <= 15; v++ {
		publish(v)
	}
	set.waitAll(t, 2*time.Minute, 15)

	if epochs[15] != l3.Epoch || epochs[6] != l2.Epoch {
		t.Fatalf("versions landed in epochs %d (v6) and %d (v15), want the terms %d and %d", epochs[6], epochs[15], l2.Epoch, l3.Epoch)
	}
	for _, fc := range set.all {
		got := fc.deliveries()
		for i, d := range got {
			if want, ok := sums[d.version]; !ok || !bytes.Equal(d.sum[:], want[:]) {
				t.Errorf("%s: applied v%d (epoch %d) whose bytes are not the version published as v%d", fc.name, d.version, d.epoch, d.version)
			}
			if d.epoch != epochs[d.version] {
				t.Errorf("%s: applied v%d of epoch %d, published in epoch %d", fc.name, d.version, d.epoch, epochs[d.version])
			}
			if i > 0 && (d.version <= got[i-1].version || d.epoch < got[i-1].epoch) {
				t.Errorf("%s: applied v%d (epoch %d) after v%d (epoch %d)", fc.name, d.version, d.epoch, got[i-1].version, got[i-1].epoch)
			}
		}
		last := got[len(got)-1]
		// Every version number is accounted for: before the first
		// delivery, applied, or counted as skipped.
		if n := got[0].version - 1 + uint64(len(got)) + fc.skipped(); n != last.version {
			t.Errorf("%s: first v%d, %d applied, %d skipped: %d version numbers for v%d", fc.name, got[0].version, len(got), fc.skipped(), n, last.version)
		}
		t.Logf("%s: %d versions applied (first v%d), %d skipped, last v%d epoch %d", fc.name, len(got), got[0].version, fc.skipped(), last.version, last.epoch)
	}
	if tr := dp.Transport(); tr != "dataplane" {
		t.Errorf("the data-plane collector ended on transport %q: a failover made it fall back", tr)
	}
	t.Logf("terms: %s → %s → %s", l1, l2, l3)
}
