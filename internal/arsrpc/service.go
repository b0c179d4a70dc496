// Package arsrpc distributes ARS over gRPC: the hub-side coordinator
// service (runs, leased tasks, results, publishing each new policy version
// to the model store) and the worker loop that `rlhub worker ars` runs.
//
// The algorithm itself is package ars; the pure coordinator state
// (coord.go) decides leases and applies results, and the Service wraps it
// in one mutex, turning state changes into wake-ups for long polls and
// progress streams. A run's result does not depend on which worker
// computed what: every task is a deterministic function of (seed,
// iteration, task), results are keyed by task, and the trainer merges
// them in task order.
package arsrpc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/crashpoint"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Config configures the coordinator service.
type Config struct {
	// Store receives every policy version; required.
	Store store.Store
	// LeaseTTL: a leased task not reported within it, or a worker silent
	// for it, is released for others; 0 means 10s.
	LeaseTTL time.Duration
	// StraggleAfter: once no task is unleased, a task held this long by
	// every holder is also handed to an idle worker (first result wins);
	// 0 means 2s.
	StraggleAfter time.Duration
	// MaxHolders bounds how many workers may hold one task at once; 0
	// means 2.
	MaxHolders int
	// MaxWait caps one Lease long poll; 0 means 2s. Must be below
	// LeaseTTL.
	MaxWait time.Duration
	// PublishTimeout bounds one store push; 0 means 10s.
	PublishTimeout time.Duration
	// ChunkBytes is the PullPolicy chunk size; 0 means 1 MiB.
	ChunkBytes int
	// InlineMax: a policy blob up to this size rides inside a lease for a
	// worker that does not hold it (saving a PullPolicy round trip); 0
	// means 1 MiB, negative means never.
	InlineMax int
	// MaxPolicyParams bounds the parameters of one run's policy (weights
	// and biases of every layer, obs → hidden… → actions); 0 means
	// DefaultMaxPolicyParams. A StartRun over it is refused with
	// InvalidArgument before anything is allocated (`rlhub serve
	// --max-policy-params`).
	MaxPolicyParams int64
	// MaxEndedRuns bounds the ended runs (done, failed or stopped) kept
	// in memory, the newest; 0 means DefaultMaxEndedRuns. An ended run
	// holds no trainer or iteration state, only its spec, progress and
	// curve; an older one is forgotten: with DataDir, WatchRun, StopRun
	// and PullPolicy still answer it from its files, without it they
	// answer NotFound; a StartRun retry with its request_id starts a new
	// run. A restart loads the newest MaxEndedRuns by run number.
	MaxEndedRuns int
	// DataDir is where every run's state is kept crash-safely (the hub's
	// --data/ars; persist.go documents the files); a restarted service
	// resumes every unfinished run from its last finished iteration. ""
	// keeps nothing (runs die with the process).
	DataDir string
	// StateChanged, when set, is told every file under DataDir the
	// service wrote, once written and before the policy version it
	// belongs to is pushed (persist.go): a cluster primary's replication
	// ships what is named instead of walking DataDir
	// (replica.Source.Changed). It must not block; nil tells no one.
	StateChanged func(path string)
	// StateAppended, when set, is told instead of StateChanged when a
	// run's progress.log was only appended to, with where the new bytes
	// start (replica.Source.Appended: a unit ships them only).
	StateAppended func(path string, from int64)
	// CrashAt (tests only) SIGKILLs the process at a named point of the
	// state writes: "report" (results accepted mid-iteration),
	// "eval-report" (evaluation results accepted, not yet durable),
	// "snapshot" (state.json half written, not renamed), "publish" (state
	// on disk, version not yet in the store), "iteration" (an iteration
	// fully recorded, before anyone is told); "point:N" for the Nth time.
	CrashAt string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultMaxEndedRuns is Config.MaxEndedRuns' default.
const DefaultMaxEndedRuns = 1000

// DefaultMaxPolicyParams is Config.MaxPolicyParams' default: 4M
// parameters, a policy of 32 MiB in float64, far above the paper's linear
// policies (HalfCheetah's is 102) and a few hidden layers of hundreds.
const DefaultMaxPolicyParams = 4 << 20

func (c *Config) validate() error {
	if c.Store == nil {
		return errors.New("arsrpc: Config.Store is required")
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.StraggleAfter == 0 {
		c.StraggleAfter = 2 * time.Second
	}
	if c.MaxHolders == 0 {
		c.MaxHolders = 2
	}
	if c.MaxWait == 0 {
		c.MaxWait = 2 * time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 10 * time.Second
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = 1 << 20
	}
	if c.InlineMax == 0 {
		c.InlineMax = 1 << 20
	}
	if c.MaxPolicyParams == 0 {
		c.MaxPolicyParams = DefaultMaxPolicyParams
	}
	if c.MaxEndedRuns == 0 {
		c.MaxEndedRuns = DefaultMaxEndedRuns
	}
	if c.MaxEndedRuns < 0 {
		return fmt.Errorf("arsrpc: negative MaxEndedRuns %d", c.MaxEndedRuns)
	}
	if c.MaxPolicyParams < 0 {
		return fmt.Errorf("arsrpc: negative MaxPolicyParams %d", c.MaxPolicyParams)
	}
	if c.LeaseTTL < 0 || c.StraggleAfter < 0 || c.MaxHolders < 1 || c.MaxWait < 0 || c.PublishTimeout < 0 || c.ChunkBytes < 1 {
		return fmt.Errorf("arsrpc: negative duration or size in %+v", *c)
	}
	if c.MaxWait >= c.LeaseTTL {
		return fmt.Errorf("arsrpc: MaxWait %v must be below LeaseTTL %v (a long-polling worker would expire)", c.MaxWait, c.LeaseTTL)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Service is the hub's ARS coordinator. Its handlers are called by gRPC
// goroutines; all state lives in the coordinator behind mu.
type Service struct {
	pb.UnimplementedARSServer
	cfg  Config
	quit chan struct{} // closed by Close: ends long polls and watches

	mu      sync.Mutex
	c       *coordinator     // guarded by mu
	persist *persister       // nil without DataDir; guarded by mu
	crash   *crashpoint.Hook // guarded by mu
	changed chan struct{}    // closed and replaced on every state change; guarded by mu
	closed  bool             // guarded by mu
}

// New builds the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var boot [4]byte
	rand.Read(boot[:])
	s := &Service{
		cfg:     cfg,
		quit:    make(chan struct{}),
		c:       newCoordinator(cfg.LeaseTTL, cfg.StraggleAfter, cfg.MaxHolders, fmt.Sprintf("-%x", boot)).withMaxParams(cfg.MaxPolicyParams).withMaxEnded(cfg.MaxEndedRuns),
		changed: make(chan struct{}),
		crash:   crashpoint.Parse(cfg.CrashAt),
	}
	if cfg.DataDir != "" {
		p, err := newPersister(cfg.DataDir, s.crash, cfg.StateChanged, cfg.StateAppended)
		if err != nil {
			return nil, err
		}
		s.persist = p
		if err := s.restore(); err != nil {
			return nil, errors.Join(err, p.close())
		}
	}
	return s, nil
}

// restore loads the runs kept under DataDir: every unfinished one, which
// resumes at its last finished iteration, and the newest MaxEndedRuns
// ended ones. If the store missed a live run's last finished iteration's
// version (a crash between the state write and the publish), it is
// published again from the restored θ.
func (s *Service) restore() error {
	runs, maxNum, unstarted, bad := s.persist.load(s.c.maxEnded)
	for _, err := range bad {
		s.cfg.Logger.Error("ars run state unreadable: run not resumed", "err", err)
	}
	for _, id := range unstarted {
		s.cfg.Logger.Info("ars run removed: its StartRun never finished (never acknowledged)", "run", id)
	}
	s.c.nextRun = maxNum
	for _, l := range runs {
		r := l.r
		s.c.addRun(r)
		if err := s.reconcileStore(r); err != nil {
			s.cfg.Logger.Error("ars run cannot resume", "run", r.id, "err", err)
			s.c.fail(r, fmt.Errorf("resume: %w", err), s.cfg.Now())
			if err := s.persist.save(r); err != nil {
				s.cfg.Logger.Error("ars state write", "run", r.id, "err", err)
			}
		}
		if !r.done {
			s.cfg.Logger.Info("ars run resumed", "run", r.id, "iteration", r.tr.Iter(), "version", r.version)
		}
	}
	return nil
}

// ended answers for a run the coordinator does not keep: an ended one it
// forgot (coordinator.ended) is read from DataDir; anything else is
// NotFound. Caller does not hold mu (the files of a forgotten run are
// never written again).
func (s *Service) ended(id string) (model string, progress []*pb.ARSProgress, err error) {
	s.mu.Lock()
	forgotten := s.c.forgotten(id)
	s.mu.Unlock()
	switch {
	case forgotten && s.cfg.DataDir == "":
		return "", nil, fmt.Errorf("%w: run %s ended and is no longer kept: this hub keeps the newest %d ended runs and has no --data to read older ones from",
			errs.ErrNotFound, errs.Quote(id), s.cfg.MaxEndedRuns)
	case forgotten:
		model, progress, ok, err := readEnded(s.cfg.DataDir, id)
		if err != nil {
			return "", nil, fmt.Errorf("%w: run %s ended and is no longer kept, and its state cannot be read: %v", errs.ErrNotFound, errs.Quote(id), err)
		}
		if ok {
			return model, progress, nil
		}
	}
	return "", nil, fmt.Errorf("%w: run %s", errs.ErrNotFound, errs.Quote(id))
}

// reconcileStore makes the store's newest version of r's model r.version.
func (s *Service) reconcileStore(r *run) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
	defer cancel()
	var have uint64
	snap, err := s.cfg.Store.Get(ctx, r.model, 0)
	switch {
	case err == nil:
		have = snap.Version
	case !errors.Is(err, errs.ErrNotFound):
		return err
	}
	if have == r.version {
		return nil
	}
	if have+1 != r.version {
		return fmt.Errorf("the store holds version %d of %s, the run's state version %d", have, r.model, r.version)
	}
	if r.tr == nil {
		return fmt.Errorf("the store holds version %d of %s, the ended run's state version %d", have, r.model, r.version)
	}
	blob, err := r.tr.PolicyOf().Encode()
	if err != nil {
		return err
	}
	s.cfg.Logger.Info("ars run: republishing the version a crash kept from the store", "run", r.id, "version", r.version)
	return s.pushLocked(&publish{model: r.model, version: r.version, blob: blob})
}

// Register attaches the handlers (hub.Service).
func (s *Service) Register(g *grpc.Server) { pb.RegisterARSServer(g, s) }

// Drain ends every long poll and watch so that a graceful stop does not
// wait for them (hub.Drainer); later calls fail with Unavailable. Safe to
// call twice.
func (s *Service) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.quit)
	}
}

