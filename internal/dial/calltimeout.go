package dial

import (
	"context"
	"errors"
	"time"
)

// errCallTimeout is the cause of a call context ended by its default
// bound (CallContext's timeout), not by its caller.
var errCallTimeout = errors.New("dial: the call's default timeout passed")

// CallContext derives the context of one call from ctx: bounded by
// timeout when ctx has no deadline of its own (a client's CallTimeout, so
// that context.Background() against a hub that never answers does not
// hang for ever; 0: no bound), and ended when closing ends (the client's
// Close). stop releases both; call it when the call returns.
// CallTimedOut tells whether the default bound ended the call.
func CallContext(ctx, closing context.Context, timeout time.Duration) (call context.Context, stop func()) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); !ok && timeout > 0 {
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, errCallTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	unwatch := context.AfterFunc(closing, cancel)
	return ctx, func() { unwatch(); cancel() }
}

// CallTimedOut reports whether err ended a call of ctx (from CallContext)
// because its default bound passed, so the caller's error can name the
// bound. A socket deadline set from ctx's may fail a read a moment before
// ctx's own timer fires: once the deadline has passed ctx is done at once,
// so it is waited for.
func CallTimedOut(ctx context.Context, err error) bool {
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(dl) {
		<-ctx.Done()
	}
	return errors.Is(context.Cause(ctx), errCallTimeout)
}
