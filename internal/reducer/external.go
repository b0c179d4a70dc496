package reducer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The external step mode (docs/optimizer-host.md). A model registered with
// optimizer kind External is reduced as any other — admission, batching,
// exactly-once ledger, reduction, clipping, counters and publishing stay
// here — but its optimizer step is performed by an attached optimizer host
// (rlhub.OptimizerHost in Python: any torch optimizer and lr scheduler).
// Forward hands the reduced gradient to the host over its Attach stream
// and publishes the weights it sends back as the next version.
//
// The host checkpoints its own optimizer state (the primary keeps none for
// the model). A step in flight when the host's stream breaks is sent again,
// unchanged, to the next host that attaches, so a host killed mid-step
// loses nothing: the batch is applied exactly once.

// External is the optimizer kind of a model whose steps an attached host
// performs; it takes no hyper-parameters.
const External optim.Kind = "external"

// HostStateSuffix names an external model's optimizer host state: the
// host checkpoints its optimizer into the store's model
// <model>+HostStateSuffix, one version per model version
// (docs/optimizer-host.md). It goes with its model when an administrator
// deletes that (Primary.Deleted), and a checkpoint of a step of the model
// deleted comes too late (Primary.GuardHostState).
const HostStateSuffix = "/host-state"

// ExternalStepTimeout bounds one external step: waiting for a host to
// attach (or re-attach) plus the host's step. When it passes, the step
// fails like a failed publish: its gradients count as dropped
// (publish_failed) and the model stops taking gradients.
var ExternalStepTimeout = 2 * time.Minute

// MaxHostErrorBytes is how many bytes of an optimizer host's step error
// the primary keeps (errs.QuoteMax: the rest is cut at a rune boundary and
// its length said).
const MaxHostErrorBytes = 1024

// validateExternal checks an external model's optimizer config.
func validateExternal(c optim.Config) error {
	if c != (optim.Config{Kind: External}) {
		return fmt.Errorf("%w: reducer: optimizer kind %q takes no hyper-parameters or schedule (the host has its own)", errs.ErrInvalid, External)
	}
	return nil
}

// extModel is the host side of one external model.
type extModel struct {
	mu      sync.Mutex
	host    *hostConn     // the attached host, nil when none
	changed chan struct{} // closed (and replaced) whenever host changes
	nextID  uint64
	stop    chan struct{} // closed when the primary closes, or after end
	// failed is why the model stopped taking gradients (a step failed):
	// its host is detached with it and no host attaches after.
	failed error
}

// fail detaches the host of a model that stopped taking gradients, and
// every host that tries to attach after, with ErrAborted naming why: it
// has no step to wait for (a host re-attaching would wait for ever).
// Called without the model's mu (Attach takes e.mu before it).
func (e *extModel) fail(model string, why error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed != nil {
		return
	}
	e.failed = fmt.Errorf("%w: model %s stopped taking gradients until the hub restarts: %v", errs.ErrAborted, errs.Quote(model), why)
	if e.host != nil {
		e.host.detach(e.failed)
	}
}

// end detaches the host of a model whose registration is dropped (its
// model deleted: Primary.unregister), and every host that tries to attach
// to it after, with why (ErrAborted: a host does not re-attach).
func (e *extModel) end(why error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed == nil {
		e.failed = why
	}
	if e.host != nil {
		e.host.detach(e.failed)
	}
}

// ended is why the model stopped taking gradients (fail or end), nil
// while it takes them.
func (e *extModel) ended() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failed
}

// stopped is why a step's wait ended at stop: the model's end (its
// registration dropped) or the primary closing.
func (e *extModel) stopped() error {
	if err := e.ended(); err != nil {
		return err
	}
	return fmt.Errorf("%w: reducer primary closed", errs.ErrUnavailable)
}

func newExtModel() *extModel {
	return &extModel{changed: make(chan struct{}), stop: make(chan struct{})}
}

// stopExternalLocked ends every external step's wait (p.mu held, once,
// from Close).
func (p *Primary) stopExternalLocked() {
	for _, m := range p.models {
		if m.ext != nil {
			close(m.ext.stop)
		}
	}
}

