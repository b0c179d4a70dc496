package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
)

// Resign ends the term proof before it gives up the election: once the
// key is deleted a standby may be elected at once, and Valid — the check
// a publish makes before its commit, with no etcd round trip — must not
// still pass on the resigned term while the new one's passes too. Nor do
// renewals made meanwhile (one may check the key before the deletion)
// bring it back.
func TestResignEndsTheTermProof(t *testing.T) {
	e := clustertest.Start(t)
	a := join(t, e.Endpoint, "c", "a", 5*time.Second)
	b := join(t, e.Endpoint, "c", "b", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	ended := ta.ProofEnded()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ta.Valid(); !errors.Is(err, ErrDeposed) {
		t.Fatalf("Valid after Resign: %v, want ErrDeposed", err)
	}
	select {
	case <-ended:
	default:
		t.Fatal("ProofEnded still open after Resign")
	}
	tb, err := b.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if va, vb := ta.Valid(), tb.Valid(); va == nil || vb != nil {
		t.Fatalf("a resigned and b is primary (epoch %d): a's term (epoch %d) Valid = %v, b's = %v", tb.Epoch, ta.Epoch, va, vb)
	}
	if err := ta.Renew(ctx); !errors.Is(err, ErrDeposed) {
		t.Fatalf("renewing the resigned term: %v, want ErrDeposed", err)
	}

	// b resigns while its term is renewed without a pause.
	renewing, stopRenewing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for renewing.Err() == nil {
				_ = tb.Renew(renewing)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	err = b.Resign(ctx)
	valid := tb.Valid()
	stopRenewing()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if after := tb.Valid(); !errors.Is(valid, ErrDeposed) || after == nil {
		t.Fatalf("b's term renewed while it resigned: Valid right after Resign %v, once the renewals stopped %v; want ErrDeposed, then not nil", valid, after)
	}
}
