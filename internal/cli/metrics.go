package cli

import (
	"context"
	"errors"
	"sync"
)

// runBoth runs main and its metrics endpoint side by side: when either
// returns (main's work ends, or ctx is done), the other is stopped; both
// have returned when runBoth does.
func runBoth(ctx context.Context, main, side func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var sideErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		sideErr = side(ctx)
	}()
	err := main(ctx)
	cancel()
	wg.Wait()
	return errors.Join(err, sideErr)
}
