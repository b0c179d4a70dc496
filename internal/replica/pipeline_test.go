package replica_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestReducerStepsPipelinedHiddenUntilAcknowledged: with acks all and
// one of two standbys SIGSTOPped (its 30 s lease outlives the stop, so every
// publish waits for it), the reducer commits a step's version and the
// next one on the primary while the first awaits its acknowledgement —
// two versions beyond the acknowledged one on the primary's disk, never a
// third — and two store pushes on two other models commit and wait too.
// None of it is pullable, listed or counted as applied meanwhile; once
// the standby is SIGCONTed, both pushes succeed, every gradient is applied
// and the versions appear in order to a watcher.
func TestReducerStepsPipelinedHiddenUntilAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs and a stopped standby")
	}
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 3, "30s", "--reduce-batch-size", "1", "--replica-ack-timeout", "60s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const model = "p"
	_, p1 := c.leader(0)
	sb := c.standbys(p1)[0]
	seedVector(c, model)
	blob := storetest.Blob(t, 1, 1<<10)
	others := []string{"a", "b"}
	for _, m := range others {
		c.push(m, 1, 0, blob)
	}
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: p1.addr, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: p1.addr, ClientID: "l"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	w := storetest.WatchVersions(ctx, sc, model)
	testkit.Eventually(t, time.Minute, "the watcher at v1", func() bool { return w.Newest() == 1 })

	sb.signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			sb.signal(syscall.SIGCONT)
		}
	}()
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	const grads = 3
	for range grads {
		if _, err := rc.PushGrad(ctx, model, 1, grad); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	pushErr := make([]error, len(others))
	for i, m := range others {
		wg.Go(func() { _, pushErr[i] = sc.Push(ctx, store.PushRequest{Name: m, Version: 2, Expect: 1, Blob: blob}) })
	}
	version := func(v uint64) string {
		return filepath.Join(p1.data, "store", model, fmt.Sprintf("v%020d.safetensors", v))
	}
	onDisk := func(path string) bool { _, err := os.Stat(path); return err == nil }
	testkit.Eventually(t, time.Minute, "v2 and v3 of the reducer's model committed on the primary", func() bool {
		return onDisk(version(2)) && onDisk(version(3))
	})
	testkit.Eventually(t, time.Minute, "the pushes of a and b committed on the primary", func() bool {
		return onDisk(filepath.Join(p1.data, "store", "a", fmt.Sprintf("v%020d.safetensors", 2))) &&
			onDisk(filepath.Join(p1.data, "store", "b", fmt.Sprintf("v%020d.safetensors", 2)))
	})
	for range 5 { // hidden while the standby is stopped, however often asked
		if snap, err := sc.Get(ctx, model, 0); err != nil || snap.Version != 1 {
			t.Fatalf("pull of the newest %s while a standby is stopped: %v, %v (want v1)", model, snap, err)
		}
		for _, v := range []uint64{2, 3} {
			if _, err := sc.Get(ctx, model, v); !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("pull of %s v%d, committed and not acknowledged: %v (want not found)", model, v, err)
			}
		}
		infos, err := sc.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Version != 1 {
				t.Fatalf("List shows %s at v%d while a standby is stopped", in.Name, in.Version)
			}
		}
		st, err := rc.HubStats(ctx, p1.addr)
		if err != nil {
			t.Fatal(err)
		}
		if ms := st.Models[model]; ms.Counters.Applied != 0 || ms.Version != 1 {
			t.Fatalf("the reducer counts %d applied at v%d while no step is acknowledged", ms.Counters.Applied, ms.Version)
		}
		if w.Newest() != 1 {
			t.Fatalf("the watcher saw v%d while a standby is stopped", w.Newest())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if onDisk(version(4)) {
		t.Fatalf("v4 committed while v2 awaits its acknowledgement (at most 2 steps ahead)")
	}

	sb.signal(syscall.SIGCONT)
	stopped = false
	wg.Wait()
	for i, err := range pushErr {
		if err != nil {
			t.Errorf("push of %s v2: %v", others[i], err)
		}
	}
	testkit.Eventually(t, time.Minute, "every gradient applied and published", func() bool {
		st, err := rc.HubStats(ctx, p1.addr)
		return err == nil && st.Models[model].Counters.Applied == grads && w.Newest() == 1+grads
	})
	w.Stop(t)
}

// TestRemoteSecondaryOnACluster: a secondary reducer in another process
// (`serve --role reducer`, given the cluster as etcd://…, announced there
// and found by the client) forwards its batches to the primary's data
// plane, the primary resolved through its connection that follows the
// cluster (before, it dialed "etcd://…" as a host and every forward
// failed: nothing was ever applied). With acks all and the only standby
// SIGSTOPped across the first step, that step's acknowledgement comes
// after the forward that committed it has returned: every gradient
// pushed is applied and published, none dropped, and the model keeps
// taking gradients.
func TestRemoteSecondaryOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("two hubs and a secondary process")
	}
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 2, "--reducer-secondaries", "-1", "--reduce-batch-size", "1")
	_, p1 := c.leader(0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const model = "rs"
	seedVector(c, model)
	target := dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), c.name)
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: target, ClientID: "remote", RefreshEvery: -1, MaxAttempts: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	s := c.startSecondaries("sec")
	testkit.Eventually(t, 30*time.Second, "the client to learn the secondary from etcd", func() bool { return knows(rc, s.addr) })
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	const grads = 6
	v := uint64(1)
	sb := c.standbys(p1)[0]
	for i := range uint64(grads) {
		if i == 0 {
			sb.signal(syscall.SIGSTOP)
		}
		r, err := rc.PushGrad(ctx, model, v, grad)
		if err != nil || r.Addr != s.addr {
			t.Fatalf("push through the remote secondary: %+v, %v", r, err)
		}
		if i == 0 {
			v2 := filepath.Join(p1.data, "store", model, fmt.Sprintf("v%020d.safetensors", 2))
			testkit.Eventually(t, time.Minute, "v2 committed on the primary", func() bool { _, err := os.Stat(v2); return err == nil })
			time.Sleep(500 * time.Millisecond) // the Forward call that committed it has returned
			sb.signal(syscall.SIGCONT)
		}
		// The next gradient on the version this one made (staleness 0).
		testkit.Eventually(t, time.Minute, "the gradient applied and published", func() bool {
			st, err := rc.HubStats(ctx, p1.addr)
			if err != nil {
				return false
			}
			ms := st.Models[model]
			if len(ms.Counters.Dropped) != 0 {
				t.Fatalf("the primary dropped gradients: %+v", ms.Counters)
			}
			if ms.Version > v {
				v = ms.Version
			}
			return ms.Counters.Applied == i+1
		})
	}
	st, err := rc.HubStats(ctx, p1.addr)
	if err != nil {
		t.Fatal(err)
	}
	if ms := st.Models[model]; ms.Counters.Applied != grads || ms.Version != 1+grads {
		t.Fatalf("after %d gradients: %+v at v%d", grads, ms.Counters, ms.Version)
	}
}