// Close drains the service (hub.Service). Safe to call twice. The service
// starts no goroutines of its own.
func (s *Service) Close() error {
	s.Drain()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.persist != nil {
		return s.persist.close()
	}
	return nil
}

// broadcastLocked wakes everyone waiting for a change. Caller holds mu.
func (s *Service) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

var errClosed = fmt.Errorf("%w: ARS coordinator is shutting down", errs.ErrUnavailable)

// pushLocked publishes a version. Caller holds mu, so no worker can lease
// the iteration that needs it before it is in the store.
func (s *Service) pushLocked(p *publish) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
	defer cancel()
	expect := p.version - 1
	// Version 1 creates the model and claims it (Config.Store is the hub's
	// owner view); every later version lands only on the model the run
	// still owns: one deleted since (an administrator's Delete drops the
	// claim) and pushed again by another writer, maybe at the run's
	// version, is not the run's to write over (store.PushRequest.Owned).
	_, err := s.cfg.Store.Push(ctx, store.PushRequest{Name: p.model, Version: p.version, Expect: expect, Owned: p.version > 1, Blob: p.blob})
	return err
}

// ModelDeleted tells the coordinator that model was deleted from its store
// (an administrator's `rlhub model rm`; the hub calls it once the Delete
// is done). A live run whose policy it is ends, failed, saying so: its
// next version has no model to land on (a model of the name pushed again
// since is another writer's), and its workers would go on evaluating a
// policy that is gone. Its state is written and acknowledged as StopRun's.
func (s *Service) ModelDeleted(ctx context.Context, model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.c.runs {
		if r.model != model || r.done {
			continue
		}
		s.c.fail(r, fmt.Errorf("its policy model %s was deleted from the store (rlhub model rm): the run is stopped", errs.Quote(model)), s.cfg.Now())
		s.cfg.Logger.Warn("ars run stopped: its policy model was deleted", "run", r.id, "model", model)
		if err := s.saveLocked(r); err == nil {
			if err := s.acknowledgeLocked(ctx, r.model); err != nil {
				s.cfg.Logger.Warn("ars run stopped by a delete: its state is not acknowledged; a failover now may resume it until its next publish is refused", "run", r.id, "err", err)
			}
		}
		s.broadcastLocked()
	}
}

