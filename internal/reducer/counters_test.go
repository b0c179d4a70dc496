package reducer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// TestCountersPerGradientUnderBackPressure: N gradients pushed by clients
// that try up to 30 (or, half of them, 2) times on full queues, through a
// secondary in the primary's hub and one in another process. One Stats
// call to the primary's hub then shows pushed = N and applied + dropped
// (lost included) = N exactly: a gradient refused many times and then
// admitted is no drop, one given up is one drop, and its attempts are
// counted apart; the drops are exactly the gradients whose clients gave up.
func TestCountersPerGradientUnderBackPressure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const (
		n       = 64 << 10 // floats: a step takes long enough to fill queues
		clients = 6
		each    = 20
	)
	h := hubtest.Start(t, hub.Config{Reducer: reducer.Config{Secondaries: 1, BatchSize: 1, MaxQueue: 1, MaxWait: time.Millisecond}})
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
	if _, _, err := admin.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.Adam, LR: 1e-3}}); err != nil {
		t.Fatal(err)
	}
	startProc(t, "serve", "--role", "reducer", "--primary", addr, "--listen", "127.0.0.1:0", "--data", "",
		"--reduce-batch-size", "1", "--max-queue-size", "1", "--max-wait", "1ms", "--log-level", "warn")
	testkit.Eventually(t, 30*time.Second, "two secondaries attached", func() bool {
		secs, err := admin.Secondaries(ctx)
		return err == nil && len(secs) == 2
	})

	var mu sync.Mutex
	var ok, gaveUp int
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	for c := range clients {
		id := fmt.Sprintf("bp%d", c)
		// Half the clients give up soon, so that some gradients are
		// dropped after several refusals.
		attempts := 30
		if c%2 == 1 {
			attempts = 2
		}
		cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: id, MaxAttempts: attempts, Rand: rand.New(rand.NewPCG(uint64(c), 9))})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := uint64(1); s <= each; s++ {
				_, err := cl.PushSeq(ctx, "m", 0, s, gradFor(n, id, s))
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, errs.ErrFull):
					gaveUp++
				default:
					errc <- fmt.Errorf("%s seq %d: %w", id, s, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// One call, once nothing is held any more.
	var st reducer.Stats
	testkit.Eventually(t, 30*time.Second, "the queues to drain", func() bool {
		var err error
		st, err = admin.HubStats(ctx, "")
		return err == nil && st.QueueDepth == 0 && st.Total.Applied+st.Total.DroppedTotal() == st.Total.Pushed
	})
	const total = clients * each
	tot := st.Total
	if len(st.Unreachable) > 0 || len(st.Parts) != 3 {
		t.Fatalf("the primary's hub reports parts %v, unreachable %v: want primary, its secondary and the remote one", keys(st.Parts), st.Unreachable)
	}
	remoteParts := 0
	for name := range st.Parts {
		if strings.HasPrefix(name, "secondary/127.0.0.1:") {
			remoteParts++
		}
	}
	if remoteParts != 1 {
		t.Fatalf("parts %v: want one secondary/<addr>/<id> part for the remote secondary", keys(st.Parts))
	}
	if tot.Pushed != total || tot.Applied+tot.DroppedTotal() != total {
		t.Fatalf("%d gradients: pushed %d, applied %d + dropped %d (%v); attempts %d", total, tot.Pushed, tot.Applied, tot.DroppedTotal(), tot.Dropped, tot.Attempts)
	}
	if full := tot.Dropped[reduce.ReasonFull]; full != uint64(gaveUp) || tot.Applied+tot.Dropped[reduce.ReasonLost] != uint64(ok) {
		t.Fatalf("clients: %d admitted, %d gave up after 30 tries; hub: applied %d, dropped %v", ok, gaveUp, tot.Applied, tot.Dropped)
	}
	if tot.Attempts <= tot.Pushed || gaveUp == 0 {
		t.Fatalf("attempts %d, pushed %d, %d gave up: not enough back-pressure for the test to show anything", tot.Attempts, tot.Pushed, gaveUp)
	}
	t.Logf("%d gradients in %d attempts: %d applied, dropped %v (clients: %d admitted, %d gave up)", total, tot.Attempts, tot.Applied, tot.Dropped, ok, gaveUp)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
