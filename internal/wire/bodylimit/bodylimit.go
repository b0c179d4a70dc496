// Package bodylimit bounds the bodies a gRPC server's streams carry, in
// both directions, as the data plane bounds its own (bulk.BodyDeadline):
// a body of n bytes, a head message announcing n followed by chunks, must
// be received or sent whole within an allowance plus n at a minimum rate.
//
// grpc-go bounds a stream only by the client's own deadline, and
// keepalive pings, which a client's transport answers whether or not the
// application reads, keep the connection alive. Without these bounds a
// client that trickles a push holds its handler (a reducer queue slot,
// the store's push) for ever, and one that stops reading a pull, a watch
// or a weight stream holds the version being sent — memory the store
// cannot recycle — for ever: one stream per version it leaves unread.
//
// Past a body's deadline the interceptor answers at once without waiting
// for the handler, which is blocked in RecvMsg or SendMsg: grpc-go then
// ends the stream, which cancels the stream's context, and the blocked
// call fails (grpc-go's own way of waking a stream's call on another
// goroutine). The handler returns moments later on its own goroutine,
// releasing what it holds; Limiter.Wait waits for such handlers.
package bodylimit

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Head reads a body's announced length from a message that starts one
// (ok false for any other message).
type Head func(proto.Message) (n uint64, ok bool)

// Rule says which messages of a method's stream carry bodies: a head
// (Recv, Send) announces a body's length, the Chunk messages that follow
// carry its bytes.
type Rule struct {
	// Recv reads the heads of the bodies the client sends (nil: none).
	Recv Head
	// Send reads the heads of the bodies the server sends (nil: none).
	Send Head
	// Push: the stream is one received body, a push: its first message
	// is due within the allowance of the stream's start, the body within
	// its deadline of the stream's start, and the bound holds until the
	// client's half of the stream ends (a client that sent the body and
	// never closes still holds the handler).
	Push bool
}

// Rules are rlhub's gRPC streams that carry bodies, by full method name.
// LearnerAggregator/Learn is one (a batch is a push); Attach is not one: the aggregator bounds each task's
// send and reply by its own TaskTimeout and detaches a learner that does
// not take its share, while a learner busy with its previous share (which
// reads nothing meanwhile) must not be cut before then.
var Rules = map[string]Rule{
	"/rlhub.v1.Reducer/Push": {Push: true, Recv: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.ReducerPushRequest)
		return r.GetHeader().GetBlob().GetTotalBytes(), ok && r.GetHeader() != nil
	}},
	"/rlhub.v1.ReducerPrimary/Forward": {Push: true, Recv: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.ReducerForwardRequest)
		return r.GetHeader().GetBlob().GetTotalBytes(), ok && r.GetHeader() != nil
	}},
	"/rlhub.v1.ModelStore/Push": {Push: true, Recv: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.StorePushRequest)
		return r.GetHeader().GetBlob().GetTotalBytes(), ok && r.GetHeader() != nil
	}},
	"/rlhub.v1.LearnerAggregator/Learn": {Push: true, Recv: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.LearnRequest)
		return r.GetHeader().GetBlob().GetTotalBytes(), ok && r.GetHeader() != nil
	}},
	"/rlhub.v1.ModelStore/Pull":  {Send: storeVersion},
	"/rlhub.v1.ModelStore/Watch": {Send: storeVersion},
	"/rlhub.v1.WeightSync/Attach": {Send: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.SyncServerMessage)
		return r.GetInfo().GetTotalBytes(), ok && r.GetInfo() != nil
	}},
	"/rlhub.v1.ARS/PullPolicy": {Send: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.ARSPolicyPart)
		return r.GetInfo().GetTotalBytes(), ok && r.GetInfo() != nil
	}},
	"/rlhub.v1.OptimizerHost/Attach": {
		Send: func(m proto.Message) (uint64, bool) {
			r, ok := m.(*rlhubv1.PrimaryMessage)
			return r.GetStep().GetGrad().GetTotalBytes(), ok && r.GetStep() != nil
		},
		Recv: func(m proto.Message) (uint64, bool) {
			r, ok := m.(*rlhubv1.HostMessage)
			return r.GetResult().GetParams().GetTotalBytes(), ok && r.GetResult() != nil
		},
	},
}

