package reducer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// startProc starts `rlhub ARGS… --addr-file F` as this test binary
// re-executed (childEnv), so the hub runs under this binary's race
// detector, and waits for it to listen (args end with serve's flags).
func startProc(t *testing.T, args ...string) *testkit.Proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args = append(args, "--addr-file", addrFile)
	return testkit.StartProc(t, testkit.ProcConfig{Name: "rlhub " + args[0], Path: os.Args[0],
		Env: []string{childEnv + "=" + strings.Join(args, "\x1f")}, AddrFile: addrFile, StartTimeout: 30 * time.Second})
}

// TestKillPrimaryHubDuringAdam: a real `rlhub serve` on a --data
// directory trains a model with Adam from two gradient clients while it is
// SIGKILLed at random moments, 10 times, and restarted on the same --data.
// After each restart pushes are applied without registering again and the
// optimizer resumes at the newest version's step. At the end:
//   - the journal of applied steps has consecutive versions and no
//     gradient twice;
//   - a replay of the journaled steps with one uninterrupted optimizer
//     (internal/optim, computed here) gives the newest version's weights
//     and the optimizer state on disk, bit for bit;
//   - every gradient the clients pushed is accounted for: applied
//     (journaled), lost (acknowledged, then killed in flight), or dropped
//     (refused); a retry told "already applied" was journaled.
func TestKillPrimaryHubDuringAdam(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const (
		n = 512
	)
	kills := 10
	if s := os.Getenv("RLHUB_KILLS"); s != "" { // the benchmark log runs more
		fmt.Sscan(s, &kills)
	}
	data := t.TempDir()
	init := gradFor(n, "init", 0)
	{ // the initial weights, on disk before the hub starts
		st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(data, "store"), Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		blob, _ := safetensors.Encode(init, nil)
		if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	serve := func(listen string) *testkit.Proc {
		return startProc(t, "serve", "--listen", listen, "--data", data, "--store-retain", "4",
			"--reduce-batch-size", "2", "--max-wait", "1ms", "--log-level", "info")
	}
	hubProc := serve("127.0.0.1:0")
	addr := hubProc.Addr()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mc := reducer.ModelConfig{Model: "m", Reduction: reduce.Sum,
		Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01, Schedule: optim.Schedule{Kind: optim.Cosine, TMax: 500, WarmupSteps: 10}}}
	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, mc); err != nil {
		t.Fatal(err)
	}

	// Two clients push until stop, retrying each seq through the kills.
	type outcome int
	const (
		acked   outcome = iota + 1 // admitted into a batch
		exists                     // a retry found it applied already
		dropped                    // refused for good
	)
	var mu sync.Mutex
	outcomes := map[reduce.ID]outcome{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 2 {
		id := fmt.Sprintf("g%d", c)
		cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: id, Rand: rand.New(rand.NewPCG(uint64(c), 7))})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := uint64(1); ; s++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := cl.PushSeq(ctx, "m", 0, s, gradFor(n, id, s))
				o := acked
				switch {
				case errors.Is(err, errs.ErrExists):
					o = exists
				case ctx.Err() != nil:
					return // the test failed elsewhere; this seq is not counted
				case err != nil:
					t.Logf("%s seq %d dropped: %v", id, s, err)
					o = dropped
				}
				mu.Lock()
				outcomes[reduce.ID{Client: id, Seq: s}] = o
				mu.Unlock()
			}
		}()
	}
	defer func() { // on a failure, stop the pushers before the deferred closes
		select {
		case <-stop:
		default:
			close(stop)
		}
		cancel()
		wg.Wait()
	}()

	version := func() (reducer.ModelStats, bool) {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		st, err := admin.HubStats(cctx, "")
		if err != nil {
			return reducer.ModelStats{}, false
		}
		ms, ok := st.Models["m"]
		return ms, ok
	}
	rnd := rand.New(rand.NewPCG(2026, 12))
	var recovery []time.Duration
	for k := range kills {
		// Let it train a random while (at least one new version), then
		// kill it wherever it is.
		ms, _ := version()
		testkit.Eventually(t, 30*time.Second, "a new version before the kill", func() bool {
			now, ok := version()
			return ok && now.Version > ms.Version
		})
		time.Sleep(time.Duration(rnd.IntN(150)) * time.Millisecond)
		hubProc.Kill()
		restartAt := time.Now()
		hubProc = serve(addr)
		restored, ok := version()
		if !ok {
			t.Fatalf("kill %d: the restarted hub does not know model m:\n%s", k, hubProc.Output())
		}
		if restored.StateError != "" || restored.OptimizerSteps != restored.Version-1 {
			t.Fatalf("kill %d: restored %+v: want no state error and optimizer step = version-1", k, restored)
		}
		testkit.Eventually(t, 30*time.Second, "pushes applied after the restart, without registering", func() bool {
			now, ok := version()
			return ok && now.Version > restored.Version
		})
		recovery = append(recovery, time.Since(restartAt))
	}
	// Recovery (process start → first new version) is reported, not
	// asserted: docs/benchlog/2026-12-01-durable-reducer.md.
	slices.Sort(recovery)
	t.Logf("recovery over %d kills (restart → first new version, polled with a 1-50ms backoff): p50 %v, p99 %v, max %v",
		len(recovery), recovery[len(recovery)/2].Round(time.Millisecond),
		recovery[min(len(recovery)-1, len(recovery)*99/100)].Round(time.Millisecond), recovery[len(recovery)-1].Round(time.Millisecond))
	close(stop)
	wg.Wait()
	// Everything acknowledged has been forwarded within max-wait; the
	// last kill then freezes the state on disk.
	testkit.Eventually(t, 10*time.Second, "the queues to drain", func() bool {
		st, err := admin.HubStats(ctx, "")
		return err == nil && st.QueueDepth == 0
	})
	hubProc.Kill()

	journal, err := reducer.ReadJournal(filepath.Join(data, "reducer"), "m")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(data, "store"), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	newest, err := st.Get(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}

	// Replay: consecutive versions, no gradient twice.
	applied := map[reduce.ID]bool{}
	params := init.Clone()
	opt, _ := optim.New(mc.Optimizer, params)
	for i, step := range journal {
		if step.Snapshot || step.Version != uint64(i+2) || step.Steps != uint64(i+1) {
			t.Fatalf("journal record %d: version %d, steps %d, snapshot %v", i, step.Version, step.Steps, step.Snapshot)
		}
		sum := layout(n)
		for j, id := range step.Members {
			if applied[id] {
				t.Fatalf("%v applied twice (again at version %d)", id, step.Version)
			}
			applied[id] = true
			g := gradFor(n, id.Client, id.Seq)
			for _, tn := range sum.Tensors() {
				s, _ := tn.Float32s()
				x, _ := g.Get(tn.Name).Float32s()
				for e := range s {
					s[e] += step.Weights[j] * x[e]
				}
			}
		}
		if err := opt.Step(params, sum); err != nil {
			t.Fatal(err)
		}
	}
	if last := uint64(len(journal)) + 1; newest.Version != last {
		t.Fatalf("store's newest version %d, journal ends at %d", newest.Version, last)
	}
	for _, name := range []string{"w", "b"} {
		a, _ := newest.Tensors.Get(name).Float32s()
		b, _ := params.Get(name).Float32s()
		if !slices.Equal(a, b) {
			t.Fatalf("%s at version %d differs from the replay of the journaled steps", name, newest.Version)
		}
	}
	gotState, meta, err := reducer.ReadOptimizerState(filepath.Join(data, "reducer"), "m", newest.Version)
	if err != nil {
		t.Fatal(err)
	}
	wantState, wantMeta := opt.State()
	if meta["optim.steps"] != wantMeta["optim.steps"] || gotState.Len() != wantState.Len() {
		t.Fatalf("optimizer state on disk: steps %s, %d tensors; replay: steps %s, %d tensors",
			meta["optim.steps"], gotState.Len(), wantMeta["optim.steps"], wantState.Len())
	}
	for _, wt := range wantState.Tensors() {
		a, _ := gotState.Get(wt.Name).Float32s()
		b, _ := wt.Float32s()
		if !slices.Equal(a, b) {
			t.Fatalf("optimizer state %s differs from the replay's", wt.Name)
		}
	}

	// Accounting per gradient.
	mu.Lock()
	defer mu.Unlock()
	var nAcked, nExists, nDropped, lost int
	for id, o := range outcomes {
		switch o {
		case acked:
			nAcked++
			if !applied[id] {
				lost++
			}
		case exists:
			nExists++
			if !applied[id] {
				t.Fatalf("%v: a retry was told it was applied, but no step holds it", id)
			}
		case dropped:
			nDropped++
			if applied[id] {
				t.Fatalf("%v was refused to its client but applied", id)
			}
		}
	}
	for id := range applied {
		if outcomes[id] == 0 {
			t.Fatalf("%v applied but never pushed", id)
		}
	}
	if len(applied)+lost+nDropped != len(outcomes) {
		t.Fatalf("applied %d + lost %d + dropped %d != %d gradients pushed", len(applied), lost, nDropped, len(outcomes))
	}
	t.Logf("%d gradients pushed over %d kills: %d applied in %d steps (%d retries found theirs applied), %d lost in flight, %d dropped",
		len(outcomes), kills, len(applied), len(journal), nExists, lost, nDropped)
}

