package reducer_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

func layout(n int) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", int64(n)), tensor.NewF32("b", 3))
	return sd
}

func gradFor(n int, c string, s uint64) *tensor.StateDict {
	h := fnv.New64a()
	h.Write([]byte(c))
	r := rand.New(rand.NewPCG(h.Sum64(), s))
	sd := layout(n)
	for _, t := range sd.Tensors() {
		f, _ := t.Float32s()
		for i := range f {
			f[i] = 0.1 * float32(r.NormFloat64())
		}
	}
	return sd
}

// startSecondary starts a secondary reducer process (startProc) for the
// primary at addr.
func startSecondary(t *testing.T, primary string) *testkit.Proc {
	return startProc(t, "serve", "--role", "reducer", "--primary", primary, "--listen", "127.0.0.1:0", "--data", "",
		"--reduce-batch-size", "2", "--max-wait", "2ms", "--log-level", "warn")
}

// TestKillSecondaryProcess: a primary hub and two secondary reducer
// processes; three clients push continuously; one secondary is SIGKILLed
// mid-run. Clients fail over to the other, training continues, no
// gradient is applied twice, and the final weights equal a sequential
// replay of the applied batches.
func TestKillSecondaryProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 1000
	var mu sync.Mutex
	applied := map[reduce.ID]int{}
	type rec struct {
		v       uint64
		members []reduce.ID
	}
	var recs []rec
	// Retain enough versions to read back exactly the one the recorded
	// steps produced (see the replay below).
	h := hubtest.Start(t, hub.Config{Store: store.Config{Retain: 256}, Reducer: reducer.Config{Secondaries: -1,
		OnApply: func(_ string, v uint64, members []reduce.ID, _ []float32) {
			mu.Lock()
			defer mu.Unlock()
			recs = append(recs, rec{v, members})
			for _, id := range members {
				applied[id]++
			}
		}}})
	addr := h.Addr().String()

	init := gradFor(n, "init", 0)
	blob, _ := safetensors.Encode(init, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	mc := reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.05, Momentum: 0.9}, Reduction: reduce.Sum}
	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, mc); err != nil {
		t.Fatal(err)
	}

	victim := startSecondary(t, addr)
	startSecondary(t, addr)
	waitSecondaries(t, admin, 2)

	var pushedOK atomic.Int64
	var versionAtKill atomic.Uint64
	killAt := int64(40)
	killed := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	const pushes = 80
	var dups atomic.Int64
	for c := range 3 {
		id := fmt.Sprintf("k%d", c)
		cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: id, Rand: rand.New(rand.NewPCG(uint64(c), 1))})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := uint64(1); s <= pushes; s++ {
				_, err := cl.PushSeq(ctx, "m", 0, s, gradFor(n, id, s))
				if errors.Is(err, errs.ErrExists) {
					dups.Add(1) // an earlier attempt of this seq got through
					err = nil
				}
				if err != nil {
					errc <- fmt.Errorf("%s seq %d: %w", id, s, err)
					return
				}
				if pushedOK.Add(1) == killAt {
					if snap, err := h.Store().Get(ctx, "m", 0); err == nil {
						versionAtKill.Store(snap.Version)
					}
					victim.Kill()
					close(killed)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	select {
	case <-killed:
	default:
		t.Fatal("the secondary was never killed")
	}
	<-victim.Done()

	// Every seq was either applied or acknowledged by the victim and lost
	// with it (counted lost by the primary when its session ended). A seq
	// whose push was in flight at the victim is counted lost too, but the
	// client retries it at the survivor, and once that retry is applied
	// the primary takes the lost count back. So per distinct gradient,
	// applied + lost only grows, reaches 3×pushes once everything has
	// settled, and never exceeds it. Wait for the survivor's last batch.
	var lost uint64
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("applied + lost to cover the %d pushes", 3*pushes), func() bool {
		// Read applied before lost: a retry's lost count is taken back
		// before OnApply records it, so this order can undercount for a
		// moment (and the wait goes on) but never count one gradient twice.
		mu.Lock()
		nApplied := len(applied)
		mu.Unlock()
		st, err := admin.Stats(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		lost = st.GetTotal().GetDropped()[string(reduce.ReasonLost)]
		if uint64(nApplied)+lost > 3*pushes {
			t.Fatalf("applied %d + lost %d > %d distinct gradients pushed: a gradient is counted both lost and applied", nApplied, lost, 3*pushes)
		}
		return uint64(nApplied)+lost == 3*pushes
	})
	mu.Lock()
	defer mu.Unlock()
	for id, k := range applied {
		if k != 1 {
			t.Fatalf("%v applied %d times", id, k)
		}
	}
	if len(applied) > 3*pushes {
		t.Fatalf("%d distinct gradients applied from %d pushes", len(applied), 3*pushes)
	}
	if atKill := versionAtKill.Load(); uint64(len(recs))+1 <= atKill {
		t.Fatalf("no step after the kill (version %d at the kill, %d steps)", atKill, len(recs))
	}
	t.Logf("%d gradients applied in %d steps (version %d at the kill); %d lost with the killed secondary; %d retries found their seq already applied",
		len(applied), len(recs), versionAtKill.Load(), lost, dups.Load())

	// Sequential replay of the applied batches.
	sort := func() {
		for i := 1; i < len(recs); i++ {
			for j := i; j > 0 && recs[j].v < recs[j-1].v; j-- {
				recs[j], recs[j-1] = recs[j-1], recs[j]
			}
		}
	}
	sort()
	params := init.Clone()
	opt, _ := optim.New(mc.Optimizer, params)
	for i, r := range recs {
		if r.v != uint64(i+2) {
			t.Fatalf("step %d published version %d", i, r.v)
		}
		sum := layout(n)
		for _, id := range r.members {
			g := gradFor(n, id.Client, id.Seq)
			for _, tn := range sum.Tensors() {
				s, _ := tn.Float32s()
				x, _ := g.Get(tn.Name).Float32s()
				for j := range s {
					s[j] += x[j]
				}
			}
		}
		if err := opt.Step(params, sum); err != nil {
			t.Fatal(err)
		}
	}
	// Compare with the version the recorded steps produced (the newest,
	// now that every gradient has settled).
	got, err := h.Store().Get(ctx, "m", uint64(len(recs))+1)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w", "b"} {
		a, _ := got.Tensors.Get(name).Float32s()
		b, _ := params.Get(name).Float32s()
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s[%d] = %v, replay %v", name, i, a[i], b[i])
			}
		}
	}
}

func waitSecondaries(t testing.TB, c *reducer.Client, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d secondaries attached", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		secs, err := c.Secondaries(ctx)
		return err == nil && len(secs) >= n
	})
}
