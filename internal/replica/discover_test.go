package replica_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// startSecondaries runs `serve --role reducer --etcd … --cluster …`: a hub
// of secondary reducers that finds the primary through etcd and announces
// itself there under its member id (not a cluster member: not in c.hubs).
func (c *testCluster) startSecondaries(id string, extra ...string) *hubProc {
	h := &hubProc{t: c.t, id: id, data: c.t.TempDir(), args: append([]string{"--role", "reducer", "--reducer-secondaries", "1"}, extra...)}
	c.start(h)
	return h
}

func knows(rc *reducer.Client, addr string) bool {
	for _, s := range rc.Known() {
		if s.Addr == addr {
			return true
		}
	}
	return false
}

// TestSecondariesDiscoveredFromEtcd: a gradient client given only etcd,
// and told never to poll the primary for secondaries (RefreshEvery < 0),
// learns a secondary started after it from the etcd watch and pushes to
// it; a second secondary joins the same way; the first, SIGKILLed, drops
// out of the client's list when its lease expires, and pushes go to the
// one left. The primary hosts no secondary of its own, so every applied
// push went to a discovered one.
func TestSecondariesDiscoveredFromEtcd(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 1, "--reducer-secondaries", "-1", "--reduce-batch-size", "1")
	c.leader(0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const model = "d"
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{0, 0, 0, 0}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.push(model, 1, 0, blob)
	target := dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), c.name)
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: target, ClientID: "disc", RefreshEvery: -1, MaxAttempts: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	if k := rc.Known(); len(k) != 0 {
		t.Fatalf("secondaries known before any started: %v", k)
	}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))

	started := time.Now()
	s1 := c.startSecondaries("sec1")
	testkit.Eventually(t, 30*time.Second, "the client to learn secondary sec1 from etcd", func() bool { return knows(rc, s1.addr) })
	r, err := rc.PushGrad(ctx, model, 1, grad)
	if err != nil || r.Addr != s1.addr {
		t.Fatalf("push to the discovered secondary: %+v, %v (want it taken at %s)", r, err, s1.addr)
	}
	t.Logf("secondary process started → first push taken there: %v", time.Since(started).Round(time.Millisecond))

	started = time.Now()
	s2 := c.startSecondaries("sec2")
	addrKnown := time.Since(started)
	testkit.Eventually(t, 30*time.Second, "the client to learn secondary sec2 from etcd", func() bool { return knows(rc, s2.addr) })
	t.Logf("second secondary: started → address file %v, → in the client's list %v", addrKnown.Round(time.Millisecond), time.Since(started).Round(time.Millisecond))

	s1.signal(syscall.SIGKILL)
	killed := time.Now()
	testkit.Eventually(t, 30*time.Second, "sec1 to drop out of the client's list when its lease expires", func() bool { return !knows(rc, s1.addr) })
	t.Logf("secondary SIGKILLed → out of the client's list (lease 1s): %v", time.Since(killed).Round(time.Millisecond))
	rd, err := cluster.OpenReader(cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: c.name})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ss, err := rd.Services(ctx, cluster.KindSecondary, "")
	if err != nil || len(ss) != 1 || ss[0].ID != "sec2" || ss[0].Addr != s2.addr || len(ss[0].Secondaries) != 1 {
		t.Fatalf("announced secondaries after the kill: %+v, %v", ss, err)
	}
	for range 3 {
		r, err := rc.PushGrad(ctx, model, 1, grad)
		if err != nil || r.Addr != s2.addr {
			t.Fatalf("push after sec1's death: %+v, %v (want it taken at %s)", r, err, s2.addr)
		}
	}
}

// TestCollectorFindsItsRelayFromEtcd: a collector given only etcd asks for
// the relay on its host (dial.Config.CollectorTarget), gets the relay
// announced there and receives the model's version through it; with the
// relay SIGKILLed, the same question answers the hub once the relay's
// lease expires, and the collector receives from the hub. The time from
// the kill to the first version received from the hub is logged (over
// RLHUB_DISCOVER_KILLS kills, default 1): it is bounded by the relay's
// lease TTL (2 s).
func TestCollectorFindsItsRelayFromEtcd(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 1)
	c.leader(0)
	const model = "r"
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 2, 3, 4}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.push(model, 1, 0, blob)
	target := dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), c.name)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var dc dial.Config
	if addr, relay, err := dc.CollectorTarget(ctx, target, model); err != nil || relay || addr != target {
		t.Fatalf("before any relay: %q %v %v, want the hub target", addr, relay, err)
	}
	kills := envInt(t, "RLHUB_DISCOVER_KILLS", 1)
	var took []time.Duration
	for i := range kills {
		r := startRelay(t, e.Endpoint, c.name, model, fmt.Sprintf("relay%d", i))
		addr, relay, err := dc.CollectorTarget(ctx, target, model)
		if err != nil || !relay || addr != r.addr {
			t.Fatalf("with a relay on this host: %q %v %v, want the relay at %s", addr, relay, err, r.addr)
		}
		if v := receiveOne(t, ctx, dc, addr, model); v != 1 {
			t.Fatalf("through the relay: version %d", v)
		}
		r.kill()
		killed := time.Now()
		for {
			addr, relay, err = dc.CollectorTarget(ctx, target, model)
			if err == nil && !relay {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the relay was never dropped: %q %v %v", addr, relay, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if addr != target {
			t.Fatalf("after the relay died: %q, want the hub target", addr)
		}
		if v := receiveOne(t, ctx, dc, addr, model); v != 1 {
			t.Fatalf("from the hub: version %d", v)
		}
		took = append(took, time.Since(killed))
	}
	slices.Sort(took)
	t.Logf("relay SIGKILL → collector receiving from the hub (relay lease 2s): p50 %v, max %v over %d kills: %v",
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took), took)
}

type relayProc struct {
	proc *testkit.Proc
	addr string
}

func (r *relayProc) kill() { r.proc.Kill() }

// startRelay runs `relay --etcd` for model and waits for its address.
func startRelay(t *testing.T, etcd, name, model, id string) *relayProc {
	t.Helper()
	segment := fmt.Sprintf("/dev/shm/rlhub-discover-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(segment) })
	r := &relayProc{proc: testkit.StartProc(t, testkit.ProcConfig{Name: "relay " + id, Args: []string{"--log-level", "warn",
		"relay", "--etcd", etcd, "--cluster", name, "--model", model, "--listen", "127.0.0.1:0", "--shm", segment, "--id", id}})}
	testkit.Eventually(t, 60*time.Second, "the relay to print its address", func() bool {
		s := r.proc.Output()
		if i := strings.Index(s, "listening on "); i >= 0 {
			rest := s[i+len("listening on "):]
			if j := strings.Index(rest, ","); j > 0 {
				r.addr = rest[:j]
				return true
			}
		}
		select {
		case <-r.proc.Done():
			t.Fatalf("relay exited:\n%s", r.proc.Output())
		default:
		}
		return false
	})
	return r
}

// receiveOne attaches a push-stream collector at addr and returns the
// first version it receives.
func receiveOne(t *testing.T, ctx context.Context, dc dial.Config, addr, model string) uint64 {
	t.Helper()
	conn, err := dc.GRPC(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := wsync.Attach(actx, wsync.ClientConfig{Conn: conn, CollectorID: "disc-test", Model: model, Logger: testkit.Logger()})
	if err != nil {
		t.Fatalf("attach at %s: %v", addr, err)
	}
	defer cl.Close()
	s, err := cl.WaitNewer(actx, 0)
	if err != nil {
		t.Fatalf("receive at %s: %v", addr, err)
	}
	return s.Version
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}