// current returns the attached host, waiting for one until ctx ends. A
// host already detached is not one: its Attach is returning (and clears it
// next), so nothing may be sent on its stream.
func (e *extModel) current(ctx context.Context) (*hostConn, error) {
	for {
		e.mu.Lock()
		h, ch := e.host, e.changed
		e.mu.Unlock()
		if h != nil {
			select {
			case <-h.gone:
			default:
				return h, nil
			}
		}
		select {
		case <-ch:
		case <-e.stop:
			return nil, e.stopped()
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// set makes h the host (under e.mu, after welcome has been sent by the
// caller holding e.mu) and detaches the one it replaces, with ErrAborted:
// the newest host wins, and the one it replaced stops instead of
// re-attaching and replacing it back.
func (e *extModel) setLocked(h *hostConn) {
	old := e.host
	e.host = h
	close(e.changed)
	e.changed = make(chan struct{})
	if old != nil {
		old.detach(fmt.Errorf("%w: replaced by a newer optimizer host", errs.ErrAborted))
	}
}

// clear removes h if it is still the host.
func (e *extModel) clear(h *hostConn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.host == h {
		e.host = nil
		close(e.changed)
		e.changed = make(chan struct{})
	}
}

// hostConn is one attached host. Sends happen only from the stepping
// goroutine (Forward, which holds the model's stepMu) once the host is set;
// the welcome is sent before that. Its receive loop delivers results.
type hostConn struct {
	stream  grpc.BidiStreamingServer[rlhubv1.HostMessage, rlhubv1.PrimaryMessage]
	results chan hostResult // buffered 1: at most one step in flight
	gone    chan struct{}   // closed by detach
	once    sync.Once
	err     error // why it was detached; written before gone is closed
}

type hostResult struct {
	id      uint64
	model   string // the model the host says its weights are of; "" when unset
	version uint64 // the version the host says its weights are; 0 when unset
	err     string // the host's error, quoted and bounded; "" for weights
	file    *safetensors.File
	blob    []byte
}

func (h *hostConn) detach(err error) {
	h.once.Do(func() { h.err = err; close(h.gone) })
}

// recvLoop reads the host's results until the stream breaks or the host is
// detached. maxBytes bounds one result's blob.
func (h *hostConn) recvLoop(model string, maxBytes int64) {
	for {
		msg, err := h.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("host closed the stream")
			}
			h.detach(fmt.Errorf("%w: optimizer host of %q: %v", errs.ErrUnavailable, model, err))
			return
		}
		r := msg.GetResult()
		if r == nil {
			h.detach(fmt.Errorf("%w: optimizer host of %q sent %T outside a result", errs.ErrInvalid, model, msg.GetBody()))
			return
		}
		res := hostResult{id: r.StepId, model: r.GetParams().GetModel(), version: r.GetParams().GetVersion(), err: r.Error}
		if r.Error == "" {
			res.file, res.blob, err = h.recvBlob(r.GetParams().GetTotalBytes(), maxBytes)
			if err != nil {
				h.detach(fmt.Errorf("optimizer host of %q: result: %w", model, err))
				return
			}
		} else {
			// The text goes into the model's failure (logged, and in
			// every later push's error): quoted, and cut at a rune so a
			// character spanning the cut is not split into invalid UTF-8.
			res.err = errs.QuoteMax(r.Error, MaxHostErrorBytes)
		}
		select {
		case h.results <- res:
		default:
			h.detach(fmt.Errorf("%w: optimizer host of %q sent a result nobody asked for", errs.ErrInvalid, model))
			return
		}
	}
}

func (h *hostConn) recvBlob(total uint64, maxBytes int64) (*safetensors.File, []byte, error) {
	asm, err := wire.NewAssembler(total, wire.Limits{MaxBytes: maxBytes})
	if err != nil {
		return nil, nil, err
	}
	for asm.Received() < int(total) {
		msg, err := h.stream.Recv()
		if err != nil {
			return nil, nil, err
		}
		ch := msg.GetChunk()
		if ch == nil {
			return nil, nil, fmt.Errorf("%w: expected a chunk, got %T", errs.ErrInvalid, msg.GetBody())
		}
		if err := asm.Write(ch.Data); err != nil {
			return nil, nil, err
		}
	}
	return asm.Finish()
}

// externalStep has the attached host step m from version (with steps
// published so far) on the reduced gradient sum, waiting for a host and
// re-sending to the next one when a host goes away. It returns the new
// weights' blob and the weights (views of the blob), checked against the
// model's layout and finite. Called by Forward with m.stepMu held.
func (p *Primary) externalStep(ctx context.Context, m *pmodel, version, steps uint64, sum *tensor.StateDict) ([]byte, *tensor.StateDict, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, ExternalStepTimeout,
		fmt.Errorf("%w: no optimizer host stepped model %q within %v", errs.ErrUnavailable, m.cfg.Model, ExternalStepTimeout))
	defer cancel()
	layout, err := safetensors.Plan(sum, nil)
	if err != nil {
		return nil, nil, err
	}
	for {
		if ctx.Err() != nil {
			return nil, nil, context.Cause(ctx)
		}
		h, err := m.ext.current(ctx)
		if err != nil {
			return nil, nil, err
		}
		// A host that stops reading blocks Send on flow control, which
		// no context of ours interrupts: at the step's deadline the host
		// is detached, which ends its stream and so the Send.
		stopWatch := context.AfterFunc(ctx, func() {
			h.detach(fmt.Errorf("%w: optimizer host of %q did not take a step within %v", errs.ErrUnavailable, m.cfg.Model, ExternalStepTimeout))
		})
		m.ext.mu.Lock()
		m.ext.nextID++
		id := m.ext.nextID
		m.ext.mu.Unlock()
		err = h.stream.Send(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Step{Step: &rlhubv1.HostStep{
			StepId: id, Version: version, Steps: steps,
			Grad: &rlhubv1.BlobInfo{Model: m.cfg.Model, Version: version, Life: m.life, TotalBytes: uint64(layout.Size), ChunkBytes: wire.DefaultChunkBytes},
		}}})
		if err == nil {
			err = wire.Chunks(layout, wire.DefaultChunkBytes, func(b []byte) error {
				return h.stream.Send(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
			})
		}
		stopWatch()
		if err != nil {
			h.detach(fmt.Errorf("%w: sending a step to the optimizer host: %v", errs.ErrUnavailable, err))
			p.cfg.Logger.Warn("reducer: optimizer host lost while sending a step; waiting for another", "model", m.cfg.Model, "err", err)
			continue
		}
		select {
		case r := <-h.results:
			if r.id != id {
				h.detach(fmt.Errorf("%w: optimizer host answered step %d, asked %d", errs.ErrInvalid, r.id, id))
				continue
			}
			if r.err != "" {
				return nil, nil, fmt.Errorf("%w: optimizer host failed the step: %s", errs.ErrAborted, r.err)
			}
			if r.model != "" && r.model != m.cfg.Model {
				return nil, nil, fmt.Errorf("%w: optimizer host's weights are of model %s, the step is of %s", errs.ErrInvalid, errs.Quote(r.model), errs.Quote(m.cfg.Model))
			}
			if r.version != 0 && r.version != version+1 {
				return nil, nil, fmt.Errorf("%w: optimizer host's weights are of version %d, the step makes version %d", errs.ErrInvalid, r.version, version+1)
			}
			if err := reduce.CheckWeights(m.layout, r.file.Tensors); err != nil {
				return nil, nil, fmt.Errorf("optimizer host's weights: %w", err)
			}
			return r.blob, r.file.Tensors, nil
		case <-h.gone:
			if err := m.ext.ended(); err != nil {
				return nil, nil, err // detached by end or fail: no other host comes
			}
			p.cfg.Logger.Warn("reducer: optimizer host lost mid-step; the step waits for another", "model", m.cfg.Model, "err", h.err)
		case <-m.ext.stop:
			return nil, nil, m.ext.stopped()
		case <-ctx.Done():
			return nil, nil, context.Cause(ctx)
		}
	}
}

