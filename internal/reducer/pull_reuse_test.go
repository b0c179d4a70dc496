package reducer_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	"github.com/rlhub/rlhub/internal/wsync"
)

// reuseGrad is gradient s of the reuse tests: benchModel's values scaled.
func reuseGrad(s uint64) *tensor.StateDict {
	g := benchModel(1 << 16)
	for _, tn := range g.Tensors() {
		f, _ := tn.Float32s()
		for i := range f {
			f[i] *= float32(s%5) - 2
		}
	}
	return g
}

// reuseHub starts a hub with one in-hub secondary (batch 1) and the store
// config st, publishes benchModel(1<<16) as version 1 of "m", registers it
// with cfg, and returns the hub and a client; onApply sees each step.
func reuseHub(t *testing.T, ctx context.Context, st store.Config, cfg optim.Config, onApply func(v uint64)) (*hub.Hub, *reducer.Client) {
	t.Helper()
	quiet := testkit.Logger()
	h := hubtest.Start(t, hub.Config{Logger: quiet, Store: st,
		Reducer: reducer.Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond, MaxQueue: 4,
			OnApply: func(_ string, v uint64, _ []reduce.ID, _ []float32) { onApply(v) }}})
	blob, err := safetensors.Encode(benchModel(1<<16), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	cl, err := reducer.NewClient(reducer.ClientConfig{Hub: h.Addr().String(), ClientID: "learner"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	if _, _, err := cl.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: cfg}); err != nil {
		t.Fatal(err)
	}
	waitSecondaries(t, cl, 1)
	return h, cl
}

// checkVersions requires every got[v] to be byte for byte the model after
// v−1 steps of cfg over reuseGrad(1), reuseGrad(2), …, computed apart, and
// returns how many it checked.
func checkVersions(t *testing.T, cfg optim.Config, steps uint64, got map[uint64][]byte) int {
	t.Helper()
	ref := benchModel(1 << 16)
	opt, err := optim.New(cfg, ref)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for s := uint64(1); s <= steps; s++ {
		if err := opt.Step(ref, reuseGrad(s)); err != nil {
			t.Fatal(err)
		}
		b, ok := got[1+s]
		if !ok {
			continue
		}
		want, err := safetensors.Encode(ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("version %d as received differs from the model after %d steps computed apart", 1+s, s)
		}
		checked++
	}
	return checked
}

// TestLearnerPullsDoNotStopBlobReuse: a learner loop through a real hub —
// push a gradient, wait for its version, pull the newest over gRPC (with
// the chunk codec and with the stock codec, as Python does) — while the
// primary writes its steps into blobs the store gives back. Pulls borrow
// versions (store.Lender, chunkcodec.Lend), so the primary still reuses
// blobs (pulls that took versions would leave none); and every pulled
// version is byte for byte the model computed apart.
func TestLearnerPullsDoNotStopBlobReuse(t *testing.T) {
	const pushes = 48
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	applied := map[uint64]bool{}
	cfg := optim.Config{Kind: optim.SGD, LR: 0.01, Momentum: 0.9}
	h, cl := reuseHub(t, ctx, store.Config{}, cfg, func(v uint64) { mu.Lock(); applied[v] = true; mu.Unlock() })
	pullers := map[bool]*storerpc.Client{}
	for _, stock := range []bool{false, true} {
		sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String(), StockCodec: stock})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		pullers[stock] = sc
	}

	pulled := map[uint64][]byte{}
	for s := uint64(1); s <= pushes; s++ {
		if _, err := cl.PushSeq(ctx, "m", 0, s, reuseGrad(s)); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, time.Minute, fmt.Sprintf("version %d to be published", 1+s), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return applied[1+s]
		})
		snap, err := pullers[s%2 == 0].Get(ctx, "m", 0) // every version
		if err != nil {
			t.Fatal(err)
		}
		pulled[snap.Version] = snap.Blob
	}

	// Lent versions come back once dropped from retention (3).
	reused := h.Reducer().Primary().BlobsReused("m")
	if reused < pushes/2 {
		t.Fatalf("%d of %d steps reused a blob while the learner pulled every version", reused, pushes)
	}
	if st, err := cl.HubStats(ctx, ""); err != nil || st.Models["m"].BlobsReused != reused {
		t.Fatalf("the Stats RPC says %v steps reused a blob (%v), the primary %d", st.Models, err, reused)
	}
	if n := checkVersions(t, cfg, pushes, pulled); n != pushes {
		t.Fatalf("%d versions pulled, want %d", n, pushes)
	}
	t.Logf("%d versions pulled, %d of %d steps reused a blob", len(pulled), reused, pushes)
}

