package reducer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Upstream is what a secondary needs of its primary: the in-process
// *Primary or a gRPC client of a remote one (Dial).
type Upstream interface {
	// Attach opens a session. done is closed when the session is lost
	// (nil: never, in process).
	Attach(ctx context.Context, s Secondary) (session uint64, done <-chan struct{}, err error)
	// Detach ends a session (its pending claims are released).
	Detach(session uint64)
	Describe(ctx context.Context, model string) (Layout, error)
	Admit(ctx context.Context, session uint64, model string, id reduce.ID, base, life uint64) (weight float32, version uint64, err error)
	// Release returns how many claims it released.
	Release(ctx context.Context, session uint64, model string, ids []reduce.ID) (int, error)
	Forward(ctx context.Context, b Batch) (version uint64, err error)
}

// SecondaryConfig configures one secondary reducer.
type SecondaryConfig struct {
	// ID names the secondary at its address; required.
	ID string
	// Addr returns the address clients reach it at; nil or "" means "the
	// address the client asked the primary at" (in-process secondaries).
	// While it returns "" for a remote primary, the secondary waits to
	// attach.
	Addr func() string
	// Upstream is the primary; required.
	Upstream Upstream
	// BatchSize is reduce_batch_size: pushes per forwarded batch; 0 means 4.
	BatchSize int
	// MaxWait is max_wait: a batch is forwarded at most this long after its
	// first push even if not full; 0 means 5ms.
	MaxWait time.Duration
	// MaxQueue is max_queue_size: gradients admitted or being received and
	// not yet forwarded. A push beyond it fails with ResourceExhausted.
	// 0 means 4×BatchSize.
	MaxQueue int
	// MaxGradBytes bounds one pushed blob; 0 means 1 GiB.
	MaxGradBytes int64
	// CloseTimeout bounds Close: the forward of the gradients held, then
	// the release of those not forwarded (a release still failing then
	// leaves its claims to the primary, which counts them lost when the
	// session ends); 0 means 5s. A hub gives its --stop-timeout.
	CloseTimeout time.Duration
	// Clock; nil means the real clock.
	Clock Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *SecondaryConfig) validate() error {
	if c.ID == "" {
		return errors.New("reducer: SecondaryConfig.ID is required")
	}
	if c.Upstream == nil {
		return errors.New("reducer: SecondaryConfig.Upstream is required")
	}
	if c.Addr == nil {
		c.Addr = func() string { return "" }
	}
	if c.BatchSize == 0 {
		c.BatchSize = 4
	}
	if c.MaxWait == 0 {
		c.MaxWait = 5 * time.Millisecond
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 4 * c.BatchSize
	}
	if c.BatchSize < 1 || c.MaxWait < 0 || c.MaxQueue < 1 {
		return fmt.Errorf("reducer: secondary %q: batch size %d, max wait %v, max queue %d must be positive", c.ID, c.BatchSize, c.MaxWait, c.MaxQueue)
	}
	if c.MaxGradBytes == 0 {
		c.MaxGradBytes = 1 << 30
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = defaultCloseTimeout
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("reducer: secondary %q: negative close timeout %v", c.ID, c.CloseTimeout)
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// SecondaryNode is one secondary reducer: it admits pushes, reduces them
// into batches and forwards each batch to the primary. Each model it has
// seen has one goroutine owning its batches; Close stops them all.
type SecondaryNode struct {
	cfg   SecondaryConfig
	flush reduce.Flush
	slots chan struct{} // the bounded queue: one token per gradient held

	// Close first closes flushing: every model loop forwards what it
	// holds (gradients acknowledged to their pushers) and says so on
	// flushed, until CloseTimeout ends closeCtx. Then it cancels ctx
	// (model loops and their forwards) and waits for wg, then cancels
	// attachCtx and waits for attachWG, so that batches are settled
	// before the session ends. Releases end with closeCtx too.
	flushing     chan struct{}
	flushed      sync.WaitGroup // one per model loop, until it has flushed or ended
	ctx          context.Context
	cancel       context.CancelFunc
	closeCtx     context.Context
	closeCancel  context.CancelFunc
	wg           sync.WaitGroup
	attachCtx    context.Context
	attachCancel context.CancelFunc
	attachWG     sync.WaitGroup

	mu       sync.Mutex
	session  uint64 // 0 while not attached
	models   map[string]*smodel
	counters reduce.Counters
	// retrying: gradients refused for a retryable reason and not seen
	// since (see settle).
	retrying map[reduce.ID]reduce.Reason
	closed   bool
}

type smodel struct {
	name   string
	layout *tensor.StateDict
	adds   chan addReq // to the owner loop
	// retire is closed when another smodel of the name replaces this one
	// (relayout): its loop forwards what it holds and ends, closing done.
	retire chan struct{}
	done   chan struct{}
}

type addReq struct {
	id   reduce.ID
	grad *tensor.StateDict
	// buf is the pooled receive buffer grad aliases. The loop owns it
	// once it has taken the request: it adopts it as its batch sum (and
	// gives it back to the pool after the forward) or adds grad into the
	// sum and gives it back at once.
	buf    []byte
	weight float32
	at     time.Time
	// sess is the session id was claimed under (Admit): a batch forwards under
	// its members' session, and never mixes two.
	sess uint64
}

// NewSecondary starts a secondary: it attaches to its primary in the
// background (retrying with backoff) and serves pushes once attached.
func NewSecondary(cfg SecondaryConfig) (*SecondaryNode, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	actx, acancel := context.WithCancel(context.Background())
	cctx, ccancel := context.WithCancel(context.Background())
	s := &SecondaryNode{cfg: cfg, flush: reduce.Flush{Size: cfg.BatchSize, MaxWait: cfg.MaxWait},
		slots: make(chan struct{}, cfg.MaxQueue), ctx: ctx, cancel: cancel, closeCtx: cctx, closeCancel: ccancel, flushing: make(chan struct{}),
		attachCtx: actx, attachCancel: acancel, models: map[string]*smodel{}, retrying: map[reduce.ID]reduce.Reason{}}
	s.attachWG.Add(1)
	go func() { defer s.attachWG.Done(); s.attachLoop() }()
	return s, nil
}

// ID returns the secondary's id.
func (s *SecondaryNode) ID() string { return s.cfg.ID }

// attachLoop keeps a session with the primary until Close.
func (s *SecondaryNode) attachLoop() {
	backoff := 10 * time.Millisecond
	for s.attachCtx.Err() == nil {
		addr := s.cfg.Addr()
		_, remote := s.cfg.Upstream.(*RemotePrimary)
		if addr == "" && remote {
			if !sleepCtx(s.attachCtx, 10*time.Millisecond) {
				return
			}
			continue
		}
		actx, cancel := context.WithTimeout(s.attachCtx, 5*time.Second)
		sess, done, err := s.cfg.Upstream.Attach(actx, Secondary{Addr: addr, ID: s.cfg.ID})
		cancel()
		if err != nil {
			s.cfg.Logger.Debug("reducer: secondary cannot attach", "id", s.cfg.ID, "err", err)
			if !sleepCtx(s.attachCtx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		s.mu.Lock()
		s.session = sess
		s.mu.Unlock()
		s.cfg.Logger.Debug("reducer: secondary attached", "id", s.cfg.ID, "session", sess)
		select {
		case <-done:
			s.cfg.Logger.Warn("reducer: secondary lost its primary session", "id", s.cfg.ID, "session", sess)
		case <-s.attachCtx.Done():
		}
		s.mu.Lock()
		s.session = 0
		s.mu.Unlock()
		s.cfg.Upstream.Detach(sess)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Attached reports whether the secondary has a live primary session.
func (s *SecondaryNode) Attached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session != 0
}

// maxRetrying bounds the gradients a secondary remembers as refused for a
// reason their clients retry. One forgotten and retried is counted pushed
// again (and its first refusal stays counted), so the identity pushed =
// applied + dropped still holds; only the count of distinct gradients is
// off.
const maxRetrying = 1 << 16

// retryable reports whether a client retries a gradient refused for r
// (back-pressure, an attempt still pending elsewhere, a secondary without
// a primary), so that its refusal is provisional.
func retryable(r reduce.Reason) bool {
	return r == reduce.ReasonFull || r == reduce.ReasonAborted || r == reduce.ReasonLost
}

// attempt counts one push attempt of id, and the gradient as pushed when
// this secondary has not seen it refused before (a retry).
func (s *SecondaryNode) attempt(id reduce.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counters.Attempts++
	if _, retry := s.retrying[id]; !retry || id.Client == "" {
		s.counters.Pushed++
	}
}

// settle gives gradient id its fate at this secondary: dropped for r, or
// admitted (r ""). A retry's earlier refusal, counted dropped
// provisionally, is taken back, so each gradient is counted once, by its
// latest fate. A retryable refusal is remembered (provisional).
func (s *SecondaryNode) settle(id reduce.ID, r reduce.Reason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.retrying[id]; ok && id.Client != "" {
		s.counters.Revive(prev, 1)
		delete(s.retrying, id)
	}
	if r == "" {
		return
	}
	s.counters.Drop(r, 1)
	if retryable(r) && id.Client != "" {
		if len(s.retrying) >= maxRetrying {
			clear(s.retrying) // forget them all: see maxRetrying
		}
		s.retrying[id] = r
	}
}

// PushHeader is what a push announces before its bytes.
type PushHeader struct {
	Model       string
	BaseVersion uint64
	// BaseLife is BaseVersion's life (store.Snapshot.Life); 0: unknown.
	BaseLife   uint64
	ID         reduce.ID
	TotalBytes uint64
}

// PushResult is a push's outcome.
type PushResult struct {
	Version uint64  // the model's version at admission
	Weight  float32 // the staleness weight
}

// Push admits one gradient, whose safetensors bytes body delivers (it is
// asked for them only once the gradient is admitted and its size is within
// the limit, so a refused push moves no bytes on the data plane). Every
// call counts one pushed gradient, and a failure counts it dropped with the
// reason matching the error.
func (s *SecondaryNode) Push(ctx context.Context, h PushHeader, body gradBody) (PushResult, error) {
	s.attempt(h.ID)
	if err := reduce.CheckClientID(h.ID.Client); err != nil {
		s.settle(h.ID, reduce.ReasonInvalid) // not retryable: nothing remembers the id
		return PushResult{}, err
	}
	s.mu.Lock()
	sess, closed := s.session, s.closed
	s.mu.Unlock()
	if closed {
		s.settle(h.ID, reduce.ReasonLost)
		return PushResult{}, fmt.Errorf("%w: secondary %q is closed", errs.ErrUnavailable, s.cfg.ID)
	}
	select {
	case s.slots <- struct{}{}:
	default:
		s.settle(h.ID, reduce.ReasonFull)
		return PushResult{}, fmt.Errorf("%w: secondary %q queue is full (%d gradients)", errs.ErrFull, s.cfg.ID, s.cfg.MaxQueue)
	}
	held := true
	defer func() {
		if held {
			<-s.slots
		}
	}()
	if sess == 0 {
		s.settle(h.ID, reduce.ReasonLost)
		return PushResult{}, fmt.Errorf("%w: secondary %q is not attached to a primary", errs.ErrUnavailable, s.cfg.ID)
	}
	if h.ID.Client == "" {
		s.settle(h.ID, reduce.ReasonInvalid)
		return PushResult{}, fmt.Errorf("%w: push without a client id", errs.ErrInvalid)
	}
	m, err := s.model(ctx, h.Model)
	if err != nil {
		s.settle(h.ID, reduce.ReasonOf(err))
		return PushResult{}, err
	}
	// Capped by what it claims to be, before it is admitted or read.
	if err := checkGradSize(h.Model, h.TotalBytes, m.layout); err != nil {
		if m = s.relayout(ctx, m); m == nil || checkGradSize(h.Model, h.TotalBytes, m.layout) != nil {
			s.settle(h.ID, reduce.ReasonInvalid)
			return PushResult{}, err
		}
	}
	weight, version, err := s.cfg.Upstream.Admit(ctx, sess, h.Model, h.ID, h.BaseVersion, h.BaseLife)
	if err != nil {
		s.settle(h.ID, reduce.ReasonOf(err))
		return PushResult{}, err
	}
	s.settle(h.ID, "") // admitted: an earlier refusal of it is taken back
	at := s.cfg.Clock.Now()
	release := func(r reduce.Reason, err error) (PushResult, error) {
		if s.release(sess, h.Model, []reduce.ID{h.ID}) > 0 {
			s.settle(h.ID, r)
		}
		return PushResult{}, err
	}
	// The NaN/Inf scan runs piece by piece while the bytes arrive.
	g, buf, clean, err := receiveGradient(h.TotalBytes, s.cfg.MaxGradBytes, true, body)
	if err != nil {
		r := reduce.ReasonAborted
		if errors.Is(err, errs.ErrInvalid) || errors.Is(err, errs.ErrFull) {
			r = reduce.ReasonInvalid
		}
		return release(r, err)
	}
	owned := true // buf is ours to give back (until the loop takes it)
	defer func() {
		if owned {
			putBuf(buf)
		}
	}()
	checkErr := reduce.CheckLayout(m.layout, g)
	if checkErr != nil {
		if nm := s.relayout(ctx, m); nm != nil && reduce.CheckLayout(nm.layout, g) == nil {
			m, checkErr = nm, nil // admitted by the primary for the model of the new layout
		}
	}
	nonFinite := false
	if checkErr == nil && !clean {
		nonFinite, checkErr = reduce.CheckGradient(m.layout, g)
	}
	if checkErr != nil {
		r := reduce.ReasonInvalid
		if nonFinite {
			r = reduce.ReasonNonFinite
		}
		return release(r, checkErr)
	}
	// Once the loop has taken it, the gradient is in the batch (the add
	// cannot fail) and buf is the loop's: the push returns without
	// waiting for the add, which is then off the pusher's path.
	a := addReq{id: h.ID, grad: g, buf: buf, weight: weight, at: at, sess: sess}
	select {
	case m.adds <- a:
		owned = false
	case <-m.done: // replaced since (relayout): its layout is no longer the model's
		return release(reduce.ReasonInvalid, fmt.Errorf("%w: model %s changed its layout while the gradient was received (deleted and registered again): push a gradient of the new model", errs.ErrInvalid, errs.Quote(h.Model)))
	case <-ctx.Done():
		return release(reduce.ReasonAborted, ctx.Err())
	case <-s.ctx.Done():
		return release(reduce.ReasonLost, fmt.Errorf("%w: secondary %q is closing", errs.ErrUnavailable, s.cfg.ID))
	}
	held = false // the slot now belongs to the batch
	return PushResult{Version: version, Weight: weight}, nil
}

// model returns the model's state, fetching its layout from the primary and
// starting its loop on first use.
func (s *SecondaryNode) model(ctx context.Context, name string) (*smodel, error) {
	s.mu.Lock()
	m := s.models[name]
	s.mu.Unlock()
	if m != nil {
		return m, nil
	}
	l, err := s.cfg.Upstream.Describe(ctx, name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.models[name]; m != nil {
		return m, nil
	}
	if s.closed {
		return nil, fmt.Errorf("%w: secondary %q is closed", errs.ErrUnavailable, s.cfg.ID)
	}
	return s.startModelLocked(name, l.Tensors), nil
}

// startModelLocked makes an smodel of name with layout the model's and
// starts its loop; s.mu held, s.closed false.
func (s *SecondaryNode) startModelLocked(name string, layout *tensor.StateDict) *smodel {
	m := &smodel{name: name, layout: layout, adds: make(chan addReq), retire: make(chan struct{}), done: make(chan struct{})}
	s.models[name] = m
	s.wg.Add(1)
	s.flushed.Add(1) // under s.mu, with closed false: before Close waits
	go func() { defer s.wg.Done(); defer close(m.done); s.loop(m) }()
	return m
}

// relayout is called when a gradient does not match m's layout: the model
// may have been deleted and registered again with another (the layout is
// read once per model name). It reads the layout from the primary again,
// and when it differs from m's, replaces m with an smodel of the new one
// (m's loop forwards what it holds, which the primary refuses, and ends)
// and returns that. nil when the layout is unchanged or cannot be read:
// the gradient is the one that does not match.
func (s *SecondaryNode) relayout(ctx context.Context, m *smodel) *smodel {
	l, err := s.cfg.Upstream.Describe(ctx, m.name)
	if err != nil || l.Tensors.CheckLayout(m.layout) == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if cur := s.models[m.name]; cur != m {
		return cur // replaced by another push already
	}
	s.cfg.Logger.Info("reducer: a model's layout changed (deleted and registered again); the secondary takes the new one",
		"secondary", s.cfg.ID, "model", m.name)
	close(m.retire)
	return s.startModelLocked(m.name, l.Tensors)
}

// sbatch is a batch and the pooled receive buffer of the gradient it
// adopted as its sum (nil when it adds into its own buffer).
type sbatch struct {
	*reduce.Batch
	buf  []byte
	sess uint64 // the session its members were claimed under
}

// reset empties the batch and gives its adopted buffer back to the pool:
// nothing reads the sum any more (its forward has returned).
func (b *sbatch) reset() {
	if b.Reset() {
		putBuf(b.buf)
	}
	b.buf = nil
}

type fwdResult struct {
	b    *sbatch
	sess uint64
	err  error
}

// loop owns m's batches: the one filling (cur) and at most one being
// forwarded. When the secondary begins to close (flushing) it forwards
// what it holds without waiting for the batch to fill, and says so
// (flushed) once nothing is held; it ends when the secondary's context
// ends, after its forward returns: gradients still in cur then (a flush
// that did not finish in time) are released and counted lost.
//
// The first gradient of a batch is adopted as its sum (its receive buffer
// becomes the batch's, no copy); later ones are added into it.
func (s *SecondaryNode) loop(m *smodel) {
	flushedOnce := sync.OnceFunc(s.flushed.Done)
	defer flushedOnce()
	flushing, draining := s.flushing, false
	retire, retired := m.retire, false
	cur := &sbatch{Batch: reduce.NewBatch(m.layout)}
	var spare *sbatch
	inflight := false
	fwdDone := make(chan fwdResult, 1)
	var timerC <-chan time.Time
	stopTimer := func() {}
	start := func() {
		stopTimer()
		timerC, stopTimer = nil, func() {}
		b := cur
		if spare != nil {
			cur, spare = spare, nil
		} else {
			cur = &sbatch{Batch: reduce.NewBatch(m.layout)}
		}
		inflight = true
		sess := b.sess
		go func() { // waited for: the loop does not return while inflight
			// The members were checked finite on receipt and the
			// batch's adds check that their sums did not overflow.
			_, err := s.cfg.Upstream.Forward(s.ctx, Batch{Session: sess, Model: m.name,
				Members: b.Members(), Weights: b.Weights(), Sum: b.Sum(), FirstAdmitted: b.First(),
				SumFinite: b.SumFinite()})
			fwdDone <- fwdResult{b, sess, err}
		}()
	}
	finish := func(r fwdResult) {
		inflight = false
		n := r.b.Len()
		if r.err != nil {
			reason := reduce.ReasonLost
			if errors.Is(r.err, errs.ErrInvalid) {
				reason = reduce.ReasonNonFinite // members were checked: only an overflowing sum is invalid
			}
			s.cfg.Logger.Warn("reducer: forward failed", "secondary", s.cfg.ID, "model", m.name, "gradients", n, "err", r.err)
			s.releaseAndCount(r.sess, m.name, r.b.Members(), reason)
		} else {
			s.mu.Lock()
			s.counters.Reduced += uint64(n)
			s.mu.Unlock()
		}
		for range n {
			<-s.slots
		}
		r.b.reset()
		spare = r.b
	}
	for {
		if draining && !inflight {
			if cur.Len() > 0 {
				start() // closing: what is held goes now, full or not
			} else if flushedOnce(); retired {
				return // replaced: nothing held, nothing in flight
			}
		}
		adds := m.adds
		if cur.Len() >= s.flush.Size { // full and waiting for the forward
			adds = nil
		}
		select {
		case a := <-adds:
			if cur.Len() > 0 && cur.sess != a.sess {
				// cur's session ended (the primary released its claims and
				// counted them lost): forwarded with a's, it would be
				// refused whole and take a's gradients down with it.
				s.releaseAndCount(cur.sess, m.name, cur.Members(), reduce.ReasonLost)
				for range cur.Len() {
					<-s.slots
				}
				stopTimer()
				timerC, stopTimer = nil, func() {}
				cur.reset()
			}
			adopted := cur.Len() == 0
			cur.sess = a.sess
			if adopted {
				cur.Adopt(a.id, a.grad, a.weight, a.at)
				cur.buf = a.buf
			} else {
				cur.Add(a.id, a.grad, a.weight, a.at)
				putBuf(a.buf) // nothing reads grad any more
			}
			if cur.Len() == 1 {
				d, _ := s.flush.Deadline(cur.Batch)
				timerC, stopTimer = s.cfg.Clock.At(d)
			}
			if !inflight && s.flush.Due(cur.Batch, s.cfg.Clock.Now()) {
				start()
			}
		case <-timerC:
			timerC = nil
			if !inflight && cur.Len() > 0 {
				start()
			}
		case r := <-fwdDone:
			finish(r)
			if cur.Len() > 0 && s.flush.Due(cur.Batch, s.cfg.Clock.Now()) {
				start()
			}
		case <-flushing:
			flushing, draining = nil, true
		case <-retire:
			retire, retired, draining = nil, true, true
		case <-s.ctx.Done():
			stopTimer()
			if inflight {
				finish(<-fwdDone)
			}
			if n := cur.Len(); n > 0 {
				s.releaseAndCount(cur.sess, m.name, cur.Members(), reduce.ReasonLost)
				for range n {
					<-s.slots
				}
			}
			cur.reset()
			return
		}
	}
}

// releaseAndCount gives back session's claims on ids that will not be
// applied and counts the ones released as dropped for r. Claims it cannot
// release were already released and counted lost by the primary when the
// session ended; counting them here too would count them twice.
func (s *SecondaryNode) releaseAndCount(session uint64, model string, ids []reduce.ID, r reduce.Reason) {
	if n := s.release(session, model, ids); n > 0 {
		s.mu.Lock()
		s.counters.Drop(r, uint64(n))
		s.mu.Unlock()
	}
}

// release gives back session's claims on ids and returns how many it
// released.
//
// A failed Release is tried again, within 5 s (and within Close's
// bound): a claim left pending under a live session is counted nowhere,
// and every retry of its gradient is refused Aborted ("being reduced by
// another attempt") until the session ends. One that still fails is
// logged as such.
func (s *SecondaryNode) release(session uint64, model string, ids []reduce.ID) int {
	if session == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(s.closeCtx, 5*time.Second)
	defer cancel()
	pause := 50 * time.Millisecond
	for {
		n, err := s.cfg.Upstream.Release(ctx, session, model, ids)
		if err == nil {
			return n
		}
		if errs.Permanent(err) || !sleepCtx(ctx, pause) {
			s.cfg.Logger.Error("reducer: release failed: the claims stay pending (their gradients are refused Aborted) until the session ends",
				"secondary", s.cfg.ID, "model", model, "gradients", len(ids), "err", err)
			return 0
		}
		pause = min(2*pause, time.Second)
	}
}

// SecondaryStats is what SecondaryNode.Stats reports.
type SecondaryStats struct {
	// ID of the secondary at its hub.
	ID string
	// Counters: pushed, reduced (forwarded and applied) and the drops
	// this secondary decided.
	Counters reduce.Counters
	// QueueDepth: gradients admitted or being received and not yet
	// settled by a forward.
	QueueDepth int
}

// Stats returns the secondary's counters and its queue depth.
func (s *SecondaryNode) Stats() SecondaryStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SecondaryStats{ID: s.cfg.ID, Counters: s.counters.Clone(), QueueDepth: len(s.slots)}
}

// defaultCloseTimeout is SecondaryConfig.CloseTimeout's default.
const defaultCloseTimeout = 5 * time.Second

// Close stops taking pushes, has every model loop forward the gradients
// it holds (acknowledged to their pushers: a graceful stop must not lose
// them), ends the loops (gradients still not forwarded are released and
// counted lost), detaches and waits for all its goroutines, within
// CloseTimeout. Safe to call twice.
func (s *SecondaryNode) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	s.mu.Unlock()
	if first {
		bound := time.AfterFunc(s.cfg.CloseTimeout, s.closeCancel)
		defer bound.Stop()
		close(s.flushing)
		flushed := make(chan struct{})
		s.wg.Go(func() { s.flushed.Wait(); close(flushed) }) // ends with the loops at the latest
		select {
		case <-flushed:
		case <-s.closeCtx.Done():
			s.cfg.Logger.Warn("reducer: secondary closing: gradients not forwarded within the bound are counted lost", "secondary", s.cfg.ID, "after", s.cfg.CloseTimeout)
		}
	}
	s.cancel()
	s.wg.Wait()
	s.closeCancel()
	s.attachCancel()
	s.attachWG.Wait()
	return nil
}
