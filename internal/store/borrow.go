package store

import "context"

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
