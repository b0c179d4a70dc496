package aggregator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Config configures a Service.
type Config struct {
	// Lease is how long a learner stays attached without sending anything
	// (learners heartbeat at a third of it); 0 means 10s.
	Lease time.Duration
	// CheckEvery is how often leases are checked; 0 means Lease/4.
	CheckEvery time.Duration
	// TaskTimeout bounds every wait for one learner's reply (start, demand,
	// one share of a learn); the caller's deadline bounds it too. 0 means
	// 60s.
	TaskTimeout time.Duration
	// OnFailure is the failure policy; the zero value is PolicyResplit.
	OnFailure FailurePolicy
	// MergeRule is the hub's info merge rule; the zero value is
	// RuleDIEngine. A task's StartRequest.merge may override it.
	MergeRule MergeRule
	// HomogeneousKeys are the info keys every learner reports identically;
	// nil means DefaultHomogeneousKeys, an empty non-nil slice means none.
	// A task's StartRequest.merge may replace them.
	HomogeneousKeys []string
	// ChunkBytes is the largest chunk sent to a learner; 0 means
	// wire.DefaultChunkBytes.
	ChunkBytes int
	// MaxBatchBytes bounds a Learn batch; 0 means 2 GiB.
	MaxBatchBytes int64
	// MaxBatchBytesInFlight bounds the Learn batches being received or
	// learned together (each holds a buffer of its announced size from
	// its header on); 0 means 4 GiB. A batch waits up to batchRoomWait
	// for room, then fails ResourceExhausted.
	MaxBatchBytesInFlight int64
	// MaxResponseBytes bounds a Learn's response (the merged info), as the
	// server's message bound does; 0 means 4 MiB.
	MaxResponseBytes int
	// Now is the clock for leases; nil means time.Now.
	Now func() time.Time
	// Logger receives membership and task events; nil means slog.Default().
	Logger *slog.Logger
	// DataDir, when set, keeps the current task across restarts and
	// failovers (persist.go); "" keeps it in memory only.
	DataDir string
	// StateChanged, when set, is told each file under DataDir once
	// written (a clustered hub replicates it).
	StateChanged func(path string)
	// WriteState, when set, runs each save of the task (a clustered hub's
	// store.StateWriter: refused on a deposed primary, acknowledged by
	// the standbys before Start or GetDataDemand answers); nil runs it.
	WriteState func(ctx context.Context, fn func() error) error
}