// StartRun implements pb.ARSServer.
func (s *Service) StartRun(ctx context.Context, req *pb.ARSStartRunRequest) (*pb.ARSStartRunResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, grpcerr.ToStatus(errClosed)
	}
	if len(req.RequestId) > 128 {
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: request id of %d bytes (at most 128)", errs.ErrInvalid, len(req.RequestId)))
	}
	if r, ok := s.c.byRequest[req.RequestId]; ok && req.RequestId != "" {
		// A retry: the first may have failed after writing the run.
		if err := s.acknowledgeLocked(ctx, r.model); err != nil {
			return nil, grpcerr.ToStatus(fmt.Errorf("start run %s: %w", r.id, err))
		}
		return &pb.ARSStartRunResponse{RunId: r.id, Model: r.model}, nil
	}
	for attempt := 0; attempt < 1000; attempt++ {
		r, blob, err := s.c.prepareRun(req.GetSpec(), s.cfg.Now())
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		r.requestID = req.RequestId
		err = s.pushLocked(&publish{model: r.model, version: 1, blob: blob})
		if errors.Is(err, errs.ErrStale) {
			continue // the name is taken (a store that outlived a hub): next run number
		}
		if err != nil {
			return nil, grpcerr.ToStatus(fmt.Errorf("publish %s v1: %w", r.model, err))
		}
		if err := s.persist.save(r); err != nil {
			return nil, grpcerr.ToStatus(fmt.Errorf("%w: write run state: %v", errs.ErrUnavailable, err))
		}
		s.c.addRun(r)
		s.broadcastLocked()
		s.cfg.Logger.Info("ars run started", "run", r.id, "model", r.model, "env", r.spec.Env, "seed", r.spec.Seed, "version", r.spec.Version, "directions", r.spec.Directions, "top", r.spec.Top)
		if err := s.acknowledgeLocked(ctx, r.model); err != nil {
			return nil, grpcerr.ToStatus(fmt.Errorf("start run %s: %w", r.id, err))
		}
		return &pb.ARSStartRunResponse{RunId: r.id, Model: r.model}, nil
	}
	return nil, grpcerr.ToStatus(fmt.Errorf("%w: no free run name", errs.ErrExists))
}