// GuardHostState decides whether a push of name, whose header names life
// (BlobInfo.life), may land in the store (storerpc Config.PushGuard):
// call release once it has. Only an optimizer host's checkpoint
// (<model>+HostStateSuffix) naming the life of the step it checkpoints
// (HostStep.grad.life, not 0) is checked: it lands only while <model> is
// of that life — registered in it, or, not registered here, in the store
// in it. A host of a model deleted in the middle of its step checkpoints
// it after the Delete: landed, it created the deleted model's host state
// again, found at the versions of the model pushed again (its host's own
// checkpoints refused as stale, a host welcomed there loading the deleted
// model's state). Refused, it changes nothing (ErrStale, naming the
// model). A push let through holds hostStateMu until released, so the
// host state's delete that follows the model's (dropHostState) comes
// after it. A store that cannot tell the model's life lets it through.
func (p *Primary) GuardHostState(ctx context.Context, name string, life uint64) (release func(), err error) {
	model, ok := strings.CutSuffix(name, HostStateSuffix)
	if !ok || life == 0 {
		return func() {}, nil
	}
	p.hostStateMu.RLock()
	p.mu.Lock()
	m := p.models[model]
	p.mu.Unlock()
	var ended bool
	if m != nil {
		ended = store.OtherLife(life, m.life)
	} else {
		now, err := p.storeLife(ctx, model) // not registered here (yet): the store's model
		ended = errors.Is(err, errs.ErrNotFound) || err == nil && store.OtherLife(life, now)
	}
	if ended {
		p.hostStateMu.RUnlock()
		return nil, fmt.Errorf("%w: optimizer host state %s: model %s was deleted after the step it checkpoints (of the model's life %d, which ended): refused",
			errs.ErrStale, errs.Quote(name), errs.Quote(model), life)
	}
	return p.hostStateMu.RUnlock, nil
}

