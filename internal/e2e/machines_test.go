package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// appliedOnce is the set of gradients a journal applied; one applied
// twice fails t.
func appliedOnce(t *testing.T, steps []reducer.JournalStep) map[reduce.ID]bool {
	t.Helper()
	out := map[reduce.ID]bool{}
	for _, s := range steps {
		for _, id := range s.Members {
			if out[id] {
				t.Errorf("gradient %v applied twice", id)
			}
			out[id] = true
		}
	}
	return out
}

// TestMachineDies runs docs/cluster.md's three-machine deployment on a
// lab (m1, m2, m3 and a client machine c1, each its own network
// namespace): an etcd member and a hub (mutual TLS, tokens, 2 s lease) on
// each of m1–m3, two learners on c1 given only the cluster (etcd://…)
// pulling and pushing gradients. The primary's machine dies: its link is
// cut and every process on it SIGKILLed. A hub on another machine takes
// over, training continues there, the versions a following watcher sees
// only grow, every gradient is accounted for (applied in the final
// primary's journal, at most once, or lost at the kill: of unknown
// outcome, or acknowledged and still in flight on the dead machine), and
// `rlhub cluster status`, run on c1, lists the two live hubs.
func TestMachineDies(t *testing.T) {
	if testing.Short() {
		t.Skip("a lab of four hosts and a dozen processes")
	}
	began := time.Now()
	elapsed := func() time.Duration { return time.Since(began).Round(time.Millisecond) }
	d := newDeployment(t)
	for _, m := range d.machines {
		d.startHub(m)
	}
	l1, p1 := d.leader(0)
	t.Logf("%v: %s serving", elapsed(), l1)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The model: v1 pushed by a trainer, registered with the reducer (an
	// admin's call).
	trainer := d.dialConfig("trainer")
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: d.target(), Dial: trainer, CallTimeout: 30 * time.Second, MaxAttempts: 20, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	zeros, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{0, 0, 0, 0}))
	blob, err := safetensors.Encode(zeros, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Push(ctx, store.PushRequest{Name: d.model, Version: 1, Blob: blob}); err != nil {
		t.Fatalf("push v1: %v", err)
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: d.target(), Dial: d.dialConfig("admin"), ClientID: "register"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: d.model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatalf("register: %v", err)
	}
	w := storetest.WatchVersions(ctx, sc, d.model)

	// On each machine a hub of secondaries and a relay of the model, with
	// two collectors reading it: one on the public Go package (the relay's
	// stream, found in etcd), one on the relay's segment.
	collectors := map[string][]*testkit.Proc{}
	for _, m := range d.machines {
		d.startSecondaries(m)
		d.startRelay(m)
		collectors[m.Name] = []*testkit.Proc{d.collector(m, "collector-push"), d.collector(m, "collector-shm")}
	}

	learners := map[string]*testkit.Proc{}
	for _, id := range []string{"a", "b"} {
		learners[id] = d.child(d.client, "learner", id)
	}
	testkit.Eventually(t, 3*time.Minute, "version 15 before the machine dies", func() bool { return w.Newest() >= 15 })

	before := w.Newest()
	t.Logf("%v: v%d; %s dies", elapsed(), before, p1.host.Name)
	died := d.die(p1.host)
	l2, p2 := d.leader(l1.Epoch)
	t.Logf("%v: %s serving, %v after the death", elapsed(), l2, time.Since(died).Round(time.Millisecond))
	if p2.host == p1.host {
		t.Fatalf("the new primary %s is on the dead machine", l2)
	}
	testkit.Eventually(t, 3*time.Minute, "ten versions from the new primary", func() bool { return w.Newest() >= before+10 })
	first, _ := w.FirstOfEpoch(l2.Epoch)
	t.Logf("%s died at v%d; %s's first version v%d %v after the death", p1.host.Name, before, l2, first.Version, first.At.Sub(died).Round(time.Millisecond))

	t.Logf("%v: v%d; stopping the learners", elapsed(), w.Newest())
	stopAll(t, d)
	sums := map[string]summary{}
	for id, p := range learners {
		if st := p.Wait(t, 3*time.Minute); !st.Success() {
			t.Fatalf("learner %s: %v\n%s", id, st, p.Output())
		}
		sums[id] = parseSummary(t, p)
		for _, line := range strings.Split(p.Output(), "\n") {
			if strings.HasPrefix(line, "push ") { // a slow or failed push, for the log
				t.Logf("learner %s: %s", id, line)
			}
		}
	}

	// The store ends on the journal's last step, and the watcher there.
	var final *store.Snapshot
	var steps []reducer.JournalStep
	testkit.Eventually(t, 2*time.Minute, "the store at the journal's last version", func() bool {
		if steps, err = reducer.ReadJournal(filepath.Join(p2.data, "reducer"), d.model); err != nil || len(steps) == 0 {
			return false
		}
		final, err = sc.Get(ctx, d.model, 0)
		return err == nil && final.Version == steps[len(steps)-1].Version
	})
	testkit.Eventually(t, time.Minute, "the watcher on the final version", func() bool { return w.Newest() == final.Version })
	w.Stop(t)
	if final.Epoch != l2.Epoch {
		t.Errorf("final v%d of epoch %d, want the new primary's %d", final.Version, final.Epoch, l2.Epoch)
	}

	applied := appliedOnce(t, steps)
	if final.Version != 1+uint64(len(applied)) {
		t.Errorf("the store is at v%d after %d applied gradients (one version each, from v1)", final.Version, len(applied))
	}
	checkGradients(t, applied, sums)

	// The collectors on the machines left end on the final version, each
	// through its own machine's relay, having applied versions that only
	// grow.
	for _, m := range d.machines {
		if m == p1.host {
			continue
		}
		for _, p := range collectors[m.Name] {
			testkit.Eventually(t, 2*time.Minute, p.Name()+" on the final version", func() bool {
				select {
				case <-p.Done():
					t.Fatalf("%s exited:\n%s", p.Name(), p.Output())
				default:
				}
				got := parseApplied(p.Output())
				return len(got) > 0 && got[len(got)-1].version == final.Version
			})
			got := parseApplied(p.Output())
			checkApplied(t, p, got, d.seg[m.Name])
			for _, a := range got {
				if a.epoch == l2.Epoch {
					t.Logf("%s: first version of the new term v%d %v after the death", p.Name(), a.version, a.at.Sub(died).Round(time.Millisecond))
					break
				}
			}
		}
	}

	// `rlhub cluster status` from c1: the two live hubs, the new primary.
	// A standby whose lease was kept alive through the dead machine's etcd
	// member can be rejoining just now (docs/cluster.md's failure table):
	// asked again, for up to a minute, until two hubs are listed.
	var out string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		status := d.client.Start(t, testkit.ProcConfig{Name: "cluster status", Args: append([]string{"cluster", "status"}, d.etcdFlags()...)})
		if st := status.Wait(t, time.Minute); !st.Success() {
			t.Fatalf("cluster status on c1: %v\n%s", st, status.Output())
		}
		if out = status.Output(); len(statusMembers(out)) == 2 || time.Now().After(deadline) {
			break
		}
	}
	checkStatus(t, out, l2, d, p1.host.Name)
	t.Logf("terms %s → %s; final v%d", l1, l2, final.Version)
}

