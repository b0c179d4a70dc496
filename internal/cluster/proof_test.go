package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// The term proof: none before the first renewal; a renewal proves the
// term for less than the lease; without renewals it runs out by itself
// (a primary stopped past it resumes unable to write); Hold keeps it; and
// once the lease is gone it reads as deposed, not as expired.
func TestTermProofHoldsForLessThanTheLease(t *testing.T) {
	e := clustertest.Start(t)
	m := join(t, e.Endpoint, "proof", "p1", 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	term, err := m.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := term.Valid(); !errors.Is(err, ErrProofExpired) {
		t.Fatalf("Valid before any renewal: %v, want ErrProofExpired", err)
	}
	before := time.Now()
	if err := term.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if err := term.Valid(); err != nil {
		t.Fatalf("Valid right after a renewal: %v", err)
	}
	// The proof ends a fifth of the lease before the lease can, counted
	// from the keep-alive's send (between before and after).
	term.mu.Lock()
	until := term.validUntil
	term.mu.Unlock()
	if until.After(after.Add(2*time.Second-400*time.Millisecond)) || until.Before(before.Add(2*time.Second-400*time.Millisecond)) {
		t.Fatalf("the proof ends %v after the renewal began, want 1.6s from the keep-alive's send (renewal took %v)", until.Sub(before), after.Sub(before))
	}
	testkit.Eventually(t, 10*time.Second, "the proof to run out without renewals", func() bool {
		return errors.Is(term.Valid(), ErrProofExpired)
	})

	hctx, hcancel := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() { held <- term.Hold(hctx) }()
	testkit.Eventually(t, 10*time.Second, "Hold to renew the proof", func() bool { return term.Valid() == nil })
	hcancel()
	if err := testkit.Recv(t, held, 10*time.Second, "Hold to return"); err != nil {
		t.Fatalf("Hold: %v", err)
	}

	// The lease revoked (what an expiry does): deposed, however fresh the proof.
	if err := term.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.cli.Revoke(ctx, m.sess.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := term.Renew(ctx); !errors.Is(err, ErrDeposed) {
		t.Fatalf("Renew after the lease was revoked: %v, want ErrDeposed", err)
	}
	if err := term.Valid(); !errors.Is(err, ErrDeposed) {
		t.Fatalf("Valid after the lease was revoked: %v, want ErrDeposed", err)
	}
}