func (c *Config) validate() error {
	if c.Lease == 0 {
		c.Lease = 10 * time.Second
	}
	if c.Lease < 10*time.Millisecond {
		return fmt.Errorf("aggregator: Lease %v is below 10ms", c.Lease)
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = c.Lease / 4
	}
	if c.CheckEvery < time.Millisecond {
		return fmt.Errorf("aggregator: CheckEvery %v is below 1ms", c.CheckEvery)
	}
	if c.TaskTimeout == 0 {
		c.TaskTimeout = 60 * time.Second
	}
	if c.TaskTimeout < 0 {
		return fmt.Errorf("aggregator: negative TaskTimeout %v", c.TaskTimeout)
	}
	if c.OnFailure != PolicyResplit && c.OnFailure != PolicyFail {
		return fmt.Errorf("aggregator: unknown failure policy %d", c.OnFailure)
	}
	if c.MergeRule != RuleDIEngine && c.MergeRule != RuleStrict {
		return fmt.Errorf("aggregator: unknown merge rule %d", c.MergeRule)
	}
	if c.HomogeneousKeys == nil {
		c.HomogeneousKeys = DefaultHomogeneousKeys
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = wire.DefaultChunkBytes
	}
	if c.ChunkBytes < 1024 || c.ChunkBytes > 3<<20 {
		return fmt.Errorf("aggregator: ChunkBytes %d outside [1 KiB, 3 MiB]", c.ChunkBytes)
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 2 << 30
	}
	if c.MaxBatchBytes < 0 {
		return fmt.Errorf("aggregator: negative MaxBatchBytes %d", c.MaxBatchBytes)
	}
	if c.MaxBatchBytesInFlight == 0 {
		c.MaxBatchBytesInFlight = 4 << 30
	}
	if c.MaxBatchBytesInFlight < 0 {
		return fmt.Errorf("aggregator: negative MaxBatchBytesInFlight %d", c.MaxBatchBytesInFlight)
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 4 << 20
	}
	if c.MaxResponseBytes < 0 {
		return fmt.Errorf("aggregator: negative MaxResponseBytes %d", c.MaxResponseBytes)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Service is the aggregator's gRPC service. Create it with New, register it
// on a gRPC server, and Close it after the server has stopped.
type Service struct {
	rlhubv1.UnimplementedLearnerAggregatorServer

	cfg   Config
	merge Merge         // the hub's rule and homogeneous keys
	ops   chan struct{} // one coordinator operation at a time (semaphore)
	// batches holds the bytes of the Learn batches in progress
	// (Config.MaxBatchBytesInFlight).
	batches *wire.Budget
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
	// ctx is canceled by Close; background calls (catch-up starts) use it.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex // guards the fields below and learnerConn's guarded fields
	conns    map[*learnerConn]struct{}
	learners map[string]*learnerConn // attached (said Hello), by id
	seq      uint64                  // attach order
	nextReq  uint64
	task     *taskState // nil before the first Start
	taskSeq  uint64
	stats    stats
	closed   bool
	draining bool // set by Drain: no new Attach streams
}

type stats struct {
	attached, removed, learnOK, learnFailed, resplits uint64
}

// taskState is the current task, replaced by each successful Start.
type taskState struct {
	seq  uint64 // Start order
	id   string
	info *structpb.Struct
	// opts are the merge options the task was started with (nil: the
	// hub's); merge is the hub's merge with them applied.
	opts  *rlhubv1.MergeOptions
	merge Merge
	// order and sizes are recorded by GetDataDemand; nil before it.
	order []string
	sizes []int64
}

// learnerConn is one Attach stream.
type learnerConn struct {
	stream grpc.BidiStreamingServer[rlhubv1.LearnerMessage, rlhubv1.AggregatorMessage]
	sendMu sync.Mutex // serializes Send; held across a LearnTask and its chunks
	gone   chan struct{}

	// guarded by Service.mu
	id         string // "" until Hello
	seq        uint64
	resources  map[string]string
	leaseUntil time.Time
	started    string // task id this learner accepted
	startedSeq uint64 // its taskState.seq
	catching   bool   // a catchUp goroutine is running for it
	pending    map[uint64]chan *rlhubv1.LearnerReply
	goneErr    error
	isGone     bool
	done       uint64
	failed     uint64
}

// New builds a Service and starts its lease reaper.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Service{
		cfg:      cfg,
		ops:      make(chan struct{}, 1),
		batches:  wire.NewBudget(cfg.MaxBatchBytesInFlight, batchRoomWait),
		done:     make(chan struct{}),
		conns:    make(map[*learnerConn]struct{}),
		learners: make(map[string]*learnerConn),
	}
	s.merge = NewMerge(cfg.MergeRule, cfg.HomogeneousKeys)
	t, err := s.loadTask()
	if err != nil {
		return nil, err
	}
	if t != nil {
		s.task, s.taskSeq = t, t.seq
		cfg.Logger.Info("aggregator: task restored; learners are started on it as they attach", "task", t.id)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.reap() }()
	return s, nil
}

// Register attaches the service to a gRPC server.
func (s *Service) Register(g *grpc.Server) { rlhubv1.RegisterLearnerAggregatorServer(g, s) }

// Close stops the reaper, detaches every learner and waits for everything
// the service started. Safe to call more than once.
func (s *Service) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
		s.cancel()
	}
	conns := make([]*learnerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		s.remove(c, fmt.Errorf("%w: aggregator closing", errs.ErrUnavailable))
	}
	s.wg.Wait()
	return nil
}

// Drain ends every Attach stream with Unavailable and refuses new ones, so
// a graceful server stop does not wait for learners (the hub calls it
// before its graceful stop; learners re-attach to whichever hub serves
// next). Coordinator calls in flight fail naming their learners. Close must
// still be called.
func (s *Service) Drain() {
	s.mu.Lock()
	s.draining = true
	conns := make([]*learnerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		s.remove(c, fmt.Errorf("%w: hub stopping", errs.ErrUnavailable))
	}
}

// reap removes learners whose lease expired. It runs until Close.
func (s *Service) reap() {
	t := time.NewTicker(s.cfg.CheckEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		now := s.cfg.Now()
		var expired []*learnerConn
		s.mu.Lock()
		for c := range s.conns {
			if now.After(c.leaseUntil) {
				expired = append(expired, c)
			}
		}
		s.mu.Unlock()
		for _, c := range expired {
			s.remove(c, fmt.Errorf("%w: learner %q lease of %v expired", errs.ErrUnavailable, c.name(s), s.cfg.Lease))
		}
	}
}

func (c *learnerConn) name(s *Service) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.id == "" {
		return "(before hello)"
	}
	return c.id
}