// TestWatchersSeeWholeVersionsWhileBlobsAreReused: the store keeps only
// the newest version, a learner pushes flat out, and two store watchers
// (chunk codec in 16 KiB chunks, and stock codec), one of them slow, and a
// weight-sync push collector stream versions that are dropped while they
// are being sent. The blob of a
// version being sent must not be written by a later step until gRPC has
// let go of it (grpc-go frames queued chunks after SendMsg returns):
// every version a watcher receives is byte for byte the model after that
// many steps, computed apart, while the primary reuses blobs throughout.
func TestWatchersSeeWholeVersionsWhileBlobsAreReused(t *testing.T) {
	const pushes = 80
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	applied := 0
	cfg := optim.Config{Kind: optim.Adam, LR: 0.01}
	h, cl := reuseHub(t, ctx, store.Config{Retain: 1}, cfg, func(uint64) { mu.Lock(); applied++; mu.Unlock() })

	var wmu sync.Mutex // guards seen, latest
	seen := map[uint64][]byte{}
	var latest [2]uint64         // the newest version each watcher took
	var collLatest atomic.Uint64 // the newest version the collector took
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for watcher, stock := range []bool{false, true} {
		sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String(), StockCodec: stock, ChunkBytes: 16 << 10})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = sc.Watch(wctx, "m", 1, func(snap *store.Snapshot, _ uint64) error {
				wmu.Lock()
				seen[snap.Version] = snap.Blob
				latest[watcher] = max(latest[watcher], snap.Version)
				wmu.Unlock()
				if !stock {
					time.Sleep(2 * time.Millisecond) // slow: the server blocks mid-version
				}
				return nil
			})
		}()
	}
	conn, err := grpc.NewClient(h.Addr().String(), append(chunkcodec.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	collector, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: "c", Model: "m", Start: 1, ChunkBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Close()
	pushed := map[uint64][]byte{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := uint64(1); ; {
			snap, err := collector.WaitNewer(wctx, v)
			if err != nil {
				return
			}
			pushed[snap.Version], v = snap.Blob, snap.Version
			collLatest.Store(v)
			time.Sleep(time.Millisecond) // slowish: the hub blocks mid-version
		}
	}()

	for s := uint64(1); s <= pushes; s++ {
		if _, err := cl.PushSeq(ctx, "m", 0, s, reuseGrad(s)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, time.Minute, fmt.Sprint(pushes, " steps applied"), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return applied == pushes
	})
	// Each watcher and the collector skip to the newest version, so each
	// takes the last one, 1+pushes, before they are stopped.
	testkit.Eventually(t, time.Minute, "the watchers and the collector to take the last version", func() bool {
		wmu.Lock()
		defer wmu.Unlock()
		return latest[0] == 1+pushes && latest[1] == 1+pushes && collLatest.Load() == 1+pushes
	})
	stopWatch()
	wg.Wait()

	reused := h.Reducer().Primary().BlobsReused("m")
	if reused == 0 {
		t.Fatal("no step reused a blob")
	}
	checked := checkVersions(t, cfg, pushes, seen)
	if checked < 10 {
		t.Fatalf("only %d versions watched", checked)
	}
	collected := checkVersions(t, cfg, pushes, pushed)
	if collected < 10 {
		t.Fatalf("only %d versions pushed to the collector", collected)
	}
	t.Logf("%d versions watched and %d pushed whole, %d of %d steps reused a blob", checked, collected, reused, pushes)
}
