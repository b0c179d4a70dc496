package run

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/hub"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Row is one finished iteration as Run saw it.
type Row struct {
	P    *pb.ARSProgress
	Wall float64 // seconds since the run started, on this machine
}

// ErrUnreachable marks a hub that stayed unreachable beyond the reconnect
// window (or, before the run started, refused the connection).
var ErrUnreachable = errors.New("hub unreachable")

// Run trains one policy: it prepares Out, starts the embedded hub and the
// worker processes when asked, starts (or, with OutResume, finds) the run
// on the hub, follows it to its end across hub restarts within the
// reconnect window, and writes the outputs. It returns the summary it
// wrote; the error is non-nil when the run did not end at its target or
// budget (outputs are still written when at least one iteration finished,
// also when ctx is cancelled, an interrupt: the final policy pull then
// has 10 s of its own, and the summary's stop reason is "interrupted").
func Run(ctx context.Context, cfg Config) (Summary, error) {
	spec, err := cfg.validate()
	if err != nil {
		return Summary{}, err
	}
	rec, err := prepareOut(&cfg)
	if err != nil {
		return Summary{}, err
	}
	if rec != nil {
		if err := sameRunAsStarted(cfg.Out, spec); err != nil {
			return Summary{}, err
		}
	}
	r := &runner{cfg: cfg, spec: spec, protocol: protocolOf(spec)}
	return r.run(ctx, rec)
}

// sameRunAsStarted refuses to resume with a spec other than the one the
// run started with (OUT/config.yaml): the hub continues the run it has,
// so the outputs written now would describe another run, and replaying
// OUT/config.yaml would not give OUT/policy.safetensors.
func sameRunAsStarted(out string, spec *pb.ARSRunSpec) error {
	f, err := LoadFile(filepath.Join(out, "config.yaml"))
	if err != nil {
		return nil // killed before config.yaml was written: nothing to compare with
	}
	started, _, err := arsrpc.Normalise(f.Spec())
	if err != nil || proto.Equal(started, spec) {
		return nil
	}
	return fmt.Errorf("--resume: the run in %s started as %s/config.yaml says; a resumed run keeps its settings: drop the flags (or --config) that change them, or start a new run with --overwrite or another --out", out, out)
}

// runner is one Run's state; it is used by Run's goroutine only.
type runner struct {
	cfg      Config
	spec     *pb.ARSRunSpec // normalised
	protocol string
	client   pb.ARSClient
	runID    string
	began    time.Time
	rows     []Row
	next     uint64 // first iteration not yet seen
	prog     *progress
	curve    *curveFile
	// On a resumed run: the wall seconds curve.csv recorded for the
	// iterations seen before (kept when the hub sends them again), and
	// the largest of them (added to the time of new iterations).
	prevWall map[curveKey]float64
	wallBase float64
	// reconnects counts outages the client recovered from (Summary's
	// HubReconnects); only the run's goroutine touches it.
	reconnects int
}

