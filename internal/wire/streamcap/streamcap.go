// Package streamcap caps the gRPC streams one peer IP holds open on a
// server at once. grpc-go bounds the streams of a connection only by what
// the server advertises (no limit by default), and a long-lived stream (a
// watch, a weight stream) holds a handler goroutine and its buffers for as
// long as the client keeps it: without a cap one client could open them
// by the million, whatever the cap on its connections. A stream past the
// cap fails ResourceExhausted at once, a clear error where a
// per-connection limit (SETTINGS_MAX_CONCURRENT_STREAMS) would have made
// a client's next stream wait unseen for a free slot.
package streamcap

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// DefaultPerPeer is the default cap: far above what the clients of a
// whole machine hold (a watch or weight stream per collector, a push in
// flight per learner), and at most some 100 MB of handlers' stacks and
// buffers per peer IP.
const DefaultPerPeer = 4096

// perPeer counts what each peer IP holds, up to max.
type perPeer struct {
	max int

	mu   sync.Mutex
	open map[string]int // by peer IP
}

func newPerPeer(max int) perPeer { return perPeer{max: max, open: map[string]int{}} }

// take counts one more for ip, unless ip holds max already.
func (c *perPeer) take(ip string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[ip] >= c.max {
		return false
	}
	c.open[ip]++
	return true
}

// give gives back one take.
func (c *perPeer) give(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[ip]--; c.open[ip] == 0 {
		delete(c.open, ip)
	}
}

// Held is how many ip holds.
func (c *perPeer) Held(ip string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open[ip]
}

// Cap counts the streams open per peer IP.
type Cap struct{ perPeer }

// New returns a cap of max streams per peer IP (max > 0).
func New(max int) *Cap { return &Cap{newPerPeer(max)} }

// StreamInterceptor refuses a stream past the cap; unary calls are not
// counted.
func (c *Cap) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		ip := peerIP(ss.Context())
		if !c.take(ip) {
			return status.Errorf(codes.ResourceExhausted,
				"rlhub: this peer already holds %d streams open on this server (its --max-streams-per-peer); close some", c.max)
		}
		defer c.give(ip)
		return next(srv, ss)
	}
}

// Calls caps the calls, unary ones included, one peer IP has in progress
// on a server, counted from their headers (Tap). grpc-go starts a unary
// handler's goroutine on the headers and lets it wait for the request
// message before any unary interceptor runs: the stream cap
// (StreamInterceptor) never sees it, so without this one connection
// could hold any number of them.
type Calls struct{ perPeer }

// NewCalls returns a cap of max calls in progress per peer IP (max > 0).
func NewCalls(max int) *Calls { return &Calls{newPerPeer(max)} }

// Tap counts the call whose stream ctx is (grpc.InTapHandle's), refusing
// it past the cap; the count is given back when ctx ends (the stream's
// end, whatever it was).
func (c *Calls) Tap(ctx context.Context) error {
	ip := peerIP(ctx)
	if !c.take(ip) {
		return status.Errorf(codes.ResourceExhausted,
			"rlhub: this peer already has %d calls in progress on this server; wait for some to end", c.max)
	}
	context.AfterFunc(ctx, func() { c.give(ip) })
	return nil
}

// peerIP is the peer a call counts against, as the listener counts its
// connections (bulk.PeerIP).
func peerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	return bulk.PeerIP(p.Addr)
}
