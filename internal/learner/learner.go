// Package learner is the Go API for writing an rlhub learner: a process
// that attaches to the hub's aggregator, holds its lease with heartbeats and
// answers the tasks the coordinator sends through it.
//
// To write one:
//  1. Fill a Config: the hub address (or a connection), a unique learner id,
//     declared resources, and the OnStart, OnDemand and OnLearn callbacks.
//  2. Call Run(ctx). It attaches, serves tasks one at a time, and
//     re-attaches after any break (with backoff) until ctx is done.
//
// Callbacks run on Run's goroutine, one at a time; their ctx is canceled
// when the stream breaks. Example (example.go) is a complete learner.
package learner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/infoval"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Demand is what a learner wants per Learn.
type Demand struct {
	// BatchSize is the number of rows wanted.
	BatchSize int64
	// Fields are any other demand fields; every learner of a task must
	// report the same ones (structpb-convertible values).
	Fields map[string]any
}

// LearnTask is one share of a batch.
type LearnTask struct {
	TaskID string
	// RowStart and Rows place the share in the coordinator's batch.
	RowStart, Rows int64
	// Batch holds the share's rows of every batch tensor. It aliases a
	// buffer the callback owns until it returns (clone to keep it).
	Batch *tensor.StateDict
	// Metadata is the batch's safetensors metadata.
	Metadata map[string]string
}

