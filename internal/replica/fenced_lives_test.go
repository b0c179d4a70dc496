package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
)

// A cluster primary's store waits for another life (store.LifeWaiter), so
// that the hub's followers that follow lives take a model deleted and
// pushed again as soon as its version is acknowledged; before, Fenced was
// no LifeWaiter and the hub looked every store.LifePoll. Like its other
// reads it waits only for acknowledged versions: the new life's version
// the standbys do not hold yet is not returned.
func TestFencedWaitsForAnotherLifeAcknowledged(t *testing.T) {
	x := newFencedFixture(t, nil)
	f, ctx := x.f, context.Background()
	x.pushAcked(5, "m")
	w, ok := any(f).(store.LifeWaiter)
	if !ok {
		t.Fatal("replica.Fenced is not a store.LifeWaiter: a new life reaches a primary's followers only by polling")
	}
	v5, release, err := f.Lend(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	oldLife := v5.Life()
	release()
	if oldLife == 0 {
		t.Fatal("v5 has no life")
	}
	type result struct {
		snap *store.Snapshot
		err  error
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := make(chan result, 1)
	go func() {
		snap, release, err := w.LendNewerLife(wctx, "m", 5, oldLife)
		if err == nil {
			release()
		}
		got <- result{snap, err}
	}()

	if err := f.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	x.setStandbys("s1") // s1 never acknowledges
	x.notAcked("push of the new model's v1 with s1 silent", x.pushAny(1, 11))
	select {
	case r := <-got:
		t.Fatalf("LendNewerLife returned %s, %v while the new life's only version is not acknowledged", versionOf(r.snap), r.err)
	default:
	}
	x.setStandbys()
	if err := x.pushAny(2, 12); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.snap.Version != 2 || r.snap.Life() == oldLife || r.snap.Life() == 0 || r.snap.Epoch != 7 {
		t.Fatalf("LendNewerLife(after v5 of life %d) = %s life %d, %v; want the new life's acknowledged v2 at epoch 7",
			oldLife, versionOf(r.snap), lifeOf(r.snap), r.err)
	}
}

func lifeOf(s *store.Snapshot) uint64 {
	if s == nil {
		return 0
	}
	return s.Life()
}
