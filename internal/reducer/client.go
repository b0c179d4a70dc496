package reducer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// ClientConfig configures a reducer client.
type ClientConfig struct {
	// Hub is the address of the hub hosting the primary; required. A
	// cluster target ("h1,h2" or "etcd://E/NAME", internal/dial) follows
	// the cluster's primary: a push refused by a standby is sent again to
	// the primary, and a push whose outcome is unknown (the connection
	// died after it was sent) is never sent to a different primary than
	// the one that may have applied it: it fails with ErrOutcomeUnknown
	// and is counted in Unknown (at most once: the caller counts it lost).
	Hub string
	// Dial is how to connect (TLS, token); the zero value is plaintext.
	Dial dial.Config
	// ClientID names this client in (client id, seq); "" means a random id.
	ClientID string
	// Rand picks secondaries and jitters back-off; nil means a random seed.
	Rand *rand.Rand
	// MaxAttempts bounds tries per push (failover, full queues, a retry
	// still being reduced elsewhere); 0 means until ctx ends.
	MaxAttempts int
	// Backoff is the first back-off after ResourceExhausted or Aborted;
	// 0 means 1ms (doubling to 100ms, jittered).
	Backoff time.Duration
	// Transport carries the gradient bytes: TransportAuto (the default)
	// uses the hub's data plane (package bulk: plain TCP on the same
	// port) and gRPC for a hub that does not speak it; TransportGRPC
	// always uses gRPC. Both give the same checks, counters and errors.
	Transport string
	// RefreshEvery: the list of live secondaries is asked of the primary
	// again when it is older than this, so secondaries that start or
	// restart (at a new address) get pushes from clients already running,
	// not only after a failure. 0 means 2s; negative refreshes only on a
	// failure.
	RefreshEvery time.Duration
	// Etcd (set by NewClient from an etcd:// Hub) is not configured here:
	// with one, secondaries announced in etcd (`serve --role reducer
	// --etcd`) are learnt from an etcd watch as they start, and dropped as
	// soon as their announcement goes (withdrawn, or its lease expired),
	// even between refreshes from the primary (docs/cluster.md,
	// Deployment). Dial.Etcd is how etcd is reached.
	//
	// ReconnectWindow bounds how long a push keeps retrying while no
	// secondary (nor the primary hub, to list them) takes it: a hub being
	// restarted is ridden out within the window, then the push fails with
	// the last Unavailable error. 0 means until the push's context ends.
	ReconnectWindow time.Duration
	// CallTimeout bounds a push whose context has no deadline (a caller
	// passing context.Background()): a hub that accepts connections and
	// never answers would otherwise be retried forever. The push then
	// fails with context.DeadlineExceeded joined with the last error. 0
	// means 2 minutes (the Python client's deadline).
	CallTimeout time.Duration
}

// DefaultCallTimeout is ClientConfig.CallTimeout's default.
const DefaultCallTimeout = 2 * time.Minute

// Transports for ClientConfig.Transport.
const (
	TransportAuto = ""
	TransportGRPC = "grpc"
)

// Client pushes gradients to a random live secondary, failing over to
// another on Unavailable. Safe for concurrent use.
type Client struct {
	cfg ClientConfig
	seq atomic.Uint64

	bulk *bulk.Client // nil with TransportGRPC

	mu        sync.Mutex // guards rnd, conns, targets, refreshed
	rnd       *rand.Rand
	hub       *grpc.ClientConn
	conns     map[string]*grpc.ClientConn
	targets   []target
	dead      map[target]time.Time
	refreshed time.Time // when targets were last listed
	// refreshing is set while one push refreshes a stale list (the
	// others carry on with the old one).
	refreshing atomic.Bool
	unknown    atomic.Uint64

	// From the etcd watch (an etcd:// Hub), under mu: the announced
	// targets, and the addresses whose announcement went (skipped even if
	// the primary still lists them, until announced again).
	announced []target
	withdrawn map[string]bool
	etcd      *cluster.Reader
	stopWatch context.CancelFunc
	watchWG   sync.WaitGroup
	watchOnce sync.Once

	// closing is done once Close is called: it ends the pushes in
	// flight, which otherwise retry until their ctx ends.
	closing context.Context
	stopAll context.CancelFunc
}

type target struct{ addr, id string }