// saveLocked writes r's state; a failed write ends the run (its progress
// could not survive a restart) and is logged at ERROR. Caller holds mu.
func (s *Service) saveLocked(r *run) error {
	err := s.persist.save(r)
	if err != nil {
		s.cfg.Logger.Error("ars state write failed: run stopped", "run", r.id, "err", err)
		s.c.fail(r, fmt.Errorf("write run state: %w", err), s.cfg.Now())
	}
	return err
}

// StopRun implements pb.ARSServer.
func (s *Service) StopRun(ctx context.Context, req *pb.ARSStopRunRequest) (*pb.ARSStopRunResponse, error) {
	s.mu.Lock()
	r, ok := s.c.runs[req.RunId]
	if !ok {
		s.mu.Unlock()
		// An ended run forgotten: nothing to stop (its state on disk
		// says it ended, so nothing to acknowledge either).
		if _, _, err := s.ended(req.RunId); err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		return &pb.ARSStopRunResponse{}, nil
	}
	defer s.mu.Unlock()
	s.c.fail(r, errors.New("stopped"), s.cfg.Now())
	if err := s.saveLocked(r); err != nil {
		// Not acknowledged: a restart would resume the run from its
		// state on disk. The client may ask again.
		s.broadcastLocked()
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: stop run %s: its state could not be written: %v", errs.ErrUnavailable, r.id, err))
	}
	s.broadcastLocked()
	if err := s.acknowledgeLocked(ctx, r.model); err != nil {
		return nil, grpcerr.ToStatus(fmt.Errorf("stop run %s: %w", r.id, err))
	}
	return &pb.ARSStopRunResponse{}, nil
}