// remove detaches c (idempotent): its Attach handler returns, its pending
// calls fail with err.
func (s *Service) remove(c *learnerConn, err error) {
	s.mu.Lock()
	if c.isGone {
		s.mu.Unlock()
		return
	}
	c.isGone = true
	c.goneErr = err
	delete(s.conns, c)
	id := c.id
	if c.seq != 0 { // it was attached (register): a replaced stream counts too
		s.stats.removed++
	}
	if id != "" && s.learners[id] == c {
		delete(s.learners, id)
	}
	close(c.gone)
	s.mu.Unlock()
	if id != "" {
		s.cfg.Logger.Warn("aggregator: learner removed", "learner", id, "reason", err)
	}
}

// Attach serves one learner stream until it breaks, its lease expires, the
// learner is removed or the service closes.
func (s *Service) Attach(stream grpc.BidiStreamingServer[rlhubv1.LearnerMessage, rlhubv1.AggregatorMessage]) error {
	c := &learnerConn{
		stream:  stream,
		gone:    make(chan struct{}),
		pending: make(map[uint64]chan *rlhubv1.LearnerReply),
	}
	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		return grpcerr.ToStatus(fmt.Errorf("%w: aggregator closing", errs.ErrUnavailable))
	}
	c.leaseUntil = s.cfg.Now().Add(s.cfg.Lease) // the Hello must come within a lease
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	// The receive loop ends when the handler returns (gRPC then cancels the
	// stream), so it is tracked by the service, not waited for here.
	go func() { defer s.wg.Done(); s.recvLoop(c) }()
	select {
	case <-c.gone:
	case <-stream.Context().Done():
		s.remove(c, fmt.Errorf("%w: learner %q: stream ended: %v", errs.ErrUnavailable, c.name(s), context.Cause(stream.Context())))
	}
	s.mu.Lock()
	err := c.goneErr
	s.mu.Unlock()
	return grpcerr.ToStatus(err)
}

func (s *Service) recvLoop(c *learnerConn) {
	for {
		m, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("learner closed the stream")
			}
			s.remove(c, fmt.Errorf("%w: learner %q: %v", errs.ErrUnavailable, c.name(s), err))
			return
		}
		s.mu.Lock()
		c.leaseUntil = s.cfg.Now().Add(s.cfg.Lease)
		hello := c.id != ""
		s.mu.Unlock()
		switch b := m.Body.(type) {
		case *rlhubv1.LearnerMessage_Hello:
			if hello {
				s.remove(c, fmt.Errorf("%w: learner %q sent a second Hello", errs.ErrInvalid, c.name(s)))
				return
			}
			if err := s.register(c, b.Hello); err != nil {
				s.remove(c, err)
				return
			}
		case *rlhubv1.LearnerMessage_Heartbeat:
			if !hello {
				s.remove(c, fmt.Errorf("%w: learner sent a heartbeat before Hello", errs.ErrInvalid))
				return
			}
		case *rlhubv1.LearnerMessage_Reply:
			if !hello {
				s.remove(c, fmt.Errorf("%w: learner sent a reply before Hello", errs.ErrInvalid))
				return
			}
			s.mu.Lock()
			ch := c.pending[b.Reply.RequestId]
			delete(c.pending, b.Reply.RequestId)
			s.mu.Unlock()
			if ch != nil {
				ch <- b.Reply // buffered, one reply per request
			}
			// else: a late reply to a call that gave up; dropped.
		default:
			s.remove(c, fmt.Errorf("%w: learner %q sent an empty message", errs.ErrInvalid, c.name(s)))
			return
		}
	}
}

func validID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("%w: learner id %s must be 1..128 characters", errs.ErrInvalid, errs.Quote(id))
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: learner id %s has a space or unprintable character", errs.ErrInvalid, errs.Quote(id))
		}
	}
	return nil
}

// Bounds on a Hello's declared resources: they are kept while the learner
// is attached, logged when it attaches and listed by Resources, so a
// learner must not make any of those hold megabytes.
const (
	MaxResources          = 32
	MaxResourceKeyBytes   = 128
	MaxResourceValueBytes = 1024
)

func validResources(res map[string]string) error {
	if len(res) > MaxResources {
		return fmt.Errorf("%w: %d resources declared, at most %d", errs.ErrInvalid, len(res), MaxResources)
	}
	for k, v := range res {
		if k == "" || len(k) > MaxResourceKeyBytes || len(v) > MaxResourceValueBytes {
			return fmt.Errorf("%w: resource %s = %s: keys must be 1..%d bytes, values at most %d",
				errs.ErrInvalid, errs.Quote(k), errs.Quote(v), MaxResourceKeyBytes, MaxResourceValueBytes)
		}
	}
	return nil
}

