package hub

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
)

// messageDue bounds how long a gRPC call may take from its headers to its
// handler. grpc-go runs a unary call's interceptors and handler only once
// its whole request message came, so a peer with a valid token could open
// calls and never finish their messages, each holding a goroutine and the
// bytes sent so far for as long as it liked (up to the calls cap per
// peer). A unary message is at most MaxMsgBytes: it is due within
// BodyTimeout + MaxMsgBytes/BodyMinRate, as a pushed body of that size. A
// stream reaches its handler at once, where the body limits take over.
type messageDue struct {
	after  time.Duration
	logger *slog.Logger
}

type dueKey struct{}

// dueCtx is a call's context from its headers: cancelled, with Err
// DeadlineExceeded (grpc-go answers a read it ends with that code), when
// the call has not reached its handler in time.
type dueCtx struct {
	context.Context
	late  atomic.Bool
	timer *time.Timer
}

func (c *dueCtx) Err() error {
	if c.late.Load() {
		return context.DeadlineExceeded
	}
	return c.Context.Err()
}

func (c *dueCtx) Value(key any) any {
	if key == (dueKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// arm starts the clock of the call whose headers came with ctx (the tap's).
func (m messageDue) arm(ctx context.Context, method string) context.Context {
	inner, cancel := context.WithCancel(ctx)
	c := &dueCtx{Context: inner}
	c.timer = time.AfterFunc(m.after, func() {
		c.late.Store(true)
		cancel()
		m.logger.Warn("grpc: call cut: its request message did not arrive within the body deadline", "method", errs.Quote(method), "after", m.after)
	})
	context.AfterFunc(inner, func() { c.timer.Stop() }) // the call ended (inner ends with it)
	return c
}

// reached stops the clock of the call running under ctx; an error when it
// had run out already.
func reached(ctx context.Context) error {
	c, ok := ctx.Value(dueKey{}).(*dueCtx)
	if !ok || c.timer.Stop() || !c.late.Load() {
		return nil
	}
	return status.Error(codes.DeadlineExceeded, "rlhub: the call's request message did not arrive within the server's --body-timeout plus its maximum size at --body-min-rate")
}

// interceptors stop the clock as a call reaches them: a unary one once its
// message is in, a stream at once.
func (m messageDue) interceptors() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if err := reached(ctx); err != nil {
				return nil, err
			}
			return next(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			if err := reached(ss.Context()); err != nil {
				return err
			}
			return next(srv, ss)
		}),
	}
}
