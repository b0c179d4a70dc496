package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// serveProc is `rlhub serve ARGS` in a child process (startServeChild;
// the address file is written once the hub listens, primary or standby
// alike); kill SIGKILLs it.
type serveProc struct {
	addr string
	proc *testkit.Proc
}

func startServeProc(t *testing.T, args string) *serveProc {
	t.Helper()
	p := startServeChild(t, args)
	return &serveProc{addr: p.Addr(), proc: p}
}

func (p *serveProc) kill() { p.proc.Kill() }

func weightsBlob(t *testing.T, v float32) []byte {
	t.Helper()
	sd, err := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{2}, []float32{v, -v}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestClientsFollowThePrimaryAcrossSIGKILL: one etcd, three `rlhub serve
// --etcd` processes. Go clients given the hub list (store) and etcd
// (gradients, and the CLI's --etcd) write to the elected primary; the
// primary is SIGKILLed twice, and each time the clients' next writes land
// on the newly elected primary (a larger epoch) without being told, and
// every gradient sent is applied there exactly once. Without replication
// (the server half of issue 15) a new primary starts empty: the test
// seeds it, as a trainer would, and asserts only the client's half.
func TestClientsFollowThePrimaryAcrossSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and three hub processes")
	}
	e := clustertest.Start(t)
	const name = "follow"
	hubs := map[string]*serveProc{}
	var list []string
	for i := range 3 {
		id := fmt.Sprintf("h%d", i)
		hubs[id] = startServeProc(t, fmt.Sprintf("serve --listen 127.0.0.1:0 --data %s --etcd %s --cluster %s --lease-ttl 1s --member-id %s --reduce-batch-size 1",
			filepath.Join(t.TempDir(), id), e.Endpoint, name, id))
		list = append(list, hubs[id].addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader := func() cluster.Leader {
		var l cluster.Leader
		testkit.Eventually(t, 30*time.Second, "a primary in etcd", func() bool {
			st, err := cluster.Read(ctx, cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name})
			if err != nil || st.Primary == nil || hubs[st.Primary.ID] == nil || hubs[st.Primary.ID].proc.State() != nil {
				return false
			}
			l = *st.Primary
			return true
		})
		return l
	}

	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: strings.Join(list, ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), name), ClientID: "g"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	direct := func(addr string) *storerpc.Client {
		c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{2}, []float32{1, 1}))

	var lastEpoch uint64
	for round := range 3 {
		l := leader()
		if l.Epoch <= lastEpoch {
			t.Fatalf("round %d: epoch %d after %d", round, l.Epoch, lastEpoch)
		}
		lastEpoch = l.Epoch
		model := fmt.Sprintf("m%d", round)
		// The store client (hub list) writes the model; it lands on the
		// elected primary, and on no other hub.
		if _, err := sc.Push(ctx, store.PushRequest{Name: model, Version: 1, Expect: 0, Blob: weightsBlob(t, 1)}); err != nil {
			t.Fatalf("round %d: push through the hub list: %v", round, err)
		}
		for id, p := range hubs {
			if p.proc.State() != nil {
				continue
			}
			_, err := direct(p.addr).Get(ctx, model, 0)
			if (id == l.ID) != (err == nil) {
				t.Fatalf("round %d: hub %s (primary %s) has %s: err %v", round, id, l.ID, model, err)
			}
		}
		// Gradients (etcd target): registered and pushed on the primary,
		// each applied exactly once.
		if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.5}}); err != nil {
			t.Fatalf("round %d: register: %v", round, err)
		}
		const n = 5
		for i := range n {
			snap, err := sc.Get(ctx, model, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := rc.PushGrad(ctx, model, snap.Version, grad); err != nil {
				t.Fatalf("round %d: gradient %d: %v", round, i, err)
			}
			testkit.Eventually(t, 30*time.Second, "the gradient to be applied", func() bool {
				s, err := sc.Get(ctx, model, 0)
				return err == nil && s.Version == snap.Version+1
			})
		}
		// The counters settle just after the version is visible.
		var st reducer.Stats
		testkit.Eventually(t, 30*time.Second, "the primary's counters to show every gradient", func() bool {
			st, err = rc.HubStats(ctx, l.Addr)
			return err == nil && st.Total.Applied >= n
		})
		if st.Total.Applied != n || st.Total.Pushed != n {
			t.Fatalf("round %d: primary %s counted pushed %d applied %d, want %d each", round, l.ID, st.Total.Pushed, st.Total.Applied, n)
		}
		if snap, err := sc.Get(ctx, model, 0); err != nil || snap.Version != n+1 {
			t.Fatalf("round %d: %s at version %v (%v), want %d: one version per gradient", round, model, snap, err, n+1)
		}
		if rc.Unknown() != 0 {
			t.Fatalf("round %d: %d pushes of unknown outcome", round, rc.Unknown())
		}
		// The CLI with --etcd finds the same primary's models.
		code, out, errOut := run(t, ctx, "model", "ls", "--etcd", e.Endpoint, "--cluster", name)
		if code != 0 || !strings.Contains(out, model) {
			t.Fatalf("round %d: model ls --etcd: code %d\n%s%s", round, code, out, errOut)
		}
		if round < 2 {
			hubs[l.ID].kill()
		}
	}
	// With every hub but one dead, the store client still answers from it;
	// with the last killed too, a call fails within its deadline, clearly.
	l := leader()
	hubs[l.ID].kill()
	short, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	_, err = sc.List(short)
	if err == nil || !errors.Is(err, errs.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List with every hub dead: %v", err)
	}
	if !strings.Contains(err.Error(), "cluster") {
		t.Fatalf("the error does not say what was tried: %v", err)
	}
}