// checkApplied: versions only grow, epochs never go back, and the last
// came through this machine's relay (its stream, or its segment: a
// segment reader says which it opened).
func checkApplied(t *testing.T, p *testkit.Proc, got []applied, seg string) {
	t.Helper()
	name := p.Name()
	if strings.HasPrefix(name, "collector-shm") && !strings.Contains(p.Output(), "collector up on "+seg+"\n") {
		t.Errorf("%s did not read its own machine's relay segment %s:\n%s", name, seg, p.Output())
	}
	for i := 1; i < len(got); i++ {
		if got[i].version <= got[i-1].version || got[i].epoch < got[i-1].epoch {
			t.Errorf("%s applied v%d (epoch %d) after v%d (epoch %d)", name, got[i].version, got[i].epoch, got[i-1].version, got[i-1].epoch)
		}
	}
	last := got[len(got)-1]
	if last.via != "relay" && last.via != "shm" {
		t.Errorf("%s got v%d via %q, not through its machine's relay", name, last.version, last.via)
	}
	t.Logf("%s: %d versions applied, last v%d epoch %d via %s", name, len(got), last.version, last.epoch, last.via)
}

// stopAll tells the learners to stop.
func stopAll(t *testing.T, d *deployment) {
	t.Helper()
	if err := os.WriteFile(d.stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkGradients: the journal holds only gradients the learners sent,
// every push had one outcome, none failed outright, and what was not
// applied is bounded by what one machine's death can take: the pushes of
// unknown outcome, and those acknowledged (admitted to a secondary's
// queue) but not yet applied when the old primary's term ended.
func checkGradients(t *testing.T, applied map[reduce.ID]bool, sums map[string]summary) {
	t.Helper()
	for id := range applied {
		s, ok := sums[id.Client]
		if !ok || id.Seq < 1 || id.Seq > uint64(s.pushes) {
			t.Errorf("the journal holds a gradient no learner sent: %v", id)
		}
	}
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range sums {
			if !yield(id) {
				return
			}
		}
	})
	lost, unknown := 0, 0
	for _, id := range ids {
		s := sums[id]
		n := 0
		for a := range applied {
			if a.Client == id {
				n++
			}
		}
		lost += s.pushes - n
		unknown += s.unknown
		t.Logf("learner %s: %d pushes: %d applied, %d lost (answered %d ok, %d already applied, %d unknown, %d failed)",
			id, s.pushes, n, s.pushes-n, s.ok, s.exists, s.unknown, s.failed)
		if s.ok+s.exists+s.unknown+s.failed != s.pushes {
			t.Errorf("learner %s: %d outcomes for %d pushes", id, s.ok+s.exists+s.unknown+s.failed, s.pushes)
		}
		if s.failed > 0 {
			t.Errorf("learner %s: %d pushes failed outright", id, s.failed)
		}
		if s.pushes < n {
			t.Errorf("learner %s: %d applied of %d pushed", id, n, s.pushes)
		}
	}
	if lost > unknown+lostBound {
		t.Errorf("%d gradients lost, more than a machine's death accounts for (%d of unknown outcome + %d admitted and in flight)", lost, unknown, lostBound)
	}
}

