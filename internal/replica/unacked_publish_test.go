package replica_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestReducerCarriesOnAfterAnUnacknowledgedPublish: the only standby is
// SIGSTOPped (its lease outlives the stop, so it stays registered and
// every publish waits for it) across a reducer step, whose publish is
// then committed on the primary but not acknowledged within
// --replica-ack-timeout; then it is SIGCONTed. The model keeps taking
// gradients: every gradient pushed, before, during and after, is applied
// exactly once and published, versions only grow for a watcher, and after
// the primary is SIGKILLed the standby takes over with the final version
// and the whole journal (nothing acknowledged is lost).
func TestReducerCarriesOnAfterAnUnacknowledgedPublish(t *testing.T) {
	if testing.Short() {
		t.Skip("two hubs, a stopped standby and a failover")
	}
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 2, "10s", "--reduce-batch-size", "1", "--replica-ack-timeout", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const model, before, after = "u", 4, 6
	l1, p1 := c.leader(0)
	sb := c.standbys(p1)[0]
	seedVector(c, model)
	target := dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), c.name)
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: target})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: target, ClientID: "a", ReconnectWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}

	w := storetest.WatchVersions(ctx, sc, model)
	newest := w.Newest
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	pushed := 0
	push := func() {
		t.Helper()
		snap, err := sc.Get(ctx, model, 0)
		if err != nil {
			t.Fatalf("pull: %v", err)
		}
		if _, err := rc.PushGrad(ctx, model, snap.Version, grad); err != nil {
			t.Fatalf("push %d: %v", pushed+1, err)
		}
		pushed++
	}
	for range before {
		push()
		want := uint64(1 + pushed)
		testkit.Eventually(t, time.Minute, "each gradient published before the stop", func() bool { return newest() >= want })
	}

	// The standby stops; the next step's publish is committed on the
	// primary and waits for it past the ack timeout.
	sb.signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			sb.signal(syscall.SIGCONT)
		}
	}()
	push()
	testkit.Eventually(t, time.Minute, "the primary's publish not acknowledged in time", func() bool {
		return strings.Contains(p1.out.String(), "standbys acknowledged the publish within")
	})
	sb.signal(syscall.SIGCONT)
	stopped = false

	for range after {
		push()
	}
	final := uint64(1 + pushed)
	testkit.Eventually(t, time.Minute, "every gradient published after the standby came back", func() bool { return newest() == final })

	// Failover: the standby holds everything acknowledged.
	p1.kill()
	l2, p2 := c.leader(l1.Epoch)
	if p2 != sb {
		t.Fatalf("primary after the kill is %s, not the standby", l2)
	}
	snap := c.newest(model)
	if snap.Version != final {
		t.Errorf("the new primary is at v%d, the old one acknowledged v%d", snap.Version, final)
	}
	steps, err := reducer.ReadJournal(filepath.Join(p2.data, "reducer"), model)
	if err != nil {
		t.Fatal(err)
	}
	w.Stop(t)
	applied := appliedOnce(t, steps)
	for seq := uint64(1); seq <= uint64(pushed); seq++ {
		if !applied[reduce.ID{Client: "a", Seq: seq}] {
			t.Errorf("gradient %d is not in the new primary's journal", seq)
		}
	}
	if len(applied) != pushed || len(steps) == 0 || steps[len(steps)-1].Version != final {
		t.Errorf("the journal holds %d gradients in %d steps; %d were pushed, the store is at v%d", len(applied), len(steps), pushed, final)
	}
	t.Logf("%d gradients, each applied once; v%d acknowledged and carried over to %s", pushed, final, l2)
}
