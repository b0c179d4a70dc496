package dial

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCallContext(t *testing.T) {
	t.Run("no deadline: bounded, and says so", func(t *testing.T) {
		ctx, stop := CallContext(context.Background(), context.Background(), 20*time.Millisecond)
		defer stop()
		<-ctx.Done()
		if !CallTimedOut(ctx, ctx.Err()) {
			t.Fatalf("a call ended by its default bound: CallTimedOut false (cause %v)", context.Cause(ctx))
		}
	})
	t.Run("the caller's deadline is kept, and not the default's", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		ctx, stop := CallContext(parent, context.Background(), time.Hour)
		defer stop()
		if dl, _ := ctx.Deadline(); dl.After(time.Now().Add(time.Minute)) {
			t.Fatalf("deadline %v: the default bound replaced the caller's", dl)
		}
		<-ctx.Done()
		if CallTimedOut(ctx, ctx.Err()) {
			t.Fatal("a call ended by its caller's deadline said the default bound ended it")
		}
	})
	t.Run("timeout 0: no bound", func(t *testing.T) {
		ctx, stop := CallContext(context.Background(), context.Background(), 0)
		defer stop()
		if _, ok := ctx.Deadline(); ok {
			t.Fatal("timeout 0 set a deadline")
		}
	})
	t.Run("closing ends the call", func(t *testing.T) {
		closing, closeClient := context.WithCancel(context.Background())
		ctx, stop := CallContext(context.Background(), closing, time.Hour)
		defer stop()
		closeClient()
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the client's close did not end the call")
		}
		if CallTimedOut(ctx, ctx.Err()) || !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("a call ended by close: %v, CallTimedOut %v", ctx.Err(), CallTimedOut(ctx, ctx.Err()))
		}
	})
}