// lostBound is what may be lost acknowledged when the primary's machine
// dies: what the secondaries had admitted and not yet forwarded (at most
// max-queue-size, 4 × batch size 1, plus the batch being forwarded, on
// each of the four: a hub's own and a `serve --role reducer` on the dead
// machine, one `--role reducer` on each other), and the primary's two
// steps committed and not yet acknowledged.
const lostBound = 4*(4+1) + 2

// checkStatus: `cluster status` lists the live hubs, with want primary,
// and not the dead one.
func checkStatus(t *testing.T, out string, want cluster.Leader, d *deployment, dead string) {
	t.Helper()
	if !strings.Contains(out, "primary "+want.String()) {
		t.Errorf("cluster status does not name primary %s:\n%s", want, out)
	}
	var members []string
	for _, f := range statusMembers(out) {
		members = append(members, f[0]+" "+f[2])
		if h := d.hubs[f[0]]; h == nil || !strings.HasPrefix(f[1], h.host.IP+":") {
			t.Errorf("cluster status lists %s at %s, not at its machine's address", f[0], f[1])
		}
	}
	if len(members) != 2 || strings.Contains(strings.Join(members, ","), dead+" ") {
		t.Errorf("cluster status lists %v, want the two live hubs:\n%s", members, out)
	}
}

// statusMembers are the hub lines of `rlhub cluster status`'s output,
// split into fields (id, address, role, …).
func statusMembers(out string) [][]string {
	var hubs [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] != "cluster" && (f[2] == "primary" || f[2] == "standby") {
			hubs = append(hubs, f)
		}
	}
	return hubs
}