// register records a Hello: it sends Welcome first (so no task can reach
// the learner before it), then makes the learner visible, replacing an
// older stream with the same id, and starts the current task on it.
func (s *Service) register(c *learnerConn, h *rlhubv1.Hello) error {
	if err := validID(h.LearnerId); err != nil {
		return err
	}
	if err := validResources(h.Resources); err != nil {
		return fmt.Errorf("learner %q: %w", h.LearnerId, err)
	}
	s.mu.Lock()
	c.id = h.LearnerId
	c.resources = h.Resources
	s.mu.Unlock()
	c.sendMu.Lock()
	err := c.stream.Send(&rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Welcome{Welcome: &rlhubv1.Welcome{LeaseMs: uint64(s.cfg.Lease.Milliseconds())}}})
	c.sendMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: learner %q: send welcome: %v", errs.ErrUnavailable, c.id, err)
	}
	s.mu.Lock()
	if c.isGone || s.closed || s.draining {
		s.mu.Unlock()
		return fmt.Errorf("%w: aggregator closing", errs.ErrUnavailable)
	}
	old := s.learners[c.id]
	s.seq++
	c.seq = s.seq
	s.learners[c.id] = c
	s.stats.attached++
	if s.task != nil {
		s.catchUpLocked(c)
	}
	s.mu.Unlock()
	if old != nil {
		s.remove(old, fmt.Errorf("%w: learner %q re-attached on a new stream", errs.ErrUnavailable, c.id))
	}
	s.cfg.Logger.Info("aggregator: learner attached", "learner", c.id, "resources", h.Resources)
	return nil
}

// catchUpLocked runs catchUp for c unless it already runs; s.mu is held.
// It does not block the receive loop (the reply arrives through it).
func (s *Service) catchUpLocked(c *learnerConn) {
	if c.catching || c.isGone {
		return
	}
	c.catching = true
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.catchUp(c) }()
}

// catchUp starts the current task on a learner that attached after Start,
// again if a newer task was started meanwhile without it.
func (s *Service) catchUp(c *learnerConn) {
	for {
		s.mu.Lock()
		t := s.task
		done := c.isGone || t == nil || c.startedSeq >= t.seq
		if done {
			c.catching = false
		}
		s.mu.Unlock()
		if done {
			return
		}
		if err := s.startOne(s.ctx, c, t); err != nil {
			s.cfg.Logger.Warn("aggregator: late learner did not start the current task", "learner", c.id, "task", t.id, "err", err)
			s.mu.Lock()
			c.catching = false
			s.mu.Unlock()
			return
		}
	}
}

// call sends a task to c and waits for its reply, bounded by TaskTimeout
// and ctx. send writes the task with the given request id while holding
// c.sendMu. A send interrupted by the deadline, or a reply that does not
// come within TaskTimeout, detaches c: its stream is no longer usable.
func (s *Service) call(ctx context.Context, c *learnerConn, send func(reqID uint64) error) (*rlhubv1.LearnerReply, error) {
	if err := ctx.Err(); err != nil { // nothing sent yet: the learner is not at fault
		return nil, fmt.Errorf("learner %q: %w", c.id, context.Cause(ctx))
	}
	ch := make(chan *rlhubv1.LearnerReply, 1)
	s.mu.Lock()
	if c.isGone {
		err := c.goneErr
		s.mu.Unlock()
		return nil, err
	}
	s.nextReq++
	reqID := s.nextReq
	c.pending[reqID] = ch
	id := c.id
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(c.pending, reqID)
		s.mu.Unlock()
	}()

	tctx, cancel := context.WithTimeoutCause(ctx, s.cfg.TaskTimeout,
		fmt.Errorf("%w: learner %q did not answer within the task timeout %v", errs.ErrUnavailable, id, s.cfg.TaskTimeout))
	defer cancel()
	stop := context.AfterFunc(tctx, func() {
		s.remove(c, fmt.Errorf("%w: learner %q: sending its task was interrupted: %v", errs.ErrUnavailable, id, context.Cause(tctx)))
	})
	c.sendMu.Lock()
	err := send(reqID)
	c.sendMu.Unlock()
	if !stop() {
		return nil, s.goneErr(c)
	}
	if err != nil {
		s.remove(c, fmt.Errorf("%w: learner %q: send: %v", errs.ErrUnavailable, id, err))
		return nil, s.goneErr(c)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-c.gone:
		return nil, s.goneErr(c)
	case <-tctx.Done():
		if ctx.Err() == nil { // our TaskTimeout, not the caller's deadline
			s.remove(c, context.Cause(tctx))
			return nil, s.goneErr(c)
		}
		return nil, fmt.Errorf("learner %q: %w", id, context.Cause(ctx))
	}
}

func (s *Service) goneErr(c *learnerConn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.goneErr
}

func (s *Service) send(c *learnerConn, m *rlhubv1.AggregatorMessage) error { return c.stream.Send(m) }

