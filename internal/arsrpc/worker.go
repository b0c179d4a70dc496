package arsrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// WorkerConfig configures one ARS worker.
type WorkerConfig struct {
	// Conn is the connection to the hub; required.
	Conn grpc.ClientConnInterface
	// Name identifies the worker in the hub's logs; "" means "worker".
	Name string
	// MaxTasks bounds one lease; 0 means 8.
	MaxTasks int
	// Wait is the long-poll length asked of the hub; 0 means 1s.
	Wait time.Duration
	// RetryFor is how long an unreachable hub is retried before RunWorker
	// gives up; 0 means 30s.
	RetryFor time.Duration
	// Live, when set, is updated as the worker goes (tasks, steps, pulls,
	// iteration) for a metrics endpoint to read; nil means no live counts.
	Live *WorkerCounters
	// Logger; nil means slog.Default().
	Logger *slog.Logger

	// afterLease, when set (tests only), runs after each non-empty lease
	// before any task is run.
	afterLease func(*pb.ARSLeaseResponse)
	// attachWait, when set (tests only), replaces attachWait's default.
	attachWait time.Duration
	// callWait, when set (tests only), replaces callWait's default.
	callWait time.Duration
}

// attachWait bounds one Attach: a hub that accepted the connection (even
// completed the HTTP/2 preface) and then answers nothing fails the
// attempt here, to be retried for RetryFor, not waited on for ever.
const attachWait = 10 * time.Second

// callWait bounds one PullPolicy stream or one Report.
const callWait = 30 * time.Second

// leaseSlack is how much longer than the long poll asked for (Wait) a
// worker waits for a lease.
const leaseSlack = 10 * time.Second

