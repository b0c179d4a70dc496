package hub

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// pushAnnounced are the gRPC client-streaming pushes whose body the hub
// bounds (Limits.BodyTimeout, BodyMinRate), each with how to read the
// body's announced length from its first message. grpc-go bounds a
// stream only by the client's own deadline, and keepalive pings keep a
// slow sender's connection alive: without this a client sending one
// byte of a chunk every few seconds holds the handler (a reducer queue
// slot, the store's push) for ever.
var pushAnnounced = map[string]func(proto.Message) uint64{
	"/rlhub.v1.Reducer/Push": func(m proto.Message) uint64 {
		r, _ := m.(*rlhubv1.ReducerPushRequest)
		return r.GetHeader().GetBlob().GetTotalBytes()
	},
	"/rlhub.v1.ReducerPrimary/Forward": func(m proto.Message) uint64 {
		r, _ := m.(*rlhubv1.ReducerForwardRequest)
		return r.GetHeader().GetBlob().GetTotalBytes()
	},
	"/rlhub.v1.ModelStore/Push": func(m proto.Message) uint64 {
		r, _ := m.(*rlhubv1.StorePushRequest)
		return r.GetHeader().GetBlob().GetTotalBytes()
	},
}

// bodyDeadlineStream bounds the pushes of pushAnnounced as the data plane
// bounds a body: its first message within allowance, every message
// within allowance + announced/minRate (bulk.BodyDeadline) of the
// stream's start. Each of these handlers reads until its stream ends
// (io.EOF) or fails before it does anything with the body, so the body
// phase is over once a receive returns an error; the timer stops then.
//
// Past the deadline the interceptor returns DeadlineExceeded without
// waiting for the handler, which is blocked in RecvMsg: grpc-go then
// ends the stream, which cancels the stream's context, and the
// handler's RecvMsg fails (grpc-go's own way of waking a receive on
// another goroutine, e.g. in a bidirectional stream). Every receive of
// an expired stream returns the deadline error, so the handler fails
// and stores or applies nothing; it releases what it holds as it
// returns, on its own goroutine, moments after the answer.
func bodyDeadlineStream(allowance time.Duration, minRate int64, log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		announced, ok := pushAnnounced[info.FullMethod]
		if !ok {
			return handler(srv, ss)
		}
		bs := &boundedStream{ServerStream: ss, announced: announced, allowance: allowance, minRate: minRate,
			start: time.Now(), expired: make(chan struct{})}
		bs.mu.Lock()
		bs.arm(allowance)
		bs.mu.Unlock()
		done := make(chan error, 1)
		go func() { done <- handler(srv, bs) }()
		select {
		case err := <-done:
			bs.mu.Lock()
			bs.over = true
			bs.timer.Stop()
			bs.mu.Unlock()
			return err
		case <-bs.expired:
			log.Warn("hub: push stream cut: its body did not arrive within the body deadline", "method", info.FullMethod,
				"body_timeout", allowance, "body_min_rate", minRate)
			return grpcerr.ToStatus(bs.err())
		}
	}
}

// boundedStream is a push stream under its body deadline.
type boundedStream struct {
	grpc.ServerStream
	announced func(proto.Message) uint64
	allowance time.Duration
	minRate   int64
	start     time.Time
	expired   chan struct{} // closed when the deadline passed mid-body

	mu    sync.Mutex  // guards the fields below
	timer *time.Timer // fires expire(gen)
	gen   int         // the armed timer's generation: an older one's firing is stale
	first bool        // the first message (the header) was received
	over  bool        // the body phase ended (a receive failed, or the handler returned)
	cut   bool        // the deadline passed first
}

// arm (re)starts the timer to fire d after the stream's start; mu held.
func (s *boundedStream) arm(d time.Duration) {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.gen++
	gen := s.gen
	s.timer = time.AfterFunc(time.Until(s.start.Add(d)), func() { s.expire(gen) })
}

func (s *boundedStream) expire(gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen || s.over || s.cut {
		return
	}
	s.cut = true
	close(s.expired)
}

func (s *boundedStream) err() error {
	return fmt.Errorf("push stream: %w (%v plus 1 s per %d bytes announced: the hub's --body-timeout and --body-min-rate)",
		bulk.ErrBodyDeadline, s.allowance, s.minRate)
}

// RecvMsg receives as the stream does; once the deadline has passed it
// fails with the deadline's error whatever arrived.
func (s *boundedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cut:
		return s.err()
	case err != nil:
		s.over = true
		s.timer.Stop()
	case !s.first:
		s.first = true
		msg := chunkcodec.Received(m)
		if msg != nil {
			n := s.announced(msg)
			s.arm(bulk.BodyDeadline(s.allowance, s.minRate, int64(min(n, 1<<62))))
		}
	}
	return err
}