func (r *runner) run(ctx context.Context, rec *runRecord) (Summary, error) {
	cfg := &r.cfg
	addr := cfg.Hub
	if rec != nil && addr == "" && rec.Hub != "" {
		addr = rec.Hub
	}
	if addr == "" {
		h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(cfg.Out, "hub"), Logger: cfg.Logger.With("role", "hub")})
		if err != nil {
			return Summary{}, err
		}
		if err := h.Start(); err != nil {
			return Summary{}, errors.Join(err, h.Close())
		}
		defer h.Close()
		addr = h.Addr().String()
	}

	// Worker processes live until this function returns.
	procs := newWorkerProcs()
	defer procs.stop()
	cpu0 := selfCPU()
	for i := range cfg.Workers {
		w := cfg.WorkerCommand
		args := append(append([]string{}, w[1:]...), "--log-level", "warn", "worker", "ars", "--hub", addr,
			"--name", fmt.Sprintf("worker-%d", i), "--retry-for", cfg.ReconnectWindow.String())
		args = append(args, cfg.WorkerArgs...)
		if err := procs.start(w[0], args, cfg.WorkerOutput); err != nil {
			return Summary{}, fmt.Errorf("start worker %d: %w", i, err)
		}
	}
	procs.seal()

	conn, err := cfg.Dial.GRPC(addr)
	if err != nil {
		return Summary{}, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	r.client = pb.NewARSClient(conn)
	r.began = time.Now()

	var model string
	if rec != nil {
		r.runID, model = rec.RunID, rec.Model
		cfg.Logger.Info("ars run resumed", "run", r.runID, "hub", addr)
	} else {
		// Fail fast: a hub that refuses connections is an error now, not
		// after a long wait (no WaitForReady).
		hctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
		_, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			return Summary{}, fmt.Errorf("hub %s: %w: %w", addr, ErrUnreachable, grpcerr.FromStatus(err))
		}
		// The hub answered: from here a broken call (the hub restarting)
		// is retried within the window, with one idempotency key so the
		// run starts once.
		var key [16]byte
		rand.Read(key[:])
		req := &pb.ARSStartRunRequest{Spec: cfg.Spec, RequestId: hex.EncodeToString(key[:])}
		var start *pb.ARSStartRunResponse
		err = r.retry(ctx, "start run", func(ctx context.Context) error {
			var err error
			start, err = r.client.StartRun(ctx, req)
			return grpcerr.FromStatus(err)
		})
		if err != nil {
			return Summary{}, fmt.Errorf("start run: %w", err)
		}
		r.runID, model = start.RunId, start.Model
		hubRec := cfg.Hub // an embedded hub's address changes on every start
		if err := writeRunRecord(cfg.Out, &runRecord{Hub: hubRec, RunID: r.runID, Model: model, Started: time.Now().UTC().Format(time.RFC3339)}); err != nil {
			return Summary{}, err
		}
		cfg.Logger.Info("ars run", "run", r.runID, "hub", addr, "workers", cfg.Workers)
	}
	// The fully resolved configuration: `--config OUT/config.yaml`
	// replays the run.
	yml, err := resolvedFile(r.spec, cfg).Marshal()
	if err != nil {
		return Summary{}, err
	}
	if err := atomicfile.Write(filepath.Join(cfg.Out, "config.yaml"), yml); err != nil {
		return Summary{}, err
	}
	if rec != nil {
		r.prevWall, r.wallBase = readCurveWalls(filepath.Join(cfg.Out, "curve.csv"))
	}
	if r.curve, err = createCurve(filepath.Join(cfg.Out, "curve.csv")); err != nil {
		return Summary{}, err
	}
	defer r.curve.close()
	r.prog = newProgress(cfg.Progress, cfg.Terminal, r.total(), r.protocol)

	// Follow the run; give up if every worker process we started died
	// (nobody would ever finish an iteration).
	wctx, cancelWatch := context.WithCancel(ctx)
	watchdog := make(chan bool, 1)
	go func() {
		select {
		case <-procs.allExitedIf(cfg.Workers > 0 && cfg.Hub == ""):
			cancelWatch()
			watchdog <- true
		case <-wctx.Done():
			watchdog <- false
		}
	}()
	werr := r.follow(wctx)
	cancelWatch()
	if <-watchdog && werr != nil {
		werr = errors.New("every worker process exited before the run ended")
	}
	r.prog.finish()
	interrupted := ctx.Err() != nil
	if werr != nil && !errors.Is(werr, ErrUnreachable) && !(interrupted && cfg.Hub == "") {
		// Interrupted or the stream broke: stop the run, keep what we have.
		// (An interrupted run on the embedded hub is left as it is on
		// disk, so OutResume can continue it.)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.client.StopRun(sctx, &pb.ARSStopRunRequest{RunId: r.runID})
		cancel()
	}
	if len(r.rows) == 0 {
		return Summary{}, errors.Join(werr, errors.New("no iteration finished"))
	}
	// The outputs are written even when interrupted: the final pull then
	// runs under a context of its own, bounded by outputTimeout.
	octx := ctx
	if interrupted {
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(context.WithoutCancel(ctx), outputTimeout)
		defer cancel()
	}
	var pol *ars.Policy
	var blob []byte
	perr := r.retry(octx, "pull policy", func(ctx context.Context) error {
		var err error
		pol, blob, err = arsrpc.PullPolicy(ctx, r.client, r.runID, 0)
		return err
	})
	if perr != nil {
		return Summary{}, errors.Join(werr, perr)
	}
	hubCPU := selfCPU() - cpu0
	workerCPU := procs.stop()
	sum := summarise(r, model, pol)
	if interrupted && !r.rows[len(r.rows)-1].P.Done {
		sum.Reason = "interrupted"
	}
	sum.WorkerCPUSeconds, sum.TrainCPUSeconds = workerCPU.Seconds(), hubCPU.Seconds()
	if workerCPU > 0 {
		sum.StepsPerWorkerCPUSecond = float64(sum.Steps) / workerCPU.Seconds()
	}
	if err := r.curve.close(); err != nil {
		return sum, errors.Join(werr, err)
	}
	if err := writeOutputs(cfg.Out, blob, r.rows, sum); err != nil {
		return sum, errors.Join(werr, err)
	}
	if werr != nil {
		return sum, werr
	}
	if last := r.rows[len(r.rows)-1].P; last.Reason != "target" && last.Reason != "budget" {
		return sum, fmt.Errorf("run ended: %s", last.Reason)
	}
	return sum, nil
}

// outputTimeout bounds the final policy pull of an interrupted run (its
// own context: the run's is cancelled).
const outputTimeout = 10 * time.Second

// total is the progress bar's length in episodes (-1: unknown).
func (r *runner) total() int64 {
	if r.spec.MaxEpisodes > 0 {
		return r.spec.MaxEpisodes
	}
	return -1
}