func (c *WorkerConfig) validate() error {
	if c.Conn == nil {
		return errors.New("arsrpc: WorkerConfig.Conn is required")
	}
	if c.Name == "" {
		c.Name = "worker"
	}
	if c.MaxTasks == 0 {
		c.MaxTasks = 8
	}
	if c.Wait == 0 {
		c.Wait = time.Second
	}
	if c.RetryFor == 0 {
		c.RetryFor = 30 * time.Second
	}
	if c.MaxTasks < 1 || c.Wait < 0 || c.RetryFor < 0 {
		return fmt.Errorf("arsrpc: bad worker config %+v", *c)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.attachWait == 0 {
		c.attachWait = attachWait
	}
	if c.callWait == 0 {
		c.callWait = callWait
	}
	return nil
}

// WorkerStats counts what a worker did.
type WorkerStats struct {
	Tasks, Steps int64
	Pulls        int64 // PullPolicy streams (policies not inlined in a lease)
}

// worker state: the policy it holds and the evaluator for its run.
type workerLoop struct {
	cfg    WorkerConfig
	client pb.ARSClient
	id     string
	stats  WorkerStats

	runID   string
	version uint64
	envName string
	it      *ars.Iteration
	ev      *ars.Evaluator
	// skip lists runs whose environment this process cannot make (say a
	// Gymnasium env served by Python workers); the hub leases none of them.
	skip []string
}

// errCannotServe marks a lease for a run whose environment this worker
// has no implementation of.
var errCannotServe = errors.New("cannot make the run's environment")

// RunWorker attaches to the hub and runs leased tasks until ctx is done
// (then it stops within a task's next 256 steps, reports the tasks it
// finished, detaches and returns nil) or the hub stays unreachable for
// RetryFor (then it returns the error). A run it cannot serve, or whose
// policy or report is refused as invalid, is skipped (given back and
// named in skip_runs from then on), not fatal. It runs in the calling
// goroutine and starts none.
func RunWorker(ctx context.Context, cfg WorkerConfig) (WorkerStats, error) {
	if err := cfg.validate(); err != nil {
		return WorkerStats{}, err
	}
	w := &workerLoop{cfg: cfg, client: pb.NewARSClient(cfg.Conn)}
	defer w.closeEnv()
	err := w.loop(ctx)
	if w.id != "" {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w.client.Detach(dctx, &pb.ARSDetachRequest{WorkerId: w.id})
		cancel()
	}
	if ctx.Err() != nil {
		return w.stats, nil
	}
	return w.stats, err
}

// closeEnv frees the environment of the evaluator, if any (env.Close).
func (w *workerLoop) closeEnv() {
	if w.ev != nil {
		env.Close(w.ev.Env())
		w.ev = nil
	}
}

func (w *workerLoop) loop(ctx context.Context) error {
	var failingSince time.Time
	backoff := 50 * time.Millisecond
	// retry reports whether err is worth retrying (within RetryFor of the
	// first failure) and backs off from 50ms to 2s: a hub restarting on
	// its --data keeps the run, and the worker carries on. A permanent
	// refusal (a bad request, missing or insufficient credentials) is not.
	retry := func(err error) bool {
		if ctx.Err() != nil || grpcerr.Permanent(err) {
			return false
		}
		if failingSince.IsZero() {
			failingSince, backoff = time.Now(), 50*time.Millisecond
		}
		if time.Since(failingSince) > w.cfg.RetryFor {
			return false
		}
		w.cfg.Logger.Debug("ars worker: retrying", "in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, 2*time.Second)
		return true
	}
	for ctx.Err() == nil {
		if w.id == "" {
			actx, cancel := context.WithTimeout(ctx, w.cfg.attachWait)
			resp, err := w.client.Attach(actx, &pb.ARSAttachRequest{Name: w.cfg.Name}, grpc.WaitForReady(true))
			cancel()
			if err != nil {
				if retry(err) {
					continue
				}
				return w.callError("attach to", w.cfg.attachWait, err)
			}
			// A new attachment may be to another hub, whose run of the
			// same id and version is another run: forget the policy held.
			w.id, w.runID, w.version, w.it = resp.WorkerId, "", 0, nil
		}
		lctx, cancel := context.WithTimeout(ctx, w.cfg.Wait+leaseSlack)
		lease, err := w.client.Lease(lctx, w.leaseRequest())
		cancel()
		if err != nil {
			if errors.Is(grpcerr.FromStatus(err), errs.ErrNotFound) {
				w.id = "" // the hub forgot us (restart or expiry): attach again
				continue
			}
			if retry(err) {
				continue
			}
			return w.callError("lease from", w.cfg.Wait+leaseSlack, err)
		}
		// A lease with tasks clears the failures only once served: a hub
		// that leases but never takes a report (or serves no policy) is
		// given up on after RetryFor as one that answers nothing is.
		if len(lease.Tasks) == 0 {
			failingSince = time.Time{}
		}
		// Serve leases back to back while reports carry the next one.
		for lease != nil && len(lease.Tasks) > 0 {
			if w.cfg.afterLease != nil {
				w.cfg.afterLease(lease)
			}
			runID := lease.RunId
			lease, err = w.serve(ctx, lease)
			if err != nil && ctx.Err() != nil {
				return nil
			}
			if err == nil {
				failingSince = time.Time{}
			}
			if errors.Is(err, errCannotServe) || errors.Is(err, errs.ErrInvalid) {
				// A run this worker cannot make the environment of, or one
				// the hub and this worker disagree about (a policy that
				// does not decode, a refused report: a bug or a version
				// mismatch). Retrying it would fail the same way, and
				// exiting would leave every other run without this
				// worker: give its tasks back at once and ask for other
				// runs only.
				if errors.Is(err, errCannotServe) {
					w.cfg.Logger.Warn("ars worker: skipping a run it cannot serve", "run", runID, "err", err)
				} else {
					w.cfg.Logger.Error("ars worker: skipping a run the hub and this worker disagree about", "run", runID, "err", err)
				}
				w.skipRun(runID)
				dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				w.client.Detach(dctx, &pb.ARSDetachRequest{WorkerId: w.id})
				cancel()
				w.id = ""
				break
			}
			if err != nil {
				if !retry(err) {
					var cf *callFailed
					if errors.As(err, &cf) {
						return w.callError(cf.what, cf.bound, cf.err)
					}
					return err
				}
				break
			}
		}
	}
	return nil
}

// callFailed is a PullPolicy or Report call that failed (err, as gRPC
// returned it) within bound: the loop retries it and, giving up, says it
// with callError. Until then it reads as before ("pull policy: ...") and
// wraps the error as grpcerr.FromStatus converts it.
type callFailed struct {
	op    string // "pull policy", "report"
	what  string // for callError: "pull a policy from", "report to"
	bound time.Duration
	err   error
}

func (e *callFailed) Error() string { return e.op + ": " + grpcerr.FromStatus(e.err).Error() }
func (e *callFailed) Unwrap() error { return grpcerr.FromStatus(e.err) }

// callError is the error a worker gives up with when a call to the
// coordinator (what: "attach to", "lease from", "pull a policy from",
// "report to") failed for RetryFor: it
// names the hub and, when the last attempt timed out, the bound each
// attempt had, so that a hung hub reads as one, not as a bare "context
// deadline exceeded". It wraps the call's error as grpcerr.FromStatus
// converts it (context.DeadlineExceeded, or the sentinel of the status).
func (w *workerLoop) callError(what string, bound time.Duration, err error) error {
	hub := "the ARS coordinator"
	if t, ok := w.cfg.Conn.(interface{ Target() string }); ok {
		hub += " at " + t.Target() // the address this process dialed, not the peer's words
	}
	st, _ := status.FromError(err)
	err = grpcerr.FromStatus(err)
	if grpcerr.Permanent(err) {
		return fmt.Errorf("%s %s: %w", what, hub, err) // refused at once, not retried
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s (retried for %v): %w", what, hub, w.cfg.RetryFor, err)
	}
	if st.Message() == context.DeadlineExceeded.Error() {
		// FromStatus would say it twice; gRPC's own longer messages
		// ("... while waiting for connections to become ready") are kept.
		err = context.DeadlineExceeded
	}
	return fmt.Errorf("%s %s: no answer within %v (retried for %v): %w", what, hub, bound, w.cfg.RetryFor, err)
}

// skipRun adds run to the runs this worker asks the hub not to lease,
// and forgets the policy it holds of it.
func (w *workerLoop) skipRun(run string) {
	if !slices.Contains(w.skip, run) {
		w.skip = append(w.skip, run)
	}
	if w.runID == run {
		w.runID, w.version, w.it = "", 0, nil
	}
}

func (w *workerLoop) leaseRequest() *pb.ARSLeaseRequest {
	return &pb.ARSLeaseRequest{WorkerId: w.id, MaxTasks: uint32(w.cfg.MaxTasks), WaitMs: uint32(w.cfg.Wait.Milliseconds()),
		HeldRunId: w.runID, HeldVersion: w.version, SkipRuns: w.skip}
}

// serve runs one lease's tasks and reports them, asking for the next
// lease in the same round trip; it returns that lease (possibly empty).
// When ctx ends it stops within one task's 256 steps (ars.RunUntil),
// drops the unfinished task, reports the finished ones (bounded by a
// short timeout of its own) and returns ctx's error; the caller then
// detaches, which releases the rest of the lease at once.
func (w *workerLoop) serve(ctx context.Context, lease *pb.ARSLeaseResponse) (*pb.ARSLeaseResponse, error) {
	if err := w.ensurePolicy(ctx, lease); err != nil {
		return nil, err
	}
	req := &pb.ARSReportRequest{WorkerId: w.id, RunId: lease.RunId, Iteration: lease.Iteration}
	stop := func() bool { return ctx.Err() != nil }
	for _, t := range lease.Tasks {
		task := ars.Task{Kind: ars.KindDirection, Index: int(t.Index)}
		if t.Kind == pb.ARSTaskKind_ARS_TASK_KIND_EVAL {
			task.Kind = ars.KindEval
		}
		res, ok := w.ev.RunUntil(w.it, task, stop)
		if !ok {
			w.reportFinished(ctx, req)
			return nil, ctx.Err()
		}
		w.stats.Tasks++
		w.stats.Steps += res.Steps
		if l := w.cfg.Live; l != nil {
			l.Tasks.Add(1)
			l.Steps.Add(res.Steps)
			l.Iteration.Store(lease.Iteration)
		}
		req.Results = append(req.Results, toPB(res))
	}
	req.Next = w.leaseRequest()
	rctx, cancel := context.WithTimeout(ctx, w.cfg.callWait)
	defer cancel()
	resp, err := w.client.Report(rctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &callFailed{op: "report", what: "report to", bound: w.cfg.callWait, err: err}
	}
	return resp.Next, nil
}

// reportFinished reports the tasks of a lease finished before ctx ended,
// asking for no next lease, within a second of its own: their work is
// not lost when the hub answers at once (a result is a deterministic
// function of its task, so what is not reported is simply run again).
func (w *workerLoop) reportFinished(ctx context.Context, req *pb.ARSReportRequest) {
	if len(req.Results) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := w.client.Report(rctx, req); err != nil {
		w.cfg.Logger.Debug("ars worker: report of the finished tasks on the way out failed", "run", req.RunId, "err", err)
	}
}

// ensurePolicy pulls the lease's policy version unless it is held already.
func (w *workerLoop) ensurePolicy(ctx context.Context, lease *pb.ARSLeaseResponse) error {
	if w.runID == lease.RunId && w.version == lease.Version && w.it != nil {
		return nil
	}
	var p *ars.Policy
	var err error
	if len(lease.Policy) > 0 {
		p, err = ars.DecodePolicy(lease.Policy)
	} else {
		p, _, err = pullPolicy(ctx, w.client, lease.RunId, lease.Version, w.cfg.callWait)
		w.stats.Pulls++
		if l := w.cfg.Live; l != nil {
			l.Pulls.Add(1)
		}
	}
	if err != nil {
		return err
	}
	if p.Iteration != lease.Iteration {
		return fmt.Errorf("%w: policy version %d is iteration %d, lease is for iteration %d", errs.ErrInvalid, lease.Version, p.Iteration, lease.Iteration)
	}
	if w.runID != lease.RunId || w.envName != lease.Spec.GetEnv() || w.ev == nil {
		e, err := env.Make(lease.Spec.GetEnv())
		if err != nil {
			return fmt.Errorf("run %s: %w: %v", lease.RunId, errCannotServe, err)
		}
		if sp := e.Spec(); sp.ObsDim != p.Arch.ObsDim || !ars.SameObsKeys(sp.ObsKeys, p.ObsKeys) {
			// A Dict space flattened to another layout would feed the
			// policy (and the per-key filters) the wrong components.
			env.Close(e)
			return fmt.Errorf("run %s: %w: the policy takes %d observations with keys %v, this %s has %d with keys %v",
				lease.RunId, errCannotServe, p.Arch.ObsDim, p.ObsKeys, sp.Name, sp.ObsDim, sp.ObsKeys)
		}
		arch := p.Arch
		w.closeEnv() // the last run's
		w.ev = ars.NewEvaluator(e, &arch)
		w.envName = lease.Spec.GetEnv()
	}
	w.runID, w.version = lease.RunId, lease.Version
	w.it = &ars.Iteration{Seed: p.Seed, Iteration: p.Iteration, Hyper: p.Hyper, Theta: p.Theta, Filter: p.Filter()}
	return nil
}

// PullPolicy downloads and decodes one policy version of a run (0 means
// the newest). It returns the policy and the safetensors blob it was
// decoded from (the policy owns copies; the blob is the caller's).
func PullPolicy(ctx context.Context, client pb.ARSClient, runID string, version uint64) (*ars.Policy, []byte, error) {
	return pullPolicy(ctx, client, runID, version, callWait)
}

// pullPolicy is PullPolicy with the stream bounded by bound; a failed
// call is a *callFailed.
func pullPolicy(ctx context.Context, client pb.ARSClient, runID string, version uint64, bound time.Duration) (*ars.Policy, []byte, error) {
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	failed := func(err error) error {
		return &callFailed{op: "pull policy", what: "pull a policy from", bound: bound, err: err}
	}
	stream, err := client.PullPolicy(pctx, &pb.ARSPullPolicyRequest{RunId: runID, Version: version})
	if err != nil {
		return nil, nil, failed(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, failed(err)
	}
	info := first.GetInfo()
	if info == nil {
		return nil, nil, fmt.Errorf("%w: policy stream did not start with BlobInfo", errs.ErrInvalid)
	}
	asm, err := wire.NewAssembler(info.TotalBytes, wire.Limits{MaxBytes: 256 << 20})
	if err != nil {
		return nil, nil, err
	}
	for {
		part, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, failed(err)
		}
		c := part.GetChunk()
		if c == nil {
			return nil, nil, fmt.Errorf("%w: policy stream sent a second header", errs.ErrInvalid)
		}
		if err := asm.Write(c.Data); err != nil {
			return nil, nil, err
		}
	}
	f, blob, err := asm.Finish()
	if err != nil {
		return nil, nil, err
	}
	p, err := ars.PolicyFromStateDict(f.Tensors, f.Metadata)
	if err != nil {
		return nil, nil, err
	}
	return p, blob, nil
}
