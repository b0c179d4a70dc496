package replica_test

import (
	"context"
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

	s1 := c.startSecondaries("sec1")
	testkit.Eventually(t, 30*time.Second, "the client to learn secondary sec1 from etcd", func() bool { return knows(rc, s1.addr) })
	r, err := rc.PushGrad(ctx, model, 1, grad)
	if err != nil || r.Addr != s1.addr {
		t.Fatalf("push to the discovered secondary: %+v, %v (want it taken at %s)", r, err, s1.addr)
	}

	s2 := c.startSecondaries("sec2")
	testkit.Eventually(t, 30*time.Second, "the client to learn secondary sec2 from etcd", func() bool { return knows(rc, s2.addr) })

	s1.signal(syscall.SIGKILL)
	testkit.Eventually(t, 30*time.Second, "sec1 to drop out of the client's list when its lease expires", func() bool { return !knows(rc, s1.addr) })
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
