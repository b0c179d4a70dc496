// Package messagedue bounds how long a gRPC call may take from its
// headers to its handler. grpc-go runs a unary call's interceptors and
// handler only once its whole request message came, so a peer could open
// calls and never finish their messages, each holding a goroutine and the
// bytes sent so far for as long as it liked (up to a server's calls cap
// per peer). A server arms a Clock on each call's headers
// (grpc.InTapHandle) and stops it as the call reaches its interceptors
// (ServerOptions): a unary call once its message is in, a stream at once,
// where the server's body limits take over. The hub and a cluster's
// standby server both use it.
package messagedue

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

// Clock is the time a call's request message is due within.
type Clock struct {
	// After is the bound, from the call's headers (> 0).
	After time.Duration
	// Bound names it in the error a late call fails with, after "did
	// not arrive within ", e.g. "the server's --body-timeout plus its
	// maximum size at --body-min-rate".
	Bound string
	// Logger reports each call cut; nil means slog.Default().
	Logger *slog.Logger
}

type dueKey struct{}

// dueCtx is a call's context from its headers: cancelled, with Err
// DeadlineExceeded (grpc-go answers a read it ends with that code), when
// the call has not reached its handler in time.
type dueCtx struct {
	context.Context
	late  atomic.Bool
	timer *time.Timer
	bound string
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

// Arm starts the clock of the call whose headers came with ctx (the
// tap's), and returns the context the call runs under.
func (m Clock) Arm(ctx context.Context, method string) context.Context {
	logger := m.Logger
	if logger == nil {
		logger = slog.Default()
	}
	inner, cancel := context.WithCancel(ctx)
	c := &dueCtx{Context: inner, bound: m.Bound}
	c.timer = time.AfterFunc(m.After, func() {
		c.late.Store(true)
		cancel()
		logger.Warn("grpc: call cut: its request message did not arrive within the body deadline", "method", errs.Quote(method), "after", m.After)
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
	return status.Error(codes.DeadlineExceeded, "rlhub: the call's request message did not arrive within "+c.bound)
}

// ServerOptions are the interceptors that stop the clock as a call
// reaches them: a unary one once its message is in, a stream at once.
// They go first in the server's chains.
func (m Clock) ServerOptions() []grpc.ServerOption {
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