// acknowledgeLocked returns once the run state written so far is
// acknowledged as a publish is (store.Acknowledger: on a cluster, on the
// standbys a publish waits for), so what StartRun and StopRun answered
// survives a failover; a store that acknowledges every write as it
// commits it needs nothing. model's versions are already acknowledged.
// Caller holds mu.
func (s *Service) acknowledgeLocked(ctx context.Context, model string) error {
	ack, ok := store.AsAcknowledger(s.cfg.Store)
	if !ok {
		return nil
	}
	return ack.Acknowledge(ctx, model, 0)
}

// WatchRun implements pb.ARSServer.
func (s *Service) WatchRun(req *pb.ARSWatchRunRequest, stream grpc.ServerStreamingServer[pb.ARSProgress]) error {
	sent := 0
	for {
		s.mu.Lock()
		r, ok := s.c.runs[req.RunId]
		var batch []*pb.ARSProgress
		if ok {
			batch = r.progress[sent:] // entries are immutable once appended
		}
		ch := s.changed
		s.mu.Unlock()
		if !ok {
			// Forgotten while watched (it ended: its last entry is Done)
			// or before: read from DataDir.
			_, prog, err := s.ended(req.RunId)
			if err != nil {
				return grpcerr.ToStatus(err)
			}
			batch = prog[min(sent, len(prog)):]
		}
		for _, p := range batch {
			if p.Iteration >= req.FromIteration || p.Done {
				if err := stream.Send(p); err != nil {
					return err
				}
			}
			if p.Done {
				return nil
			}
		}
		sent += len(batch)
		select {
		case <-ch:
		case <-stream.Context().Done():
			return grpcerr.ToStatus(stream.Context().Err())
		case <-s.quit:
			return grpcerr.ToStatus(errClosed)
		}
	}
}

// MaxWorkerNameBytes bounds an ARS worker's free-form name: the hub keeps
// it for as long as the worker is attached (a lease after its last call),
// so each Attach must not make it hold megabytes.
const MaxWorkerNameBytes = 128

func validWorkerName(name string) error {
	return errs.CheckName("worker name", name, MaxWorkerNameBytes)
}

// Attach implements pb.ARSServer.
func (s *Service) Attach(ctx context.Context, req *pb.ARSAttachRequest) (*pb.ARSAttachResponse, error) {
	if err := validWorkerName(req.Name); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, grpcerr.ToStatus(errClosed)
	}
	w := s.c.attach(req.Name, s.cfg.Now())
	if p, ok := auth.FromContext(ctx); ok {
		w.owner = p.Name
	}
	s.cfg.Logger.Debug("ars worker attached", "worker", w.id, "name", w.name)
	return &pb.ARSAttachResponse{WorkerId: w.id, LeaseMs: uint32(s.cfg.LeaseTTL.Milliseconds())}, nil
}

// Detach implements pb.ARSServer.
func (s *Service) Detach(ctx context.Context, req *pb.ARSDetachRequest) (*pb.ARSDetachResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWorkerLocked(ctx, req.WorkerId); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	s.c.detach(req.WorkerId)
	s.broadcastLocked()
	return &pb.ARSDetachResponse{}, nil
}