// storeVersion is a pull's or a watch's head: a version's header (one
// answering not-modified carries no body).
func storeVersion(m proto.Message) (uint64, bool) {
	r, ok := m.(*rlhubv1.StorePullResponse)
	h := r.GetHeader()
	if !ok || h == nil || h.NotModified {
		return 0, false
	}
	return h.GetBlob().GetTotalBytes(), true
}

// Config is a Limiter's bounds.
type Config struct {
	// Allowance and MinRate: a body of n bytes is due within Allowance +
	// n/MinRate (bulk.BodyDeadline; MinRate 0 adds nothing).
	Allowance time.Duration
	MinRate   int64
	// Rules are the streams bounded (nil: Rules).
	Rules  map[string]Rule
	Logger *slog.Logger
}

// Limiter is the interceptor and what it counts.
type Limiter struct {
	cfg      Config
	received atomic.Uint64 // bodies cut while received
	sent     atomic.Uint64 // bodies cut while sent
	left     sync.WaitGroup
}

// New returns a Limiter for cfg.
func New(cfg Config) *Limiter {
	if cfg.Rules == nil {
		cfg.Rules = Rules
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.MinRate = max(cfg.MinRate, 0)
	return &Limiter{cfg: cfg}
}

// Stats is how many bodies were cut at their deadline.
type Stats struct {
	// Received: bodies clients did not send in time (answered
	// DEADLINE_EXCEEDED; nothing of them stored or applied).
	Received uint64
	// Sent: bodies clients did not take in time (the stream ended
	// UNAVAILABLE; the client asks again for the newest).
	Sent uint64
}

// Stats returns the counts so far.
func (l *Limiter) Stats() Stats {
	return Stats{Received: l.received.Load(), Sent: l.sent.Load()}
}

// Wait waits for the handlers of cut streams to return. Call it after the
// server has stopped (its connections closed wake every such handler).
func (l *Limiter) Wait() { l.left.Wait() }

// ErrNotTaken is what a stream whose reader did not take a body within its
// deadline ends with.
var ErrNotTaken = errors.New("the stream's reader did not take a body within its deadline")

// StreamInterceptor bounds the streams of cfg.Rules; any other stream
// passes through untouched.
func (l *Limiter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		rule, ok := l.cfg.Rules[info.FullMethod]
		if !ok {
			return handler(srv, ss)
		}
		s := &stream{ServerStream: ss, rule: rule, l: l, expired: make(chan struct{})}
		s.recv.s, s.send.s, s.recv.push = s, s, rule.Push
		if rule.Push {
			s.mu.Lock()
			s.recv.start = time.Now()
			s.recv.arm(l.cfg.Allowance)
			s.mu.Unlock()
		}
		done := make(chan error, 1)
		l.left.Add(1)
		go func() {
			defer l.left.Done()
			done <- handler(srv, s)
		}()
		select {
		case err := <-done:
			s.mu.Lock()
			s.over = true
			s.recv.stop()
			s.send.stop()
			s.mu.Unlock()
			return err
		case <-s.expired:
			if s.cutSent {
				l.sent.Add(1)
				l.cfg.Logger.Warn("grpc: stream cut: its reader did not take a body within the body deadline", "method", info.FullMethod,
					"body_timeout", l.cfg.Allowance, "body_min_rate", l.cfg.MinRate)
			} else {
				l.received.Add(1)
				l.cfg.Logger.Warn("grpc: stream cut: a body did not arrive within the body deadline", "method", info.FullMethod,
					"body_timeout", l.cfg.Allowance, "body_min_rate", l.cfg.MinRate)
			}
			return grpcerr.ToStatus(s.err())
		}
	}
}

// stream is a bounded stream.
type stream struct {
	grpc.ServerStream
	rule    Rule
	l       *Limiter
	expired chan struct{} // closed when a body's deadline passed

	mu         sync.Mutex // guards the fields below and recv's and send's
	recv, send body
	first      bool // a message was received
	over       bool // the handler returned, or (Push) the client's half ended
	cut        bool // a deadline passed first
	cutSent    bool // ... while a body was sent
}

