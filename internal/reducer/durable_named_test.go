package reducer

import (
	"context"
	"testing"

	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestDurableNamesEveryFileItChanges: with a StateChanged, the primary
// names every file of its state directory it writes or removes — the
// registration, each journal append and compaction, each optimizer state
// written and the one before removed, a restart's cleanup — before the
// push of the version it belongs to (or, for what follows a push, by the
// next check).
func TestDurableNamesEveryFileItChanges(t *testing.T) {
	e := newDurableEnv(t)
	names := testkit.NewStateNames(t, e.stateDir)
	inner := e.st
	e.st = storetest.BeforePush{Store: inner, Check: names.Check}
	cfg := PrimaryConfig{JournalCompactBytes: 300, LedgerWindow: 4, StateChanged: names.Changed}
	p := e.open(cfg)
	if _, _, err := p.Register(context.Background(), e.mc); err != nil {
		t.Fatal(err)
	}
	names.Check("after Register")
	e.steps(p, 1, 12) // compacts the journal on the way
	names.Check("after 12 steps")
	e.close()
	e.openStore()
	e.st = storetest.BeforePush{Store: e.st, Check: names.Check}
	e.open(cfg) // restores: the journal cut back, stale state files removed
	names.Check("after the restart")
	e.steps(e.p, 13, 14)
	names.Check("after 14 steps")
	if got := names.Checks(); got < 14 {
		t.Fatalf("%d checks, want one per push at least", got)
	}
}