// Lease implements pb.ARSServer: a long poll of at most min(wait_ms,
// MaxWait) that wakes on any state change or when a lease or the
// straggler threshold runs out.
func (s *Service) Lease(ctx context.Context, req *pb.ARSLeaseRequest) (*pb.ARSLeaseResponse, error) {
	wait := min(time.Duration(req.WaitMs)*time.Millisecond, s.cfg.MaxWait)
	give := time.NewTimer(wait)
	defer give.Stop()
	empty := &pb.ARSLeaseResponse{LeaseMs: uint32(s.cfg.LeaseTTL.Milliseconds())}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, grpcerr.ToStatus(errClosed)
		}
		now := s.cfg.Now()
		resp, err := s.tryLeaseLocked(ctx, req, now)
		if err != nil {
			s.mu.Unlock()
			return nil, grpcerr.ToStatus(err)
		}
		if resp != nil {
			s.mu.Unlock()
			s.inline(ctx, req, resp)
			return resp, nil
		}
		ch := s.changed
		next := s.c.nextEvent()
		s.mu.Unlock()

		var tick <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(max(next.Sub(now), 0) + time.Millisecond)
			tick = timer.C
		}
		var stop error
		gaveUp := false
		select {
		case <-ch:
		case <-tick:
		case <-give.C:
			gaveUp = true
		case <-ctx.Done():
			stop = grpcerr.ToStatus(ctx.Err())
		case <-s.quit:
			stop = grpcerr.ToStatus(errClosed)
		}
		if timer != nil {
			timer.Stop()
		}
		if stop != nil {
			return nil, stop
		}
		if gaveUp {
			return empty, nil
		}
	}
}

// tryLeaseLocked leases tasks without waiting: nil when there are none.
// Caller holds mu.
func (s *Service) tryLeaseLocked(ctx context.Context, req *pb.ARSLeaseRequest, now time.Time) (*pb.ARSLeaseResponse, error) {
	if err := s.checkWorkerLocked(ctx, req.WorkerId); err != nil {
		return nil, err
	}
	r, tasks, err := s.c.lease(req.WorkerId, int(req.MaxTasks), s.skipLocked(ctx, req.SkipRuns), now)
	if err != nil || len(tasks) == 0 {
		return nil, err
	}
	resp := &pb.ARSLeaseResponse{RunId: r.id, Spec: r.spec, Iteration: r.tr.Iter(), Model: r.model,
		Version: r.version, LeaseMs: uint32(s.cfg.LeaseTTL.Milliseconds())}
	for _, t := range tasks {
		resp.Tasks = append(resp.Tasks, taskPB(t))
	}
	return resp, nil
}

// checkWorkerLocked refuses a call as worker id by a token other than the
// one that attached it (PermissionDenied): a worker id is not a
// credential. An unknown id passes (the coordinator answers it). Caller
// holds mu.
func (s *Service) checkWorkerLocked(ctx context.Context, id string) error {
	w, ok := s.c.workers[id]
	if !ok || w.owner == "" {
		return nil
	}
	if p, ok := auth.FromContext(ctx); !ok || p.Name != w.owner {
		return fmt.Errorf("%w: ARS worker %s was attached by another token", errs.ErrPermission, errs.Quote(id))
	}
	return nil
}

// skipLocked is skip plus every run the caller's token does not cover (a
// worker token scoped to ars/A never leases, so never sees, run B). Caller
// holds mu.
func (s *Service) skipLocked(ctx context.Context, skip []string) []string {
	p, ok := auth.FromContext(ctx)
	if !ok || p.Covers(auth.ARSModelPrefix) {
		return skip
	}
	out := slices.Clone(skip)
	for id := range s.c.runs {
		if !p.Covers(auth.ARSModelPrefix + id) {
			out = append(out, id)
		}
	}
	return out
}

// inline attaches the lease's policy blob when the worker does not hold
// that version and it is small. Called without mu: the store serves the
// exact version (it was published before the lease could be made). It is
// an optimisation only: when the store cannot serve the version the lease
// goes out without it and the worker's PullPolicy reports the problem.
func (s *Service) inline(ctx context.Context, req *pb.ARSLeaseRequest, resp *pb.ARSLeaseResponse) {
	if s.cfg.InlineMax < 0 || (req.HeldRunId == resp.RunId && req.HeldVersion == resp.Version) {
		return
	}
	snap, err := s.cfg.Store.Get(ctx, resp.Model, resp.Version)
	if err == nil && len(snap.Blob) <= s.cfg.InlineMax {
		resp.Policy = snap.Blob // immutable, shared: gRPC only reads it
	}
}