// acquire takes the coordinator-operation semaphore, bounded by ctx.
func (s *Service) acquire(ctx context.Context) (func(), error) {
	select {
	case s.ops <- struct{}{}:
		return func() { <-s.ops }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another coordinator operation: %w", context.Cause(ctx))
	case <-s.done:
		return nil, fmt.Errorf("%w: aggregator closing", errs.ErrUnavailable)
	}
}

// attached returns the attached learners in attach order; with t set,
// only those started on it.
func (s *Service) attached(t *taskState) []*learnerConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*learnerConn, 0, len(s.learners))
	for _, c := range s.learners {
		if t == nil || c.startedSeq == t.seq {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *learnerConn) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

func (s *Service) startOne(ctx context.Context, c *learnerConn, t *taskState) error {
	r, err := s.call(ctx, c, func(reqID uint64) error {
		return s.send(c, &rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Start{Start: &rlhubv1.StartTask{RequestId: reqID, TaskId: t.id, TaskInfo: t.info}}})
	})
	if err != nil {
		return err
	}
	if r.Error != "" {
		return fmt.Errorf("%w: learner %q refused task %q: %s", errs.ErrAborted, c.id, t.id, learnerError(r.Error))
	}
	s.mu.Lock()
	if t.seq >= c.startedSeq { // a slow catch-up must not undo a newer Start
		c.started, c.startedSeq = t.id, t.seq
	}
	s.mu.Unlock()
	return nil
}

// MaxLearnerErrorBytes is how much of a learner's reported error (up to
// a gRPC message, 4 MiB) goes into the coordinator's error and the log.
const MaxLearnerErrorBytes = 1024

// learnerError is a learner's reported error, quoted and bounded.
func learnerError(s string) string { return errs.QuoteMax(s, MaxLearnerErrorBytes) }

// fanOut runs f for every learner concurrently and returns the errors by
// index. Every f is bounded by call's deadlines, so fanOut is too.
func fanOut[T any](items []T, f func(int, T) error) []error {
	out := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = f(i, it) }()
	}
	wg.Wait()
	return out
}

// Start starts a task on every attached learner.
func (s *Service) Start(ctx context.Context, req *rlhubv1.StartRequest) (*rlhubv1.StartResponse, error) {
	resp, err := s.start(ctx, req.TaskId, req.TaskInfo, req.Merge)
	return resp, grpcerr.ToStatus(err)
}

// MaxTaskIDBytes bounds a task id: it is logged, sent to every learner,
// shown per learner on the dashboard and saved with the task.
const MaxTaskIDBytes = 128

func validTaskID(id string) error { return errs.CheckName("task id", id, MaxTaskIDBytes) }

func (s *Service) start(ctx context.Context, taskID string, info *structpb.Struct, mo *rlhubv1.MergeOptions) (*rlhubv1.StartResponse, error) {
	if err := validTaskID(taskID); err != nil {
		return nil, err
	}
	merge, err := s.merge.With(mo)
	if err != nil {
		return nil, err
	}
	// NaN and ±Inf are refused before any learner sees them: they cannot
	// be saved (JSON has no such numbers) nor sent to a Python learner.
	if _, err := protojson.Marshal(orEmpty(info)); err != nil {
		return nil, fmt.Errorf("%w: task %s info: %v", errs.ErrInvalid, errs.Quote(taskID), err)
	}
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	s.mu.Lock()
	s.taskSeq++
	if taskID == "" {
		taskID = "task-" + strconv.FormatUint(s.taskSeq, 10)
	}
	t := &taskState{seq: s.taskSeq, id: taskID, info: orEmpty(info), opts: mo, merge: merge}
	s.mu.Unlock()
	conns := s.attached(nil)
	if len(conns) == 0 {
		return nil, fmt.Errorf("%w: no learners attached to start task %q", errs.ErrUnavailable, taskID)
	}
	errsOut := fanOut(conns, func(_ int, c *learnerConn) error { return s.startOne(ctx, c, t) })
	err = errors.Join(errsOut...)
	if err == nil {
		// Saved before it is current and answered: a task the coordinator
		// was told of outlives this hub.
		err = s.saveTask(ctx, t)
	}
	if err != nil {
		s.rollbackStart(conns, t)
		return nil, fmt.Errorf("start task %q: %w", taskID, err)
	}
	s.mu.Lock()
	s.task = t
	// Learners that attached while the task was starting (after conns was
	// taken) are started on it too.
	for _, c := range s.learners {
		if c.startedSeq < t.seq {
			s.catchUpLocked(c)
		}
	}
	s.mu.Unlock()
	resp := &rlhubv1.StartResponse{TaskId: taskID}
	for _, c := range conns {
		resp.Learners = append(resp.Learners, c.id)
	}
	s.cfg.Logger.Info("aggregator: task started", "task", taskID, "learners", resp.Learners)
	return resp, nil
}