// Config configures a learner.
type Config struct {
	// Hub is the hub address; ignored when Conn is set.
	Hub string
	// Dial is how to connect to Hub (TLS, token); the zero value is
	// plaintext.
	Dial dial.Config
	// Conn is an existing connection to the hub; nil means dial Hub.
	Conn grpc.ClientConnInterface
	// ID is the learner's unique id (required).
	ID string
	// Resources are declared to the aggregator as is.
	Resources map[string]string
	// OnStart prepares for a task; an error refuses it. nil accepts.
	OnStart func(ctx context.Context, taskID string, info map[string]any) error
	// OnDemand reports the learner's demand (required).
	OnDemand func(ctx context.Context, taskID string) (Demand, error)
	// OnLearn learns on one share and returns its info, which must be
	// infoval-convertible: integers stay integers (required).
	OnLearn func(ctx context.Context, t *LearnTask) (map[string]any, error)
	// OnAttach, when set, is called after each successful attach.
	OnAttach func()
	// Backoff is the pause before re-attaching; 0 means 200ms.
	Backoff time.Duration
	// WelcomeTimeout bounds one attach: reaching the hub, opening the
	// stream and receiving the hub's Welcome. A hub that accepts the
	// connection and never answers then ends the attempt with an error
	// that is logged, and the learner re-attaches after Backoff, instead
	// of waiting silently forever. 0 means 30s.
	WelcomeTimeout time.Duration
	// MaxShareBytes bounds one received share; 0 means 2 GiB.
	MaxShareBytes int64
	// MaxReplyBytes is the hub's message bound; 0 means 4 MiB, rlhub
	// serve's. A reply over it (an OnLearn info, say) fails its task, as a
	// callback error does, instead of being sent.
	MaxReplyBytes int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.ID == "" {
		return errors.New("learner: ID is required")
	}
	if c.Conn == nil && c.Hub == "" {
		return errors.New("learner: Hub or Conn is required")
	}
	if c.OnDemand == nil || c.OnLearn == nil {
		return errors.New("learner: OnDemand and OnLearn are required")
	}
	if c.Backoff == 0 {
		c.Backoff = 200 * time.Millisecond
	}
	if c.Backoff < 0 {
		return fmt.Errorf("learner: negative Backoff %v", c.Backoff)
	}
	if c.WelcomeTimeout == 0 {
		c.WelcomeTimeout = 30 * time.Second
	}
	if c.WelcomeTimeout < 0 {
		return fmt.Errorf("learner: negative WelcomeTimeout %v", c.WelcomeTimeout)
	}
	if c.MaxShareBytes == 0 {
		c.MaxShareBytes = 2 << 30
	}
	if c.MaxReplyBytes == 0 {
		c.MaxReplyBytes = 4 << 20
	}
	if c.MaxReplyBytes < 0 {
		return fmt.Errorf("learner: negative MaxReplyBytes %d", c.MaxReplyBytes)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Run attaches and serves until ctx is done, re-attaching after every
// break. It returns ctx's cause, or a configuration error at once.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	conn := cfg.Conn
	if conn == nil {
		// A restarted hub is back within a second or two: reconnect from
		// 50ms backing off to 1s (gRPC's defaults, 1s to 120s, would leave
		// the learner detached long after the hub is back).
		cc, err := cfg.Dial.GRPC(cfg.Hub, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)),
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second,
				Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}))
		if err != nil {
			return fmt.Errorf("learner: dial %s: %w", cfg.Hub, err)
		}
		defer cc.Close()
		conn = cc
	}
	rpc := rlhubv1.NewLearnerAggregatorClient(conn)
	for {
		err := session(ctx, conn, rpc, &cfg)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if grpcerr.Permanent(err) {
			return fmt.Errorf("learner %s: %w (not retried: re-attaching cannot fix it)", errs.Quote(cfg.ID), err)
		}
		cfg.Logger.Warn("learner: detached; re-attaching", "learner", cfg.ID, "err", err, "after", cfg.Backoff)
		t := time.NewTimer(cfg.Backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

type attachStream = grpc.BidiStreamingClient[rlhubv1.LearnerMessage, rlhubv1.AggregatorMessage]

// errHubProtocol is a message from the hub this learner does not expect or
// understand (a newer hub's, during a rolling upgrade, or a hub's bug). It
// is not a refusal: the learner re-attaches after its backoff, as for a
// broken stream, instead of giving up as it does on errs.Permanent.
var errHubProtocol = errors.New("the hub's message breaks the learner protocol")

// session is one Attach stream: hello, welcome, then tasks until it breaks.
func session(ctx context.Context, conn grpc.ClientConnInterface, rpc rlhubv1.LearnerAggregatorClient, cfg *Config) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The Welcome must come promptly, and the wait for a connection
	// (WaitForReady) counts: a hub that accepts connections but never
	// answers, or accepts the stream but sends nothing, would otherwise
	// hold us forever without a word in the log.
	stopWait := time.AfterFunc(cfg.WelcomeTimeout, func() {
		cancel(fmt.Errorf("%w: no welcome from the hub within %v (WelcomeTimeout)", errs.ErrUnavailable, cfg.WelcomeTimeout))
	})
	defer stopWait.Stop()
	stream, err := rpc.Attach(ctx, grpc.WaitForReady(true))
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	var sendMu sync.Mutex
	send := func(m *rlhubv1.LearnerMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Hello{Hello: &rlhubv1.Hello{LearnerId: cfg.ID, Resources: cfg.Resources}}}); err != nil {
		return err
	}
	m, err := stream.Recv()
	if !stopWait.Stop() {
		return context.Cause(ctx)
	}
	if err != nil {
		return grpcerr.FromStatus(err)
	}
	w := m.GetWelcome()
	if w == nil || w.LeaseMs == 0 {
		return fmt.Errorf("%w: first aggregator message is not a Welcome", errHubProtocol)
	}
	if cfg.OnAttach != nil {
		cfg.OnAttach()
	}
	cfg.Logger.Info("learner: attached", "learner", cfg.ID, "lease_ms", w.LeaseMs)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil) // runs before wg.Wait: stops the heartbeat
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(max(time.Duration(w.LeaseMs)*time.Millisecond/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Heartbeat{Heartbeat: &rlhubv1.Heartbeat{}}}); err != nil {
					cancel(fmt.Errorf("heartbeat: %w", err))
					return
				}
			}
		}
	}()

	if cc, ok := conn.(*grpc.ClientConn); ok {
		// A hub stopping gracefully sends GOAWAY and waits for open
		// streams; leaving at once lets it stop without waiting out its
		// timeout. We re-attach when it (or its successor) is back. The
		// Welcome came over this connection, so it was READY: IDLE,
		// TRANSIENT_FAILURE or SHUTDOWN, even as the first state seen (the
		// GOAWAY may come before this goroutine runs), means it left.
		// CONNECTING before READY was seen does not: grpc-go hands the
		// READY picker to waiting RPCs before the channel reports READY,
		// so a whole Hello/Welcome can beat the channel's own state.
		wg.Add(1)
		go func() {
			defer wg.Done()
			seenReady := false
			for st := cc.GetState(); ; st = cc.GetState() {
				if leftHub(st, seenReady) {
					cancel(fmt.Errorf("connection to the hub left READY (%v): the hub is draining or gone", st))
					return
				}
				seenReady = seenReady || st == connectivity.Ready
				if !cc.WaitForStateChange(ctx, st) {
					return
				}
			}
		}()
	}

	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return grpcerr.FromStatus(err)
		}
		var reply *rlhubv1.LearnerReply
		switch b := m.Body.(type) {
		case *rlhubv1.AggregatorMessage_Start:
			reply = &rlhubv1.LearnerReply{RequestId: b.Start.RequestId}
			if cfg.OnStart != nil {
				if err := cfg.OnStart(ctx, b.Start.TaskId, b.Start.TaskInfo.AsMap()); err != nil {
					reply.Error = err.Error()
				}
			}
		case *rlhubv1.AggregatorMessage_Demand:
			reply = &rlhubv1.LearnerReply{RequestId: b.Demand.RequestId}
			d, err := cfg.OnDemand(ctx, b.Demand.TaskId)
			if err == nil {
				var fields *structpb.Struct
				if fields, err = structpb.NewStruct(d.Fields); err == nil {
					reply.Demand = &rlhubv1.Demand{BatchSize: d.BatchSize, Fields: fields}
				}
			}
			if err != nil {
				reply.Error = err.Error()
			}
		case *rlhubv1.AggregatorMessage_Learn:
			reply, err = learn(ctx, stream, cfg, b.Learn)
			if err != nil {
				return err // the stream is out of step; re-attach
			}
		default:
			return fmt.Errorf("%w: unexpected aggregator message %T", errHubProtocol, m.Body)
		}
		if err := send(bounded(reply, cfg.MaxReplyBytes)); err != nil {
			return err
		}
	}
}