// Report implements pb.ARSServer.
func (s *Service) Report(ctx context.Context, req *pb.ARSReportRequest) (*pb.ARSReportResponse, error) {
	resp, err := s.report(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Next != nil {
		s.inline(ctx, req.Next, resp.Next)
	}
	return resp, nil
}

func (s *Service) report(ctx context.Context, req *pb.ARSReportRequest) (*pb.ARSReportResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWorkerLocked(ctx, req.WorkerId); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	now := s.cfg.Now()
	out, err := s.c.report(req.WorkerId, req.RunId, req.Iteration, req.Results, now)
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	r := s.c.runs[req.RunId]
	if out.accepted > 0 || out.finished {
		// Evaluation results taken in, not yet durable — whether or not
		// they finish the iteration (which of a worker's reports finishes
		// it is a matter of timing; the hook must not be).
		for _, x := range req.Results {
			if x.GetTask().GetKind() == pb.ARSTaskKind_ARS_TASK_KIND_EVAL {
				s.crash.At("eval-report")
				break
			}
		}
	}
	if out.finished {
		// Durable before anyone sees the iteration or its version.
		if err := s.saveLocked(r); err != nil && out.pub != nil {
			out.pub = nil // never let the store run ahead of the state
		}
		s.crash.At("publish")
	} else if out.accepted > 0 {
		s.crash.At("report")
	}
	if out.pub != nil {
		if err := s.pushLocked(out.pub); err != nil {
			// The run ends at the version the store holds: state.json
			// (saved above) named the one that never got there.
			r.version = out.pub.version - 1
			s.c.fail(r, fmt.Errorf("publish %s v%d: %w", out.pub.model, out.pub.version, err), now)
			s.cfg.Logger.Error("ars publish failed", "run", req.RunId, "err", err)
			s.saveLocked(r)
		}
	}
	if out.finished {
		s.crash.At("iteration")
	}
	if out.finished || out.accepted > 0 {
		s.broadcastLocked()
	}
	if out.finished {
		p := r.progress[len(r.progress)-1]
		s.cfg.Logger.Debug("ars iteration", "run", r.id, "iteration", p.Iteration, "episodes", p.Episodes, "eval", p.EvalMean, "done", p.Done)
	}
	resp := &pb.ARSReportResponse{Accepted: uint32(out.accepted), Duplicates: uint32(out.duplicates), Stale: uint32(out.stale)}
	if req.Next != nil && !s.closed {
		next, err := s.tryLeaseLocked(ctx, req.Next, now)
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		resp.Next = next
	}
	return resp, nil
}

// PullPolicy implements pb.ARSServer: the version comes from the store.
func (s *Service) PullPolicy(req *pb.ARSPullPolicyRequest, stream grpc.ServerStreamingServer[pb.ARSPolicyPart]) error {
	s.mu.Lock()
	r, ok := s.c.runs[req.RunId]
	var model string
	if ok {
		model = r.model
	}
	s.mu.Unlock()
	if !ok {
		var err error
		if model, _, err = s.ended(req.RunId); err != nil {
			return grpcerr.ToStatus(err)
		}
	}
	snap, err := s.cfg.Store.Get(stream.Context(), model, req.Version)
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	info := &pb.BlobInfo{Model: snap.Name, Version: snap.Version, Epoch: snap.Epoch, TotalBytes: uint64(len(snap.Blob)), ChunkBytes: uint32(s.cfg.ChunkBytes)}
	if err := stream.Send(&pb.ARSPolicyPart{Part: &pb.ARSPolicyPart_Info{Info: info}}); err != nil {
		return err
	}
	return wire.ChunksOf(snap.Blob, s.cfg.ChunkBytes, func(b []byte) error {
		return stream.Send(&pb.ARSPolicyPart{Part: &pb.ARSPolicyPart_Chunk{Chunk: &pb.Chunk{Data: b}}})
	})
}

// Reassigned returns how many times a task was leased to a worker after
// another had held it (expired lease, departed worker or straggler).
func (s *Service) Reassigned() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c.reassigned
}