// rollbackStart undoes a failed Start: the learners that took t (their
// OnStart ran with t's info) are started on the current task again, so a
// Start that fails changes nothing. One that does not take it back stays
// out of the current task's demand and batches, and says so in the log.
func (s *Service) rollbackStart(conns []*learnerConn, t *taskState) {
	s.mu.Lock()
	cur := s.task
	var back []*learnerConn
	for _, c := range conns {
		if c.startedSeq == t.seq {
			c.started, c.startedSeq = "", 0
			back = append(back, c)
		}
	}
	s.mu.Unlock()
	if cur == nil {
		return
	}
	for i, err := range fanOut(back, func(_ int, c *learnerConn) error { return s.startOne(s.ctx, c, cur) }) {
		if err != nil {
			s.cfg.Logger.Warn("aggregator: learner not put back on the current task after a failed Start",
				"learner", back[i].id, "task", cur.id, "err", err)
		}
	}
}

func (s *Service) currentTask(taskID string) (*taskState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task == nil {
		// Not a stale version: there is no task at all (NotFound, the
		// Python client's NotFound), which Start makes.
		return nil, fmt.Errorf("%w: no task started (call Start first)", errs.ErrNotFound)
	}
	if taskID != "" && taskID != s.task.id {
		return nil, fmt.Errorf("%w: task %s is not the current task %q", errs.ErrStale, errs.Quote(taskID), s.task.id)
	}
	return s.task, nil
}

// GetDataDemand asks every started learner for its demand.
func (s *Service) GetDataDemand(ctx context.Context, req *rlhubv1.DemandRequest) (*rlhubv1.DemandResponse, error) {
	resp, err := s.demand(ctx, req.TaskId)
	return resp, grpcerr.ToStatus(err)
}

func (s *Service) demand(ctx context.Context, taskID string) (*rlhubv1.DemandResponse, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	t, err := s.currentTask(taskID)
	if err != nil {
		return nil, err
	}
	conns := s.attached(t)
	if len(conns) == 0 {
		return nil, fmt.Errorf("%w: no learners attached and started for task %q", errs.ErrUnavailable, t.id)
	}
	demands := make([]*rlhubv1.Demand, len(conns))
	errsOut := fanOut(conns, func(i int, c *learnerConn) error {
		r, err := s.call(ctx, c, func(reqID uint64) error {
			return s.send(c, &rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Demand{Demand: &rlhubv1.DemandTask{RequestId: reqID, TaskId: t.id}}})
		})
		if err != nil {
			return err
		}
		if r.Error != "" {
			return fmt.Errorf("%w: learner %q failed its demand: %s", errs.ErrAborted, c.id, learnerError(r.Error))
		}
		if r.Demand == nil {
			return fmt.Errorf("%w: learner %q replied without a demand", errs.ErrInvalid, c.id)
		}
		demands[i] = r.Demand
		return nil
	})
	var ids []string
	var ds []*rlhubv1.Demand
	var failed []error
	for i, c := range conns {
		if errsOut[i] != nil {
			failed = append(failed, errsOut[i])
			continue
		}
		ids = append(ids, c.id)
		ds = append(ds, demands[i])
	}
	if len(failed) > 0 && (s.cfg.OnFailure == PolicyFail || len(ids) == 0) {
		return nil, fmt.Errorf("demand for task %q: %w", t.id, errors.Join(failed...))
	}
	for _, e := range failed {
		s.cfg.Logger.Warn("aggregator: learner excluded from demand", "task", t.id, "err", e)
	}
	merged, err := MergeDemand(ids, ds)
	if err != nil {
		return nil, err
	}
	resp := &rlhubv1.DemandResponse{Demand: merged, Learners: ids}
	for _, d := range ds {
		resp.BatchSizes = append(resp.BatchSizes, d.BatchSize)
	}
	// The recorded demand is saved before it is kept: a demand whose save
	// failed changes nothing. (Coordinator operations run one at a time,
	// so t is still the current task.)
	rec := *t
	rec.order, rec.sizes = ids, resp.BatchSizes
	if err := s.saveTask(ctx, &rec); err != nil {
		return nil, fmt.Errorf("demand for task %q: %w", t.id, err)
	}
	s.mu.Lock()
	if s.task == t {
		t.order, t.sizes = ids, resp.BatchSizes
	}
	s.mu.Unlock()
	return resp, nil
}

// Resources lists the attached learners.
func (s *Service) Resources(ctx context.Context, _ *rlhubv1.ResourcesRequest) (*rlhubv1.ResourcesResponse, error) {
	ls := StatsToProto(s.Stats()).Learners
	return &rlhubv1.ResourcesResponse{Learners: ls, WorldSize: int64(len(ls))}, nil
}

