package wsync_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// Remote pull / watch: a collector follows a real hub's model store over
// gRPC (storerpc.Client), "only if newer".
func TestStoreSourcePullAndWatchOverTheHub(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	push := func(v uint64) {
		t.Helper()
		if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: storetest.Blob(t, v, 500)}); err != nil {
			t.Fatal(err)
		}
	}

	var applied []uint64
	r, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: wsync.StoreSource{Store: sc, Name: "m"}, Apply: func(s *store.Snapshot) error {
		if s.Tensors == nil || s.Tensors.Len() == 0 {
			t.Errorf("version %d arrived without tensors", s.Version)
		}
		applied = append(applied, s.Version)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	push(1)
	push(2)
	if ok, err := r.Poll(ctx); !ok || err != nil || r.Version() != 2 {
		t.Fatalf("Poll = %v, %v at v%d; want the newest, v2", ok, err, r.Version())
	}
	if ok, err := r.Poll(ctx); ok || err != nil {
		t.Fatalf("second Poll = %v, %v; want not modified", ok, err)
	}

	// Watch: Run follows new versions as they land.
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	stopRun := sync.OnceValue(func() error { rcancel(); return <-done })
	t.Cleanup(func() { stopRun() })
	push(3)
	testkit.Eventually(t, 20*time.Second, "the store source to follow to v3", func() bool { return r.Version() >= 3 })
	if err := stopRun(); err != context.Canceled {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if len(applied) != 2 || applied[0] != 2 || applied[1] != 3 {
		t.Fatalf("applied %v, want [2 3]", applied)
	}
}

// A collector following an in-process store (StoreSource over a
// store.Memory, as the hub's own readers are) with FollowLives takes a
// model deleted and pushed again from version 1 at once; before,
// StoreSource waited with WaitNewer there (only a store client followed
// lives), so the collector kept the deleted model's v5 until the new
// model's versions passed it. One that does not follow lives keeps that
// rule.
func TestStoreSourceOverAnInProcessStoreFollowsLives(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	push := func(v uint64, fill uint64) {
		t.Helper()
		if _, err := st.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: storetest.Blob(t, fill, 500)}); err != nil {
			t.Fatal(err)
		}
	}
	for v := uint64(1); v <= 5; v++ {
		push(v, v)
	}
	type follower struct {
		mu      sync.Mutex
		version uint64
		blob    string
	}
	start := func(follow bool) *follower {
		f := &follower{}
		r, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: wsync.StoreSource{Store: st, Name: "m"}, FollowLives: follow,
			Apply: func(s *store.Snapshot) error {
				f.mu.Lock()
				f.version, f.blob = s.Version, string(s.Blob)
				f.mu.Unlock()
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		t.Cleanup(func() { rcancel(); <-done })
		return f
	}
	at := func(f *follower) (uint64, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.version, f.blob
	}
	lives, older := start(true), start(false)
	testkit.Eventually(t, 20*time.Second, "both followers at v5", func() bool {
		a, _ := at(lives)
		b, _ := at(older)
		return a == 5 && b == 5
	})
	if err := st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	push(1, 101)
	want := string(storetest.Blob(t, 101, 500))
	testkit.Eventually(t, 20*time.Second, "the lives follower at the new model's v1", func() bool {
		v, b := at(lives)
		return v == 1 && b == want
	})
	if v, _ := at(older); v != 5 {
		t.Fatalf("a follower not following lives runs v%d, want the deleted model's v5", v)
	}
	push(6, 106)
	testkit.Eventually(t, 20*time.Second, "both followers at the new model's v6", func() bool {
		a, _ := at(lives)
		b, _ := at(older)
		return a == 6 && b == 6
	})
}
