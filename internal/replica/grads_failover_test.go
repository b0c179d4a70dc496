package replica_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	"github.com/rlhub/rlhub/internal/wsync/shm"
)

// TestGradientsAcrossTwoFailovers: two gradient clients given only etcd
// push to the cluster's reducer while the primary is SIGKILLed twice. A
// watcher following the cluster sees versions only grow; the final
// primary's journal (replicated across both failovers) holds no gradient
// twice and only gradients the clients sent; every push is counted:
// applied (in the journal) or lost at a kill (answered, then in flight on
// the dead primary, or of unknown outcome), and nothing else. A weight-sync
// relay given only etcd ends with the final version in its shared-memory
// segment.
func TestGradientsAcrossTwoFailovers(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs and two failovers")
	}
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3, "--reduce-batch-size", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const model, perClient = "g", 40
	l1, p1 := c.leader(0)
	seedVector(c, model)
	target := dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), c.name)
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: target})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	clients := map[string]*reducer.Client{}
	for _, id := range []string{"a", "b"} {
		rc, err := reducer.NewClient(reducer.ClientConfig{Hub: target, ClientID: id, ReconnectWindow: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		clients[id] = rc
	}
	if _, _, err := clients["a"].Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}

	// A relay (a collector's local source): follows the primary, fills shm.
	segment := fmt.Sprintf("/dev/shm/rlhub-replica-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(segment) }) // after the relay is reaped
	relay := testkit.StartProc(t, testkit.ProcConfig{Name: "relay", Args: []string{"--log-level", "warn", "relay", "--etcd", e.Endpoint, "--cluster", c.name,
		"--model", model, "--listen", "127.0.0.1:0", "--shm", segment}})

	// The watcher: versions only grow, across both failovers.
	w := storetest.WatchVersions(ctx, sc, model)
	newest := w.Newest

	type outcome struct{ ok, exists, unknown, failed int }
	outcomes := map[string]*outcome{}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	var pushers sync.WaitGroup
	for id, rc := range clients {
		o := &outcome{}
		outcomes[id] = o
		pushers.Go(func() {
			for range perClient {
				// A trainer's loop: a pull that finds the old primary gone
				// is tried again (the store client's own retries can end
				// before an election does).
				var snap *store.Snapshot
				var err error
				for try := 0; ; try++ {
					if snap, err = sc.Get(ctx, model, 0); err == nil || !errors.Is(err, errs.ErrUnavailable) || try == 100 {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil {
					t.Errorf("client %s: pull: %v", id, err)
					return
				}
				_, err = rc.PushGrad(ctx, model, snap.Version, grad)
				switch {
				case err == nil:
					o.ok++
				case errors.Is(err, errs.ErrExists):
					o.exists++
				case errors.Is(err, reducer.ErrOutcomeUnknown):
					o.unknown++
				default:
					o.failed++
					t.Logf("client %s: push: %v", id, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	testkit.Eventually(t, 2*time.Minute, "version 15 before the first kill", func() bool { return newest() >= 15 })
	p1.kill()
	l2, p2 := c.leader(l1.Epoch)
	testkit.Eventually(t, 2*time.Minute, "version 40 before the second kill", func() bool { return newest() >= 40 })
	p2.kill()
	l3, p3 := c.leader(l2.Epoch)
	pushers.Wait()
	// The last gradients are published once the pushers are done: wait
	// for the store to reach the journal's last step.
	var final *store.Snapshot
	var steps []reducer.JournalStep
	testkit.Eventually(t, time.Minute, "the store at the journal's last version", func() bool {
		var err error
		if steps, err = reducer.ReadJournal(filepath.Join(p3.data, "reducer"), model); err != nil || len(steps) == 0 {
			return false
		}
		final, err = sc.Get(ctx, model, 0)
		return err == nil && final.Version == steps[len(steps)-1].Version
	})
	testkit.Eventually(t, time.Minute, "the watcher on the final version", func() bool { return newest() == final.Version })
	w.Stop(t)
	var rd *shm.Reader
	testkit.Eventually(t, time.Minute, "the relay's segment on the final version", func() bool {
		select {
		case <-relay.Done():
			t.Fatalf("the relay exited (%v):\n%s", relay.State(), relay.Output())
		default:
		}
		if rd == nil {
			var err error
			if rd, err = shm.Open(shm.ReaderConfig{Path: segment}); err != nil {
				rd = nil
				return false
			}
		}
		return rd.Published() == final.Version
	})
	rd.Close()

	applied := appliedOnce(t, steps)
	for id := range applied {
		if (id.Client != "a" && id.Client != "b") || id.Seq < 1 || id.Seq > perClient {
			t.Errorf("the journal holds a gradient no client sent: %v", id)
		}
	}
	if final.Version != 1+uint64(len(applied)) {
		t.Errorf("the store is at v%d after %d applied gradients (one version each, from v1)", final.Version, len(applied))
	}
	for id, o := range outcomes {
		n := 0
		for a := range applied {
			if a.Client == id {
				n++
			}
		}
		lost := perClient - n
		t.Logf("client %s: %d pushes: %d applied, %d lost at a kill (answered %d ok, %d already applied, %d unknown, %d failed)",
			id, perClient, n, lost, o.ok, o.exists, o.unknown, o.failed)
		if o.ok+o.exists+o.unknown+o.failed != perClient {
			t.Errorf("client %s: %d outcomes for %d pushes", id, o.ok+o.exists+o.unknown+o.failed, perClient)
		}
		if o.failed > 0 {
			t.Errorf("client %s: %d pushes failed outright", id, o.failed)
		}
		// Lost gradients are bounded by what a kill can hold in flight.
		if lost > o.unknown+2*4 {
			t.Errorf("client %s: %d gradients lost, more than two kills can account for", id, lost)
		}
	}
	t.Logf("terms: %s → %s → %s; final v%d", l1, l2, l3, final.Version)
}