// body is one direction's body in progress.
type body struct {
	s *stream
	// push: the received body of a Push stream, timed from the stream's
	// start and bounded until the client's half ends.
	push  bool
	start time.Time
	timer *time.Timer
	gen   int   // the armed timer's generation: an older one's firing is stale
	left  int64 // bytes still to come (0: no body in progress)
}

// arm (re)starts the timer to fire d after the body's start; mu held.
func (b *body) arm(d time.Duration) {
	b.stop()
	b.gen++
	gen := b.gen
	b.timer = time.AfterFunc(time.Until(b.start.Add(d)), func() { b.s.expire(b, gen) })
}

// stop disarms the timer; mu held.
func (b *body) stop() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.gen++
}

// begin starts a body of n bytes now (push: at the stream's start); mu held.
func (b *body) begin(n uint64) {
	if !b.push {
		b.start = time.Now()
	}
	b.left = int64(min(n, 1<<62))
	if b.left == 0 && !b.push {
		b.stop()
		return
	}
	b.arm(bulk.BodyDeadline(b.s.l.cfg.Allowance, b.s.l.cfg.MinRate, b.left))
}

// took counts n bytes of the body; mu held. A body complete is no longer
// bounded (a push's still is, until the client's half ends).
func (b *body) took(n int) {
	if b.left <= 0 {
		return
	}
	b.left -= int64(n)
	if b.left <= 0 && !b.push {
		b.stop()
	}
}

func (s *stream) expire(b *body, gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != b.gen || s.over || s.cut {
		return
	}
	s.cut, s.cutSent = true, b == &s.send
	close(s.expired)
}

func (s *stream) err() error {
	lim := fmt.Sprintf("%v plus 1 s per %d bytes: the server's --body-timeout and --body-min-rate", s.l.cfg.Allowance, s.l.cfg.MinRate)
	if s.cutSent {
		return fmt.Errorf("%w: %w (%s); ask again for the newest", errs.ErrUnavailable, ErrNotTaken, lim)
	}
	return fmt.Errorf("stream: %w (%s)", bulk.ErrBodyDeadline, lim)
}

// RecvMsg receives as the stream does; once a deadline has passed it
// fails with the deadline's error whatever arrived.
func (s *stream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cut:
		return s.err()
	case err != nil:
		if s.rule.Push {
			s.over = true
			s.recv.stop()
		}
		return err
	case s.rule.Recv == nil:
		return nil
	}
	first := !s.first
	s.first = true
	if n, ok := chunkLen(m); ok {
		s.recv.took(n)
	} else if msg := chunkcodec.Received(m); msg != nil {
		if n, ok := s.rule.Recv(msg); ok && (first || !s.rule.Push) {
			s.recv.begin(n)
		}
	}
	return nil
}

// SendMsg sends as the stream does, a body's head starting its deadline
// and its chunks counted once sent; once a deadline has passed it fails.
func (s *stream) SendMsg(m any) error {
	var n int
	var chunk bool
	if s.rule.Send != nil {
		n, chunk = chunkLen(m)
		if msg, ok := m.(proto.Message); ok && !chunk {
			if total, ok := s.rule.Send(msg); ok {
				s.mu.Lock()
				if !s.cut {
					s.send.begin(total)
				}
				s.mu.Unlock()
			}
		}
	}
	err := s.ServerStream.SendMsg(m)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		return s.err()
	}
	if err == nil && chunk {
		s.send.took(n)
	}
	return err
}

// chunkLen is the number of body bytes m, a stream message, carries when
// it is a chunk: a chunk held by the chunk codec, or a message whose
// Chunk is set.
func chunkLen(m any) (int, bool) {
	if c, ok := m.(interface {
		Held() bool
		ChunkLen() int
	}); ok && c.Held() {
		return c.ChunkLen(), true
	}
	if c, ok := chunkcodec.Received(m).(interface{ GetChunk() *rlhubv1.Chunk }); ok && c.GetChunk() != nil {
		return len(c.GetChunk().GetData()), true
	}
	return 0, false
}
