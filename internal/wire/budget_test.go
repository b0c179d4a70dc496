package wire

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
)

// A budget's bodies share its bytes: a body finds no room while others
// hold it and fails ResourceExhausted after the wait, holding nothing;
// room comes back with a release; a body larger than the whole budget
// goes alone; a caller's context ends the wait with its own error.
func TestBudgetIsSharedByTheBodiesInProgress(t *testing.T) {
	b := NewBudget(10, 50*time.Millisecond)
	ctx := context.Background()
	first, err := b.Take(ctx, 10, "pushes")
	if err != nil || !b.Full() {
		t.Fatalf("the first body of the whole budget: %v, full %v", err, b.Full())
	}
	if _, err := b.Take(ctx, 1, "pushes"); !errors.Is(err, errs.ErrFull) || !strings.Contains(err.Error(), "the pushes in progress hold") {
		t.Fatalf("a body past the budget: %v, want ErrFull naming the pushes", err)
	}
	first()
	if b.Full() {
		t.Fatal("the budget stays full after the release")
	}
	huge, err := b.Take(ctx, 1<<40, "pushes")
	if err != nil || !b.Full() {
		t.Fatalf("a body larger than the budget: %v, full %v (it goes alone)", err, b.Full())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Take(cctx, 1, "pushes"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait whose context ended: %v, want its error", err)
	}
	huge()
}