// ErrOutcomeUnknown: a push's connection broke after it was sent and the
// primary changed before it could be asked again; it may or may not have
// been applied, and it is not sent again (at most once). Matches
// errs.ErrUnavailable.
var ErrOutcomeUnknown = fmt.Errorf("%w: reducer: the push's outcome is unknown (the primary changed): counted lost, not resent", errs.ErrUnavailable)

// Unknown counts the pushes that failed with ErrOutcomeUnknown.
func (c *Client) Unknown() uint64 { return c.unknown.Load() }

// NewClient connects (lazily) to the hub.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Hub == "" {
		return nil, errors.New("reducer: ClientConfig.Hub is required")
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if cfg.ClientID == "" {
		cfg.ClientID = fmt.Sprintf("c%016x", cfg.Rand.Uint64())
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	if cfg.RefreshEvery == 0 {
		cfg.RefreshEvery = 2 * time.Second
	}
	if cfg.ReconnectWindow < 0 {
		return nil, fmt.Errorf("%w: reducer: negative ReconnectWindow %v", errs.ErrInvalid, cfg.ReconnectWindow)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.CallTimeout < 0 {
		return nil, fmt.Errorf("%w: reducer: negative CallTimeout %v", errs.ErrInvalid, cfg.CallTimeout)
	}
	c := &Client{cfg: cfg, rnd: cfg.Rand, conns: map[string]*grpc.ClientConn{}, dead: map[target]time.Time{}}
	c.closing, c.stopAll = context.WithCancel(context.Background())
	switch cfg.Transport {
	case TransportAuto:
		c.bulk = cfg.Dial.Bulk()
	case TransportGRPC:
	default:
		return nil, fmt.Errorf("%w: reducer: ClientConfig.Transport %q (want %q or %q)", errs.ErrInvalid, cfg.Transport, TransportAuto, TransportGRPC)
	}
	conn, err := c.dial(cfg.Hub)
	if err != nil {
		return nil, err
	}
	c.hub = conn
	if t, err := dial.ParseTarget(cfg.Hub); err == nil && len(t.Etcd) > 0 {
		r, err := cluster.OpenReader(cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, DialTimeout: dial.DefaultResolveTimeout, Security: cfg.Dial.Etcd})
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("reducer: %w", err)
		}
		c.etcd, c.withdrawn = r, map[string]bool{}
		var ctx context.Context
		ctx, c.stopWatch = context.WithCancel(context.Background())
		c.watchWG.Add(1)
		go func() {
			defer c.watchWG.Done()
			_ = r.WatchServices(ctx, cluster.KindSecondary, c.onAnnounced)
		}()
	}
	return c, nil
}