// Status reports learners, leases and counters (Stats).
func (s *Service) Status(ctx context.Context, _ *rlhubv1.StatusRequest) (*rlhubv1.StatusResponse, error) {
	return StatsToProto(s.Stats()), nil
}

// ---- Learn ----

// batchRoomWait is how long a Learn batch waits for room among the bytes
// of the batches in progress (Config.MaxBatchBytesInFlight).
const batchRoomWait = 30 * time.Second

// Learn receives a batch, splits it, fans it out and merges the infos. Its
// body is bounded in time like a push's (bodylimit.Rules).
func (s *Service) Learn(stream grpc.ClientStreamingServer[rlhubv1.LearnRequest, rlhubv1.LearnResponse]) error {
	// With the chunk codec (the Go client asks for it) a chunk stays in
	// gRPC's buffers until copied once into the assembler.
	recv := chunkcodec.Receiver[*rlhubv1.LearnRequest](stream.RecvMsg, chunkcodec.Requested(stream.Context()))
	var m chunkcodec.Msg[*rlhubv1.LearnRequest]
	defer m.Release()
	if err := recv(&m); err != nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: learn: no header: %v", errs.ErrInvalid, err))
	}
	h := m.Msg.GetHeader()
	if h == nil || h.Blob == nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: learn: the first message must be a LearnHeader with a blob", errs.ErrInvalid))
	}
	// A batch for no task or another task is refused before it is
	// received or given room (learnBatch checks again once it is in).
	if _, err := s.currentTask(h.TaskId); err != nil {
		return grpcerr.ToStatus(err)
	}
	if h.Blob.TotalBytes <= uint64(s.cfg.MaxBatchBytes) { // a larger one fails in NewAssembler, holding nothing
		release, err := s.batches.Take(stream.Context(), h.Blob.TotalBytes, "batches")
		if err != nil {
			if stream.Context().Err() != nil {
				return grpcerr.ToStatus(err)
			}
			return grpcerr.ToStatus(fmt.Errorf("learn: %w", err))
		}
		defer release()
	}
	asm, err := wire.NewAssembler(h.Blob.TotalBytes, wire.Limits{MaxBytes: s.cfg.MaxBatchBytes})
	if err != nil {
		return grpcerr.ToStatus(fmt.Errorf("learn: %w", err))
	}
	// Read to the client's end of stream, not only to the announced size:
	// the body's deadline (bodylimit: a batch is a push) holds until then,
	// and must not run on through the learning that follows.
	for {
		err := recv(&m)
		if err == io.EOF && asm.Received() == int(h.Blob.TotalBytes) {
			break
		}
		if err != nil {
			return grpcerr.ToStatus(fmt.Errorf("%w: learn: batch stream ended after %d of %d bytes: %v", errs.ErrInvalid, asm.Received(), h.Blob.TotalBytes, err))
		}
		if !m.Held() {
			return grpcerr.ToStatus(fmt.Errorf("%w: learn: expected a chunk after the header", errs.ErrInvalid))
		}
		if err := m.WriteChunk(asm.Write); err != nil {
			return grpcerr.ToStatus(fmt.Errorf("learn: %w", err))
		}
	}
	f, _, err := asm.Finish()
	if err != nil {
		return grpcerr.ToStatus(fmt.Errorf("learn: %w", err))
	}
	resp, err := s.LearnBatch(stream.Context(), h.TaskId, f.Tensors, f.Metadata)
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	// The shares were learned: an answer too large to send must say so,
	// not fail as a transport's ResourceExhausted that reads as "retry"
	// (a resent batch would be learned twice).
	if n := proto.Size(resp); n > s.cfg.MaxResponseBytes {
		return grpcerr.ToStatus(fmt.Errorf("%w: learn: the batch was learned, but the merged info of %d bytes exceeds the response bound of %d; do not resend it: have the learners return less info",
			errs.ErrInvalid, n, s.cfg.MaxResponseBytes))
	}
	return stream.SendAndClose(resp)
}

// LearnBatch is Learn for an in-process batch: it splits batch among the
// task's learners, fans the shares out, applies the failure policy and
// merges the infos in row order. metadata is passed to every share.
func (s *Service) LearnBatch(ctx context.Context, taskID string, batch *tensor.StateDict, metadata map[string]string) (*rlhubv1.LearnResponse, error) {
	resp, err := s.learnBatch(ctx, taskID, batch, metadata)
	s.mu.Lock()
	if err != nil {
		s.stats.learnFailed++
	} else {
		s.stats.learnOK++
	}
	s.mu.Unlock()
	return resp, err
}