// TestRelayOnEtcdIsAnnouncedAndFollows: `relay --etcd` finds its upstream
// (the primary) in etcd and announces itself there; a collector found
// through etcd gets versions from it, and after the primary is SIGKILLed
// the relay follows the new primary and delivers its next version.
func TestRelayOnEtcdIsAnnouncedAndFollows(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and two hub processes")
	}
	e := clustertest.Start(t)
	const name = "relayfollow"
	var procs []*serveProc
	for i := range 2 {
		procs = append(procs, startServeProc(t, fmt.Sprintf("serve --listen 127.0.0.1:0 --data %s --etcd %s --cluster %s --lease-ttl 1s --member-id r%d",
			filepath.Join(t.TempDir(), "d"), e.Endpoint, name, i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcdAddr := strings.TrimPrefix(e.Endpoint, "http://")
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: dial.EtcdTarget(etcdAddr, name)})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Push(ctx, store.PushRequest{Name: "pol", Version: 1, Blob: weightsBlob(t, 1)}); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan int, 1)
	go func() {
		code, _, _ := run(t, rctx, "relay", "--etcd", e.Endpoint, "--cluster", name, "--model", "pol", "--id", "relay-a",
			"--listen", "127.0.0.1:0", "--no-shm", "--log-level", "error")
		relayDone <- code
	}()
	defer func() { rcancel(); testkit.Recv(t, relayDone, 30*time.Second, "the relay to stop") }()
	rd, err := cluster.OpenReader(cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var relay cluster.ServiceInfo
	testkit.Eventually(t, 30*time.Second, "the relay to be announced in etcd", func() bool {
		ss, err := rd.Services(ctx, cluster.KindRelay, "pol")
		if err != nil || len(ss) != 1 {
			return false
		}
		relay = ss[0]
		return true
	})
	if relay.ID != "relay-a" || relay.Addr == "" {
		t.Fatalf("announced %+v", relay)
	}
	col, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: relay.Addr, Model: "pol"})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	waitVersion := func(v uint64) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, fmt.Sprintf("the collector to run version %d", v), func() bool {
			pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer pcancel()
			_, _ = col.Poll(pctx)
			return col.Version() >= v
		})
	}
	waitVersion(1)
	// Both hubs may take over (acks all): the standby is in the in-sync
	// record once its full sync is acknowledged.
	var st cluster.Status
	testkit.Eventually(t, 30*time.Second, "both hubs in the in-sync record", func() bool {
		st, err = rd.Status(ctx)
		return err == nil && st.Primary != nil && st.InSync != nil && st.InSync.Has("r0") && st.InSync.Has("r1")
	})
	for _, p := range procs {
		if p.addr == st.Primary.Addr {
			p.kill()
		}
	}
	// The new primary takes version 2 (ExpectAny: without replication it
	// may start empty); the relay follows it there.
	if _, err := sc.Push(ctx, store.PushRequest{Name: "pol", Version: 2, Expect: store.ExpectAny, Blob: weightsBlob(t, 2)}); err != nil {
		t.Fatalf("push after the failover: %v", err)
	}
	waitVersion(2)
}
