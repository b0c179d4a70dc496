package wire

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/rlhub/rlhub/internal/errs"
)

// Budget bounds the bytes that bodies in progress hold together (store
// pushes, learner batches): each holds a buffer of its announced size from
// its header on, however slowly its bytes come, so without a budget a
// writer opening many at the largest size holds them all.
type Budget struct {
	sem  *semaphore.Weighted
	max  int64
	wait time.Duration
}

// NewBudget is a budget of max bytes; Take waits up to wait for room.
func NewBudget(max int64, wait time.Duration) *Budget {
	return &Budget{sem: semaphore.NewWeighted(max), max: max, wait: wait}
}

// Take reserves n bytes (a body larger than the whole budget takes all of
// it: it goes alone) and returns their release. It waits for room up to
// the budget's wait, holding nothing meanwhile, then fails with an error
// wrapping errs.ErrFull that says what, the bodies in progress, holds the
// room (the caller adds whose and which flag sets it); or with ctx's error
// when ctx ends first.
func (b *Budget) Take(ctx context.Context, n uint64, what string) (release func(), err error) {
	k := int64(min(n, uint64(b.max)))
	wctx, cancel := context.WithTimeout(ctx, b.wait)
	err = b.sem.Acquire(wctx, k)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: the %s in progress hold %d bytes or more, and %d more found no room within %v",
			errs.ErrFull, what, b.max-k+1, k, b.wait)
	}
	return func() { b.sem.Release(k) }, nil
}

// Full reports whether the bodies in progress hold every byte of the
// budget now (tests wait for it).
func (b *Budget) Full() bool {
	if b.sem.TryAcquire(1) {
		b.sem.Release(1)
		return false
	}
	return true
}
