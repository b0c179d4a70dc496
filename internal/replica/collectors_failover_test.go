package replica_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
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

func startFollowing(t testing.TB, ctx context.Context, wg *sync.WaitGroup, name string, src interface {
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

// collectorSet is the kinds of weight collector given only a cluster: the
// Go data-plane client (etcd target), the gRPC push stream through
// Failover (hub-list target), a Failover over the data plane (etcd
// target), and a reader of the shared memory a `rlhub relay --etcd`
// process fills (through Failover, which waits for its segment).
type collectorSet struct {
	conns  []*grpc.ClientConn // of all, by index (nil: none)
	relay  *testkit.Proc
	all    []*followingCollector
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startCollectors(t testing.TB, c *testCluster, etcd, model string) (*collectorSet, *wsync.DataPlaneClient) {
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
	s.conns = append(s.conns, dpConn)

	pushConn := conn(listTarget)
	push, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.PushDialer("push", pushConn, "go-push", model)}})
	if err != nil {
		t.Fatal(err)
	}
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "go push stream (hub list)", push))
	s.conns = append(s.conns, pushConn)

	// A relay given only etcd, and a collector on its segment.
	segment := fmt.Sprintf("/dev/shm/rlhub-follow-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(segment) }) // after the relay is killed (cleanups run last first)
	s.relay = testkit.StartProc(t, testkit.ProcConfig{Name: "relay", Args: []string{"--log-level", "warn", "relay",
		"--etcd", etcd, "--cluster", c.name, "--model", model, "--listen", "127.0.0.1:0", "--shm", segment}})
	sh, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.ShmDialer("relay-shm", segment, model)}})
	if err != nil {
		t.Fatal(err)
	}

	fdConn := conn(etcdTarget)
	fd, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.DataPlaneDialer("dp", etcdTarget, cfg.Bulk(), fdConn, "go-failover-dp", model)}})
	if err != nil {
		t.Fatal(err)
	}
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "go failover over the data plane (etcd)", fd))
	s.conns = append(s.conns, fdConn)
	s.all = append(s.all, startFollowing(t, ctx, &s.wg, "relay (etcd) shm", sh))
	s.conns = append(s.conns, nil)
	t.Cleanup(s.stop)
	t.Cleanup(func() { // runs before s.stop
		if t.Failed() {
			t.Logf("the collectors at the failure:%s", s.describe())
		}
	})
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
func (s *collectorSet) waitAll(t testing.TB, timeout time.Duration, v uint64) {
	t.Helper()
	testkit.Eventually(t, timeout, fmt.Sprintf("every collector on v%d", v), func() bool {
		select {
		case <-s.relay.Done():
			t.Fatalf("the relay exited:\n%s", s.relay.Output())
		default:
		}
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
	start := time.Now()
	set.waitAll(t, time.Minute, 5)
	t.Logf("every collector on v5 after %v", time.Since(start).Round(time.Millisecond))

	p1.kill() // the collectors are long-polling / streaming from p1
	l2, p2 := c.leader(l1.Epoch)
	for v := uint64(6); v <= 10; v++ {
		publish(v)
	}
	set.waitAll(t, 2*time.Minute, 10)
	t.Logf("every collector on v10 (epoch %d) after %v", l2.Epoch, time.Since(start).Round(time.Millisecond))

	p2.kill()
	l3, _ := c.leader(l2.Epoch)
	for v := uint64(11); v <= 15; v++ {
		publish(v)
	}
	set.waitAll(t, 2*time.Minute, 15)
	t.Logf("every collector on v15 (epoch %d) after %v", l3.Epoch, time.Since(start).Round(time.Millisecond))

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

// firstOfEpochAfter is when fc first applied a version of an epoch above
// epoch (zero when it has not).
func (fc *followingCollector) firstOfEpochAfter(epoch uint64) time.Time {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, d := range fc.got {
		if d.epoch > epoch {
			return d.at
		}
	}
	return time.Time{}
}

// describe says where each collector is (for a failed wait).
func (s *collectorSet) describe() string {
	var b strings.Builder
	for i, fc := range s.all {
		if s.conns[i] != nil {
			p, _ := dial.CurrentPrimary(s.conns[i])
			fmt.Fprintf(&b, "\n  %s: connection %v following %s (epoch %d)", fc.name, s.conns[i].GetState(), p.Addr, p.Epoch)
		}
		got := fc.deliveries()
		if len(got) == 0 {
			fmt.Fprintf(&b, "\n  %s: nothing applied", fc.name)
			continue
		}
		d := got[len(got)-1]
		fmt.Fprintf(&b, "\n  %s: v%d of epoch %d, applied %v ago", fc.name, d.version, d.epoch, time.Since(d.at).Round(time.Millisecond))
	}
	return b.String()
}

// TestDataPlaneCollectorFollowsAStandbysRefusal: a data-plane collector
// whose connection points at a standby (as after a stale lookup) is
// refused there on the data plane, follows the primary the refusal names,
// and gets the version; against a cluster with no hub up it keeps
// following until its context ends, never returning the transport error.
func TestDataPlaneCollectorFollowsAStandbysRefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs")
	}
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	l, p := c.leader(0)
	c.push("pol", 1, 0, storetest.Blob(t, 1, 64))
	var standby *hubProc
	var hubs []string
	for _, h := range c.hubs {
		hubs = append(hubs, h.addr)
		if h != p {
			standby = h
		}
	}
	target := strings.Join(hubs, ",")
	conn, err := dial.Config{}.GRPC(target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testkit.Eventually(t, 30*time.Second, "the connection to find the primary", func() bool {
		cur, ok := dial.CurrentPrimary(conn)
		return ok && cur.Addr == l.Addr
	})
	dp, err := wsync.NewDataPlaneClient(wsync.DataPlaneConfig{Addr: target, Conn: conn, Bulk: dial.Config{}.Bulk(),
		CollectorID: "refused", Model: "pol", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A stale answer names the standby (a lookup in flight may put the
	// primary back first: offered again until a poll lands on the standby).
	var refusal error
	for try := 0; try < 50 && refusal == nil; try++ {
		dial.Offer(conn, dial.Primary{Addr: standby.addr, Epoch: l.Epoch})
		if _, err := dp.GetIfNewer(ctx, 0); err != nil {
			refusal = err
		}
	}
	if _, ok := dial.RefusalText(fmt.Sprint(refusal)); !ok || dp.Follows() == 0 {
		t.Fatalf("no poll was refused by the standby %s (last error %v, %d followed)", standby.addr, refusal, dp.Follows())
	}
	testkit.Eventually(t, 10*time.Second, "the connection on the primary the refusal named", func() bool {
		cur, _ := dial.CurrentPrimary(conn)
		return cur.Addr == l.Addr
	})
	snap, err := dp.WaitNewer(ctx, 0)
	if err != nil || snap.Version != 1 {
		t.Fatalf("WaitNewer after a refusal: %v, %v", snap, err)
	}

	for _, h := range c.hubs {
		h.kill()
	}
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	before := dp.Follows()
	if snap, err := dp.WaitNewer(short, 1); snap != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer with every hub down: %v, %v; want the context's deadline (it keeps following)", snap, err)
	}
	if dp.Follows() <= before {
		t.Fatalf("no failed poll was followed with every hub down")
	}
}
