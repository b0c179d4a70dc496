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