// hostServer serves OptimizerHost.Attach for a primary.
type hostServer struct {
	rlhubv1.UnimplementedOptimizerHostServer
	p       *Primary
	drained <-chan struct{}
	wg      *sync.WaitGroup // receive loops; waited for by Service.Close
}

// registerHostServer adds the OptimizerHost service for p.
func registerHostServer(g *grpc.Server, p *Primary, drained <-chan struct{}, wg *sync.WaitGroup) {
	rlhubv1.RegisterOptimizerHostServer(g, &hostServer{p: p, drained: drained, wg: wg})
}

// Attach serves one optimizer host until its stream breaks, a newer host
// replaces it, it breaks the protocol or the hub drains.
func (hs *hostServer) Attach(stream grpc.BidiStreamingServer[rlhubv1.HostMessage, rlhubv1.PrimaryMessage]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.Model == "" || len(hello.Model) > 256 {
		return grpcerr.ToStatus(fmt.Errorf("%w: an optimizer host's first message is a Hello naming its model (1 to 256 bytes)", errs.ErrInvalid))
	}
	m, err := hs.p.model(hello.Model)
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	if m.ext == nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: model %q is registered with optimizer %q, not %q", errs.ErrInvalid, hello.Model, m.cfg.Optimizer.Kind, External))
	}
	h := &hostConn{stream: stream, results: make(chan hostResult, 1), gone: make(chan struct{})}
	// The welcome carries the version the next step applies to: a step
	// waiting for a host holds stepMu without having changed m.version.
	m.ext.mu.Lock()
	if m.ext.failed != nil {
		m.ext.mu.Unlock()
		return grpcerr.ToStatus(m.ext.failed)
	}
	m.mu.Lock()
	version := m.version
	m.mu.Unlock()
	err = stream.Send(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Welcome{Welcome: &rlhubv1.HostWelcome{Version: version}}})
	if err == nil {
		m.ext.setLocked(h)
	}
	m.ext.mu.Unlock()
	if err != nil {
		return err
	}
	hs.p.cfg.Logger.Info("reducer: optimizer host attached", "model", hello.Model, "version", version)
	maxBytes := m.plan.Size + 1<<20 // the weights plus room for another header
	hs.wg.Add(1)
	go func() { defer hs.wg.Done(); h.recvLoop(hello.Model, maxBytes) }()
	select {
	case <-h.gone:
	case <-stream.Context().Done():
		h.detach(fmt.Errorf("%w: optimizer host stream ended: %v", errs.ErrUnavailable, context.Cause(stream.Context())))
	case <-hs.drained:
		h.detach(fmt.Errorf("%w: hub draining", errs.ErrUnavailable))
	}
	m.ext.clear(h)
	hs.p.cfg.Logger.Info("reducer: optimizer host detached", "model", hello.Model, "why", h.err)
	return grpcerr.ToStatus(h.err)
}
