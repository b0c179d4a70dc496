package store

import (
	"context"
	"errors"
	"time"
)

// Borrow returns a version of name from r (0: the newest) with a release
// the caller calls once when done reading it: lent when r is a Lender
// (the version can still go back to its writer once dropped), else taken
// by Get, with a release that does nothing.
func Borrow(ctx context.Context, r Store, name string, version uint64) (*Snapshot, func(), error) {
	if l, ok := r.(Lender); ok {
		return l.Lend(ctx, name, version)
	}
	snap, err := r.Get(ctx, name, version)
	return snap, func() {}, err
}

// Waiter is what BorrowNewer needs of a store: WaitNewer.
type Waiter interface {
	WaitNewer(ctx context.Context, name string, after uint64) (*Snapshot, error)
}

// BorrowNewer is Borrow for WaitNewer: it lends when r is a Lender.
func BorrowNewer(ctx context.Context, r Waiter, name string, after uint64) (*Snapshot, func(), error) {
	if l, ok := r.(Lender); ok {
		return l.LendNewer(ctx, name, after)
	}
	snap, err := r.WaitNewer(ctx, name, after)
	return snap, func() {}, err
}

// LifePoll is how often BorrowNewerLife looks at the newest version's life
// on a store that numbers lives (LifeReader) but cannot wait for another
// life (no LifeWaiter: a cluster primary's replica.Fenced).
const LifePoll = 250 * time.Millisecond

// BorrowNewerLife is BorrowNewer that also returns the newest version when
// it is of another life than life (0: any life, as BorrowNewer): at once
// on a LifeWaiter, within LifePoll on a LifeReader. A store that numbers
// no lives gives BorrowNewer's answer.
func BorrowNewerLife(ctx context.Context, r Waiter, name string, after, life uint64) (*Snapshot, func(), error) {
	if life == 0 {
		return BorrowNewer(ctx, r, name, after)
	}
	if w, ok := r.(LifeWaiter); ok {
		return w.LendNewerLife(ctx, name, after, life)
	}
	lr, ok := r.(LifeReader)
	if !ok {
		return BorrowNewer(ctx, r, name, after)
	}
	for {
		if _, now, err := lr.NewestLife(name); err == nil && now != life {
			snap, release, err := BorrowNewer(ctx, r, name, 0) // the newest, at once
			if err != nil || snap.Version > after || snap.life != life {
				return snap, release, err
			}
			release() // the old life again (a stale read): wait on
		}
		wctx, cancel := context.WithTimeout(ctx, LifePoll)
		snap, release, err := BorrowNewer(wctx, r, name, after)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return snap, release, err
		}
	}
}