// retryable reports whether err may pass once the hub is back.
func retryable(err error) bool {
	return errors.Is(err, errs.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// retry runs fn until it succeeds, fails for good, or the hub has been
// unreachable for the reconnect window; it backs off from 50ms to 2s. A
// success after failed attempts counts one reconnect.
func (r *runner) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	var downSince time.Time
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := fn(actx)
		cancel()
		if err == nil && !downSince.IsZero() {
			r.reconnects++
		}
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return err
		}
		if downSince.IsZero() {
			downSince = time.Now()
		}
		if time.Since(downSince) > r.cfg.ReconnectWindow {
			return fmt.Errorf("%s: %w for %v: %w", what, ErrUnreachable, r.cfg.ReconnectWindow, err)
		}
		r.cfg.Logger.Debug("hub unreachable, retrying", "what", what, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// follow watches the run to its end. A broken stream is re-opened from
// the first iteration not yet seen, so each iteration is recorded once
// whatever the number of hub restarts; the window restarts whenever an
// iteration arrives. A stream that delivers again after a break counts
// one reconnect (not one per attempt while the hub was down).
func (r *runner) follow(ctx context.Context) error {
	var downSince time.Time
	backoff := 50 * time.Millisecond
	broken := false
	for {
		progressed, done, err := r.watchOnce(ctx)
		if broken && (progressed || done) {
			r.reconnects++
			broken = false
		}
		if done {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errs.ErrNotFound) {
			return fmt.Errorf("the hub no longer knows run %s (restarted without its --data?): %w", r.runID, err)
		}
		if !retryable(err) && err != nil {
			return err
		}
		if progressed || downSince.IsZero() {
			downSince, backoff = time.Now(), 50*time.Millisecond
		}
		if time.Since(downSince) > r.cfg.ReconnectWindow {
			return fmt.Errorf("watch run %s: %w for %v: %w", r.runID, ErrUnreachable, r.cfg.ReconnectWindow, err)
		}
		r.cfg.Logger.Debug("progress stream broke, reconnecting", "run", r.runID, "next", r.next, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		broken = true
	}
}

// watchOnce follows one progress stream from r.next. done is true when
// the run's last entry arrived.
func (r *runner) watchOnce(ctx context.Context) (progressed, done bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := r.client.WatchRun(sctx, &pb.ARSWatchRunRequest{RunId: r.runID, FromIteration: r.next})
	if err != nil {
		return false, false, grpcerr.FromStatus(err)
	}
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return progressed, false, fmt.Errorf("%w: progress stream ended before the run", errs.ErrUnavailable)
		}
		if err != nil {
			return progressed, false, grpcerr.FromStatus(err)
		}
		if p.Iteration < r.next && !p.Done {
			continue // seen before a reconnect
		}
		progressed = true
		r.record(p)
		if p.Done {
			return true, true, nil
		}
	}
}

// record keeps one new iteration: the curve file, the progress display
// and the observer.
func (r *runner) record(p *pb.ARSProgress) {
	// The row keeps wall_seconds as curve.csv writes it, so a summary
	// made now and one made from the file at a later --resume agree.
	wall := roundG(time.Since(r.began).Seconds() + r.wallBase)
	if w, ok := r.prevWall[curveKey{p.Iteration, p.Confirm}]; ok {
		wall = w // recorded before the resume
	}
	row := Row{P: p, Wall: wall}
	r.rows = append(r.rows, row)
	if !p.Done || p.Iteration >= r.next {
		r.next = p.Iteration + 1
	}
	if err := r.curve.append(row); err != nil {
		r.cfg.Logger.Warn("curve.csv", "err", err)
	}
	it := iterationOf(row, r.protocol)
	r.prog.update(it)
	if r.cfg.Observer != nil {
		r.cfg.Observer.OnIteration(it)
	}
}

func iterationOf(row Row, protocol string) Iteration {
	p := row.P
	it := Iteration{Iteration: p.Iteration, Version: p.Version, Episodes: p.Episodes, PolicyEpisodes: p.PolicyEpisodes,
		EvalEpisodes: p.EvalEpisodes, Steps: p.Steps, Wall: time.Duration(row.Wall * float64(time.Second)),
		TrainReturn: p.TrainReturn, HasTrain: p.Episodes > p.PolicyEpisodes,
		HasEval: p.HasEval, EvalReturn: p.EvalMean, EvalStd: p.EvalStd, Confirm: p.Confirm, Protocol: protocol}
	if row.Wall > 0 {
		it.StepsPerSecond = float64(p.Steps) / row.Wall
	}
	return it
}

// protocolOf names a normalised spec's evaluation protocol.
func protocolOf(s *pb.ARSRunSpec) string {
	if s.Protocol == "" {
		return "paper"
	}
	return s.Protocol
}

func formatG(v float64) string { return strconv.FormatFloat(v, 'g', 10, 64) }

// roundG is v as formatG writes it.
func roundG(v float64) float64 {
	f, err := strconv.ParseFloat(formatG(v), 64)
	if err != nil {
		return v
	}
	return f
}
