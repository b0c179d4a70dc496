//go:build linux

package wsync

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// TestPollWhileRunAppliesFromALeaseIsRefused: the default shm collector
// (a Failover over ShmDialer, leasing) holds one lease. A Poll that called
// the source while Run's apply was still copying v1 from its leased slot
// moved the lease to v2: the writer then reused v1's slot, and the
// weights got another version's bytes under v1's number. A second caller
// of a leasing source is now refused (ErrSourceInUse), and the apply in
// progress reads its own version's bytes whatever is published meanwhile.
func TestPollWhileRunAppliesFromALeaseIsRefused(t *testing.T) {
	ctx := context.Background()
	w, path := threeSlots(t)
	const n = 4000
	entered, gate := make(chan struct{}), make(chan struct{})
	torn := make(chan uint64, 8)
	apply := func(s *store.Snapshot) error {
		if s.Version == 1 {
			close(entered)
			<-gate // a slow apply: a big model's copy
		}
		want := make([]byte, 4*n)
		wsynctest.Fill(want, s.Version)
		if !bytes.Equal(s.Tensors.Get("w").Data, want) {
			torn <- s.Version
		}
		return nil
	}
	f, err := NewFailover(FailoverConfig{Logger: testkit.Logger(), Dialers: []Dialer{ShmDialer("relay-shm", path, "m")}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := NewReceiver(ReceiverConfig{Source: f, Apply: apply})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, n)); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(rctx) }()
	<-entered // Run applies v1 from its leased slot
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 2, n)); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Poll(ctx); ok || !errors.Is(err, ErrSourceInUse) {
		t.Fatalf("Poll while Run applies from the lease: %v, %v (want ErrSourceInUse)", ok, err)
	}
	for v := uint64(3); v <= 4; v++ { // with the lease moved, v4 went into v1's slot
		if err := w.Publish(ctx, wsynctest.Snap(t, "m", v, n)); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	testkit.Eventually(t, 30*time.Second, "Run at v4", func() bool { return r.Version() == 4 })
	cancel()
	if err := <-runDone; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	close(torn)
	for v := range torn {
		t.Errorf("v%d was applied from bytes that are no longer its", v)
	}
	// Run over, Poll may call the source again.
	if _, err := r.Poll(ctx); err != nil {
		t.Fatalf("Poll once Run ended: %v", err)
	}
}