// bounded wraps a reply, or an error in its place if it is over maxBytes:
// the hub refuses a message over its bound by ending the stream, which
// would fail the task as a lost learner and detach it; this fails that
// task only, as a callback error does.
func bounded(reply *rlhubv1.LearnerReply, maxBytes int) *rlhubv1.LearnerMessage {
	m := &rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Reply{Reply: reply}}
	if n := proto.Size(m); n > maxBytes {
		m.Body = &rlhubv1.LearnerMessage_Reply{Reply: &rlhubv1.LearnerReply{RequestId: reply.RequestId,
			Error: fmt.Sprintf("reply of %d bytes exceeds the hub's message bound of %d bytes", n, maxBytes)}}
	}
	return m
}

// leftHub reports whether a channel state seen after the Welcome means the
// session's connection is gone (see session's state watcher).
func leftHub(st connectivity.State, seenReady bool) bool {
	return st != connectivity.Ready && (seenReady || st != connectivity.Connecting)
}

// learn receives a share's chunks and runs OnLearn. A protocol error is
// returned as err; a callback error goes into the reply.
func learn(ctx context.Context, stream attachStream, cfg *Config, lt *rlhubv1.LearnTask) (*rlhubv1.LearnerReply, error) {
	if lt.Blob == nil {
		return nil, fmt.Errorf("%w: learn task without a blob", errHubProtocol)
	}
	if lt.Blob.TotalBytes > uint64(cfg.MaxShareBytes) {
		return skipShare(stream, cfg, lt)
	}
	// A malformed share is the hub's fault, not a refusal of this learner:
	// its ErrInvalid must not make Run give up (%v, not %w).
	asm, err := wire.NewAssembler(lt.Blob.TotalBytes, wire.Limits{MaxBytes: cfg.MaxShareBytes})
	if err != nil {
		return nil, fmt.Errorf("%w: share: %v", errHubProtocol, err)
	}
	for asm.Received() < int(lt.Blob.TotalBytes) {
		m, err := stream.Recv()
		if err != nil {
			return nil, grpcerr.FromStatus(err)
		}
		ch := m.GetChunk()
		if ch == nil {
			return nil, fmt.Errorf("%w: expected a chunk, got %T", errHubProtocol, m.Body)
		}
		if err := asm.Write(ch.Data); err != nil {
			return nil, fmt.Errorf("%w: share: %v", errHubProtocol, err)
		}
	}
	f, _, err := asm.Finish()
	if err != nil {
		return nil, fmt.Errorf("%w: share: %v", errHubProtocol, err)
	}
	reply := &rlhubv1.LearnerReply{RequestId: lt.RequestId}
	info, err := cfg.OnLearn(ctx, &LearnTask{TaskID: lt.TaskId, RowStart: lt.RowStart, Rows: lt.Rows, Batch: f.Tensors, Metadata: f.Metadata})
	if err == nil {
		reply.Info, err = infoval.Map(info)
	}
	if err != nil {
		reply.Error = err.Error()
	}
	return reply, nil
}

// skipShare fails a share over MaxShareBytes as a callback error does: its
// chunks are read past, not kept, so the stream stays in step and the
// learner attached.
func skipShare(stream attachStream, cfg *Config, lt *rlhubv1.LearnTask) (*rlhubv1.LearnerReply, error) {
	total := lt.Blob.TotalBytes
	for got := uint64(0); got < total; {
		m, err := stream.Recv()
		if err != nil {
			return nil, grpcerr.FromStatus(err)
		}
		ch := m.GetChunk()
		if ch == nil {
			return nil, fmt.Errorf("%w: expected a chunk, got %T", errHubProtocol, m.Body)
		}
		if got += uint64(len(ch.Data)); got > total {
			return nil, fmt.Errorf("%w: share: chunks overrun the announced %d bytes", errHubProtocol, total)
		}
	}
	return &rlhubv1.LearnerReply{RequestId: lt.RequestId,
		Error: fmt.Sprintf("share of %d bytes exceeds this learner's MaxShareBytes of %d", total, cfg.MaxShareBytes)}, nil
}