func (s *Service) learnBatch(ctx context.Context, taskID string, batch *tensor.StateDict, metadata map[string]string) (*rlhubv1.LearnResponse, error) {
	rows, err := BatchRows(batch)
	if err != nil {
		return nil, err
	}
	if rows == 0 {
		return nil, fmt.Errorf("%w: batch has no rows", errs.ErrInvalid)
	}
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	t, err := s.currentTask(taskID)
	if err != nil {
		return nil, err
	}
	// Membership: the recorded learners still attached and started, with
	// their recorded sizes; without a recorded demand (or when none of
	// them is left), every started learner with equal weight.
	byID := make(map[string]*learnerConn)
	for _, c := range s.attached(t) {
		byID[c.id] = c
	}
	var order []string
	var weights []int64
	s.mu.Lock()
	for i, id := range t.order {
		if byID[id] != nil {
			order = append(order, id)
			weights = append(weights, t.sizes[i])
		}
	}
	recorded := len(t.order)
	s.mu.Unlock()
	if len(order) == 0 || sum(weights) == 0 {
		order, weights = nil, nil
		for _, c := range s.attached(t) {
			order = append(order, c.id)
			weights = append(weights, 1)
		}
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("%w: no learners attached and started for task %q", errs.ErrUnavailable, t.id)
	}
	if len(order) != recorded {
		s.cfg.Logger.Info("aggregator: membership changed since demand; split recomputed", "task", t.id, "recorded", recorded, "now", order)
	}
	plan, err := NewPlan(rows, order, weights, s.cfg.OnFailure)
	if err != nil {
		return nil, err
	}
	for round := plan.Pending(); len(round) > 0; round = plan.Pending() {
		// A learner serves one task at a time: its shares of a round (a
		// re-split may give it several) go one after another, each wait
		// bounded by TaskTimeout from its own send.
		outs := make([]Outcome, len(round))
		var ids []string
		shares := make(map[string][]int)
		for i, sh := range round {
			if shares[sh.Learner] == nil {
				ids = append(ids, sh.Learner)
			}
			shares[sh.Learner] = append(shares[sh.Learner], i)
		}
		fanOut(ids, func(_ int, id string) error {
			for _, i := range shares[id] {
				outs[i].Info, outs[i].Err = s.learnShare(ctx, byID[id], t.id, batch, metadata, round[i])
			}
			return nil
		})
		var failures []error
		for _, o := range outs {
			if o.Err != nil {
				failures = append(failures, o.Err)
			}
		}
		if len(failures) > 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("learn task %q: %w (learner failures: %w)", t.id, context.Cause(ctx), errors.Join(failures...))
		}
		resplits := plan.Resplits()
		if err := plan.Report(outs); err != nil {
			return nil, fmt.Errorf("learn task %q: %w", t.id, err)
		}
		if n := plan.Resplits() - resplits; n > 0 {
			s.mu.Lock()
			s.stats.resplits += uint64(n)
			s.mu.Unlock()
			s.cfg.Logger.Warn("aggregator: re-splitting failed shares", "task", t.id, "failed", plan.Failed(), "err", errors.Join(failures...))
		}
	}
	resp, err := plan.Result(t.merge)
	if err != nil {
		return nil, fmt.Errorf("learn task %q: %w", t.id, err)
	}
	return resp, nil
}

func sum(w []int64) int64 {
	var n int64
	for _, x := range w {
		n += x
	}
	return n
}

// learnShare sends one share to its learner and waits for the info.
func (s *Service) learnShare(ctx context.Context, c *learnerConn, taskID string, batch *tensor.StateDict, metadata map[string]string, sh Share) (*rlhubv1.Value, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: learner %q is gone", errs.ErrUnavailable, sh.Learner)
	}
	layout, err := safetensors.Plan(SliceRows(batch, sh.Start, sh.Rows), metadata)
	if err != nil {
		return nil, err
	}
	r, err := s.call(ctx, c, func(reqID uint64) error {
		err := s.send(c, &rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Learn{Learn: &rlhubv1.LearnTask{
			RequestId: reqID, TaskId: taskID, RowStart: sh.Start, Rows: sh.Rows,
			Blob: &rlhubv1.BlobInfo{TotalBytes: uint64(layout.Size), ChunkBytes: uint32(s.cfg.ChunkBytes)},
		}}})
		if err != nil {
			return err
		}
		return wire.Chunks(layout, s.cfg.ChunkBytes, func(b []byte) error {
			return s.send(c, &rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
		})
	})
	s.mu.Lock()
	if err != nil || r.Error != "" {
		c.failed++
	} else {
		c.done++
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if r.Error != "" {
		return nil, fmt.Errorf("%w: learner %q failed rows [%d,%d): %s", errs.ErrAborted, sh.Learner, sh.Start, sh.Start+sh.Rows, learnerError(r.Error))
	}
	return r.Info, nil
}