// onAnnounced takes the etcd watch's list of announced secondaries.
func (c *Client) onAnnounced(ss []cluster.ServiceInfo) {
	var ts []target
	now := map[string]bool{}
	for _, s := range ss {
		now[s.Addr] = true
		for _, id := range s.Secondaries {
			ts = append(ts, target{s.Addr, id})
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.announced {
		if !now[t.addr] {
			c.withdrawn[t.addr] = true
		}
	}
	for a := range now {
		delete(c.withdrawn, a)
	}
	c.announced = ts
}

// candidates are the targets to pick from, under mu: the primary's list
// and the announced ones, without the withdrawn.
func (c *Client) candidates() []target {
	seen := map[target]bool{}
	var out []target
	for _, list := range [][]target{c.targets, c.announced} {
		for _, t := range list {
			if !seen[t] && !c.withdrawn[t.addr] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// Known lists the secondaries a push would pick from now (the primary's
// last list, and with an etcd:// Hub the announced ones, less those whose
// announcement went), without asking anyone.
func (c *Client) Known() []Secondary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Secondary
	for _, t := range c.candidates() {
		out = append(out, Secondary{Addr: t.addr, ID: t.id})
	}
	return out
}

// reconnectParams: a hub that restarts is back within a second or two, so
// reconnect attempts start at 50ms and back off to 1s (gRPC's defaults, 1s
// to 120s, would leave a client idle long after the hub is back).
var reconnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

func (c *Client) dial(addr string) (*grpc.ClientConn, error) {
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	// Gradients are large: bigger write buffers and windows than gRPC's
	// defaults (32 KiB, 64 KiB) cut the frames and window updates per MiB.
	conn, err := c.cfg.Dial.GRPC(addr, grpc.WithWriteBufferSize(1<<20), grpc.WithReadBufferSize(1<<20),
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(16<<20),
		grpc.WithConnectParams(reconnectParams))
	if err != nil {
		return nil, fmt.Errorf("reducer: dial %s: %w", addr, err)
	}
	c.conns[addr] = conn
	return conn, nil
}

// ID returns the client id.
func (c *Client) ID() string { return c.cfg.ClientID }

// errClosed is a push's error once Close was called.
var errClosed = fmt.Errorf("%w: reducer: the client is closed", errs.ErrUnavailable)

// Close ends the pushes in flight (they fail with errs.ErrUnavailable),
// stops the etcd watch and closes every connection.
func (c *Client) Close() error {
	c.stopAll()
	c.watchOnce.Do(func() {
		if c.stopWatch != nil {
			c.stopWatch()
			c.watchWG.Wait()
			_ = c.etcd.Close()
		}
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []error
	if c.bulk != nil {
		out = append(out, c.bulk.Close())
	}
	for _, conn := range c.conns {
		out = append(out, conn.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(out...)
}

// Register registers a model with the primary (see ModelConfig).
func (c *Client) Register(ctx context.Context, mc ModelConfig) (version, restored uint64, err error) {
	resp, err := rlhubv1.NewReducerClient(c.hub).Register(ctx, ModelConfigToProto(mc))
	if err != nil {
		return 0, 0, grpcerr.FromStatus(err)
	}
	return resp.GetVersion(), resp.GetRestoredSteps(), nil
}

// HubStats is Stats converted to the Go form Service.Stats returns.
func (c *Client) HubStats(ctx context.Context, addr string) (Stats, error) {
	resp, err := c.Stats(ctx, addr)
	if err != nil {
		return Stats{}, err
	}
	return StatsFromProto(resp), nil
}

// Stats fetches the counters of the hub at addr ("" means the primary hub).
func (c *Client) Stats(ctx context.Context, addr string) (*rlhubv1.ReducerStatsResponse, error) {
	conn := c.hub
	if addr != "" {
		c.mu.Lock()
		var err error
		conn, err = c.dial(addr)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	resp, err := rlhubv1.NewReducerClient(conn).Stats(ctx, &rlhubv1.ReducerStatsRequest{})
	return resp, grpcerr.FromStatus(err)
}

// refresh asks the primary for the live secondaries.
func (c *Client) refresh(ctx context.Context) error {
	resp, err := rlhubv1.NewReducerClient(c.hub).Secondaries(ctx, &rlhubv1.ReducerSecondariesRequest{})
	if err != nil {
		return grpcerr.FromStatus(err)
	}
	var ts []target
	for _, s := range resp.GetSecondaries() {
		addr := s.GetAddr()
		if addr == "" { // the primary hub's own secondary
			addr = c.hubAddr()
		}
		ts = append(ts, target{addr, s.GetId()})
	}
	c.mu.Lock()
	c.targets, c.refreshed = ts, time.Now()
	c.mu.Unlock()
	return nil
}

// hubAddr is the address of the primary's hub now: Hub itself, or the
// primary a cluster target follows.
func (c *Client) hubAddr() string {
	if p, ok := dial.CurrentPrimary(c.hub); ok {
		return p.Addr
	}
	return c.cfg.Hub
}

// epoch is the primary's term as the hub connection sees it (0 for a
// plain address).
func (c *Client) epoch() uint64 {
	p, _ := dial.CurrentPrimary(c.hub)
	return p.Epoch
}

// maybeRefresh refreshes the list when it is older than RefreshEvery; one
// caller at a time does, the others go on with the list they have. A
// failed refresh keeps the old list.
func (c *Client) maybeRefresh(ctx context.Context) {
	if c.cfg.RefreshEvery < 0 {
		return
	}
	c.mu.Lock()
	stale := !c.refreshed.IsZero() && time.Since(c.refreshed) > c.cfg.RefreshEvery
	c.mu.Unlock()
	if !stale || !c.refreshing.CompareAndSwap(false, true) {
		return
	}
	defer c.refreshing.Store(false)
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := c.refresh(rctx); err != nil {
		c.mu.Lock()
		c.refreshed = time.Now() // try again in RefreshEvery, not on every push
		c.mu.Unlock()
	}
}

// choose picks a random target not marked dead in the last second (any
// listed target with anyListed: when the primary, asked just now, lists
// only targets marked dead, such as a hub's own secondary after the hub
// restarted, trying one beats waiting out the mark), nor at an address in
// skip.
func (c *Client) choose(anyListed bool, skip map[string]error) (target, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.live(anyListed, skip)
	if len(live) == 0 {
		return target{}, false
	}
	return live[c.rnd.IntN(len(live))], true
}

// live lists the targets choose picks from; c.mu held.
func (c *Client) live(anyListed bool, skip map[string]error) []target {
	var live []target
	for _, t := range c.candidates() {
		if _, skipped := skip[t.addr]; skipped {
			continue
		}
		if at, ok := c.dead[t]; !ok || time.Since(at) > time.Second || anyListed {
			live = append(live, t)
		}
	}
	return live
}

// anyLive reports whether a target not marked dead is left.
func (c *Client) anyLive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live(false, nil)) > 0
}

// listed reports whether any target is listed or announced.
func (c *Client) listed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.candidates()) > 0
}

// Receipt is what a successful client push returns.
type Receipt struct {
	Version uint64  // model version at admission
	Weight  float32 // staleness weight
	Seq     uint64  // the sequence number used
	Addr    string  // secondary address and id that took it
	ID      string
}

// PushGrad pushes grads (computed on baseVersion of model) with the next
// sequence number, retrying the same (client id, seq) on other secondaries
// when one is Unavailable, and backing off on ResourceExhausted or Aborted.
// An ALREADY_EXISTS answer to a retry means an earlier attempt got through:
// it is returned as an error matching errs.ErrExists. grads' bytes are
// handed to the transport without a copy: they must not change until
// PushGrad returns.
func (c *Client) PushGrad(ctx context.Context, model string, baseVersion uint64, grads *tensor.StateDict) (Receipt, error) {
	return c.PushLife(ctx, model, baseVersion, 0, c.seq.Add(1), grads)
}

// PushGradLife is PushGrad naming the life of baseVersion as pulled
// (store.Snapshot.Life; 0: unknown): if the model was deleted and pushed
// again since, the gradient is refused (errs.ErrStale) rather than applied
// to the new model, even at the same version.
func (c *Client) PushGradLife(ctx context.Context, model string, baseVersion, life uint64, grads *tensor.StateDict) (Receipt, error) {
	return c.PushLife(ctx, model, baseVersion, life, c.seq.Add(1), grads)
}

// PushSeq is PushGrad with an explicit sequence number.
func (c *Client) PushSeq(ctx context.Context, model string, baseVersion, seq uint64, grads *tensor.StateDict) (Receipt, error) {
	return c.PushLife(ctx, model, baseVersion, 0, seq, grads)
}

// PushLife is PushGradLife with an explicit sequence number.
func (c *Client) PushLife(ctx context.Context, model string, baseVersion, life, seq uint64, grads *tensor.StateDict) (Receipt, error) {
	ctx, stop := dial.CallContext(ctx, c.closing, c.cfg.CallTimeout)
	defer stop()
	r, err := c.pushSeq(ctx, model, baseVersion, life, seq, grads)
	if err != nil && c.closing.Err() != nil {
		return Receipt{}, errClosed
	}
	if err != nil && dial.CallTimedOut(ctx, err) {
		err = fmt.Errorf("reducer: push of %s via hub %s: not taken within CallTimeout %v (the context had no deadline): %w", errs.Quote(model), c.cfg.Hub, c.cfg.CallTimeout, err)
	}
	return r, err
}

// pushSeq is PushSeq under ctx, which Close also ends.
func (c *Client) pushSeq(ctx context.Context, model string, baseVersion, life, seq uint64, grads *tensor.StateDict) (Receipt, error) {
	if grads == nil {
		return Receipt{}, fmt.Errorf("%w: reducer: push to %s: no gradient (nil)", errs.ErrInvalid, errs.Quote(model))
	}
	l, err := safetensors.Plan(grads, nil)
	if err != nil {
		return Receipt{}, err
	}
	backoff := c.cfg.Backoff
	var last error
	var unreachableSince time.Time // first of the current run of unavailable answers
	var stick target               // where the last attempt was refused for back-pressure
	sticky := false
	c.maybeRefresh(ctx)
	var epoch uint64               // the primary the attempt whose outcome is unknown was for
	var unanswered bulk.Unanswered // data-plane connects or handshakes left unanswered, by address
	// Addresses not chosen again in this push (bulk.NoAnswerTries
	// unanswered), with the error that ends it when no other is listed;
	// lastSilent is the latest of them.
	silent := map[string]error{}
	var lastSilent string
	unknown := false // an attempt may have been applied
	for attempt := 1; ; attempt++ {
		if unknown && c.epoch() != epoch {
			c.unknown.Add(1)
			return Receipt{}, fmt.Errorf("%w (epoch %d, now %d): %v", ErrOutcomeUnknown, epoch, c.epoch(), last)
		}
		if c.cfg.MaxAttempts > 0 && attempt > c.cfg.MaxAttempts {
			return Receipt{}, last
		}
		if err := ctx.Err(); err != nil {
			return Receipt{}, errors.Join(err, last)
		}
		if w := c.cfg.ReconnectWindow; w > 0 && !unreachableSince.IsZero() && time.Since(unreachableSince) > w {
			return Receipt{}, fmt.Errorf("reducer: no secondary reachable for %v: %w", w, last)
		}
		t, ok := c.choose(false, silent)
		if sticky {
			// A gradient refused for back-pressure is retried where it
			// was refused: that secondary counts it once (docs/reducer.md,
			// Counters), and its queue drains first anyway.
			t, ok = stick, true
		}
		if !ok {
			if unreachableSince.IsZero() {
				unreachableSince = time.Now()
			}
			if err := c.refresh(ctx); err != nil {
				if grpcerr.Permanent(err) {
					return Receipt{}, err // refused (credentials, request): a retry cannot change it
				}
				last = err
				if !sleepCtx(ctx, backoff) {
					return Receipt{}, errors.Join(ctx.Err(), last)
				}
				backoff = min(2*backoff, 100*time.Millisecond)
				continue
			}
			if t, ok = c.choose(true, silent); !ok {
				if len(silent) > 0 && c.listed() {
					// Every secondary the primary lists now left this
					// push's connects or handshakes unanswered twice.
					return Receipt{}, silent[lastSilent]
				}
				last = fmt.Errorf("%w: no live secondary", errs.ErrUnavailable)
				if !sleepCtx(ctx, backoff) {
					return Receipt{}, errors.Join(ctx.Err(), last)
				}
				backoff = min(2*backoff, 100*time.Millisecond)
				continue
			}
		}
		sticky = false
		if !unknown {
			// Read before each attempt, not once per push: a fresh client's
			// connection learns the primary only with its first refresh,
			// and the primary may change between attempts that all failed
			// before sending; only an attempt that may have landed pins it.
			epoch = c.epoch()
		}
		// An attempt in flight when the primary moves to another hub ends
		// then (a *dial.PrimaryMovedError, Unavailable): its outcome is
		// unknown, and the epoch check above says so at once, rather than
		// after the push's deadline on a machine that may have died.
		actx, attemptDone := dial.PlaneContext(c.hub, ctx)
		res, err := c.pushOnce(actx, t, model, baseVersion, life, seq, l)
		err = attemptDone(err)
		if err == nil {
			res.Seq, res.Addr, res.ID = seq, t.addr, t.id
			return res, nil
		}
		if gerr := unanswered.GiveUp(err); gerr != nil {
			// A secondary's hub silent for a whole data-plane connect or
			// handshake, twice: it will not answer a third time (bulk.
			// NoAnswerTries), and retrying it spent the whole CallTimeout.
			// The push goes on with another listed secondary, and ends with
			// gerr once none is left (as the Python client does).
			silent[t.addr], lastSilent = gerr, t.addr
		}
		last = err
		switch {
		case isRefusal(err):
			// A standby: not applied. Follow the primary it names.
			if p, ok := dial.Refusal(err, nil); ok {
				dial.Offer(c.hub, p)
			}
			c.mu.Lock()
			c.dead[t] = time.Now()
			c.mu.Unlock()
			_ = c.refresh(ctx)
			if !sleepCtx(ctx, backoff) {
				return Receipt{}, errors.Join(ctx.Err(), last)
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		case errors.Is(err, errs.ErrUnavailable) || isConnErr(err):
			if !sentNothing(err) {
				unknown = true // it may have reached the secondary
			}
			if unreachableSince.IsZero() {
				unreachableSince = time.Now()
			}
			c.mu.Lock()
			c.dead[t] = time.Now()
			c.mu.Unlock()
			_ = c.refresh(ctx) // best effort: the next choose skips the dead one
			if !c.anyLive() {
				// Every listed secondary is marked dead: the next try is
				// one of them at once (choose(true)), a spin against it and
				// the primary's listing without this pause.
				jit := time.Duration(c.jitter() * float64(backoff))
				if !sleepCtx(ctx, backoff/2+jit/2) {
					return Receipt{}, errors.Join(ctx.Err(), last)
				}
				backoff = min(2*backoff, 100*time.Millisecond)
			}
		case errors.Is(err, errs.ErrFull) || errors.Is(err, errs.ErrAborted):
			unreachableSince = time.Time{}
			stick, sticky = t, true
			jit := time.Duration(c.jitter() * float64(backoff))
			if !sleepCtx(ctx, backoff/2+jit/2) {
				return Receipt{}, errors.Join(ctx.Err(), last)
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		default:
			return Receipt{}, err
		}
	}
}

func (c *Client) jitter() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rnd.Float64()
}

func isConnErr(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne)
}

// sentNothing: nothing of the push was sent, so it was not applied: a
// gRPC connection never made, a gRPC push stream that did not open (the
// push's messages go only on an open stream), or a data-plane call that
// failed before its request went out (bulk.ErrNothingSent: a connect, TLS
// handshake or hello that failed or got no answer).
func sentNothing(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && ne.Op == "dial" || errors.Is(err, bulk.ErrNothingSent) || errors.As(err, new(notOpened))
}

// notOpened is a gRPC push whose stream did not open (sentNothing).
type notOpened struct{ err error }

func (e notOpened) Error() string { return e.err.Error() }
func (e notOpened) Unwrap() error { return e.err }

// isRefusal: a standby refused the push (gRPC or the data plane's error
// frame, which carries the same text).
func isRefusal(err error) bool {
	if _, ok := dial.Refusal(err, nil); ok {
		return true
	}
	_, ok := dial.RefusalText(err.Error())
	return ok
}

func (c *Client) pushOnce(ctx context.Context, t target, model string, base, life, seq uint64, l *safetensors.Layout) (Receipt, error) {
	hdr := &rlhubv1.ReducerPushHeader{Blob: &rlhubv1.BlobInfo{Model: model, Version: base, Life: life, TotalBytes: uint64(l.Size), ChunkBytes: 1 << 20},
		ClientId: c.cfg.ClientID, Seq: seq, Secondary: t.id}
	if c.bulk != nil && c.bulk.Supported(t.addr) {
		// The data plane: the header, then (if the secondary admits the
		// gradient) the safetensors header and the tensors' own memory
		// in one writev.
		var resp rlhubv1.ReducerPushResponse
		err := c.bulk.Call(ctx, t.addr, BulkPushMethod, hdr, net.Buffers(l.Buffers()), &resp)
		if !errors.Is(err, bulk.ErrNotSupported) {
			if err != nil {
				return Receipt{}, err
			}
			return Receipt{Version: resp.GetVersion(), Weight: resp.GetWeight()}, nil
		}
	}
	c.mu.Lock()
	conn, err := c.dial(t.addr)
	c.mu.Unlock()
	if err != nil {
		return Receipt{}, err
	}
	// The chunk codec hands each chunk (a slice of the caller's tensors)
	// to the transport without a marshal copy.
	stream, err := rlhubv1.NewReducerClient(conn).Push(ctx, grpc.CallContentSubtype(chunkcodec.Name))
	if err != nil {
		// No message went out (a secondary's address that resets or closes
		// connections, a hub that is not a data-plane hub's: the data plane
		// said ErrNotSupported).
		return Receipt{}, notOpened{grpcerr.FromStatus(err)}
	}
	err = stream.Send(&rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Header{Header: hdr}})
	if err == nil {
		err = sendStateDict(l, func(p []byte) error {
			return stream.Send(&rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: p}}})
		})
	}
	resp, rerr := stream.CloseAndRecv()
	if rerr != nil {
		return Receipt{}, grpcerr.FromStatus(rerr)
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("%w: push: %v", errs.ErrUnavailable, err)
	}
	return Receipt{Version: resp.GetVersion(), Weight: resp.GetWeight()}, nil
}

// Secondaries lists the live secondaries the primary knows ("" addresses
// resolved to the hub's).
func (c *Client) Secondaries(ctx context.Context) ([]Secondary, error) {
	if err := c.refresh(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Secondary, len(c.targets))
	for i, t := range c.targets {
		out[i] = Secondary{Addr: t.addr, ID: t.id}
	}
	return out, nil
}