// TestRestartedSecondaryGetsPushes: clients running before a secondary
// process is SIGKILLed and started again (at a new address) push to it
// once it is back: they re-list secondaries periodically, not only after
// a failure (the other secondary keeps taking their pushes meanwhile).
func TestRestartedSecondaryGetsPushes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 256
	h := hubtest.Start(t, hub.Config{Reducer: reducer.Config{Secondaries: -1}})
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	blob, _ := safetensors.Encode(gradFor(n, "init", 0), nil)
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	secondary := func() (*testkit.Proc, string) {
		p := startProc(t, "serve", "--role", "reducer", "--primary", addr, "--listen", "127.0.0.1:0", "--data", "",
			"--reduce-batch-size", "2", "--max-wait", "1ms", "--log-level", "info")
		return p, p.Addr()
	}
	attached := func(a string) func() bool {
		return func() bool {
			secs, err := admin.Secondaries(ctx)
			return err == nil && slices.ContainsFunc(secs, func(s reducer.Secondary) bool { return s.Addr == a })
		}
	}
	_, stayAddr := secondary()
	victim, victimAddr := secondary()
	testkit.Eventually(t, 30*time.Second, "both secondaries attached", func() bool { return attached(stayAddr)() && attached(victimAddr)() })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for c := range 2 {
		id := fmt.Sprintf("r%d", c)
		cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: id, RefreshEvery: 200 * time.Millisecond,
			Rand: rand.New(rand.NewPCG(uint64(c), 3))})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := uint64(1); ; s++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cl.PushSeq(ctx, "m", 0, s, gradFor(n, id, s)); err != nil && !errors.Is(err, errs.ErrExists) {
					errc <- fmt.Errorf("%s seq %d: %w", id, s, err)
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	pushedAt := func(a string) uint64 {
		st, err := admin.HubStats(ctx, a)
		if err != nil {
			return 0
		}
		return st.Total.Pushed
	}
	testkit.Eventually(t, 30*time.Second, "pushes at the victim before the kill", func() bool { return pushedAt(victimAddr) > 0 })
	victim.Kill()
	testkit.Eventually(t, 30*time.Second, "the victim's session to end", func() bool { return !attached(victimAddr)() })
	_, backAddr := secondary()
	testkit.Eventually(t, 30*time.Second, "the restarted secondary attached", attached(backAddr))
	testkit.Eventually(t, 30*time.Second, "pushes from the running clients at the restarted secondary", func() bool {
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		return pushedAt(backAddr) > 0
	})
}
