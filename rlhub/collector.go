package rlhub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"

	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Ways a Collector gets versions (CollectorConfig.Via).
const (
	// ViaPush is the hub's (or a relay's) push stream; reports ride on it.
	// The stream is held by a wsync.Failover that attaches it again when
	// it ends, on the connection: to a hub restarted on its address (a
	// durable hub keeps its versions) or, given a cluster (a hub list or
	// etcd://…), to the new primary the connection by then follows; the
	// versions applied only grow. Given etcd://…,
	// the relay announced for the model on this host is preferred (known
	// from one etcd watch the collector keeps, so a look costs etcd
	// nothing): its stream, then the primary's when there is none or it
	// died.
	ViaPush  = "push"
	ViaStore = "store" // pulls "only if newer" and watches; reports by RPC
	// ViaDataPlane follows the hub's push fan-out on its plain-TCP data
	// plane (docs/wire.md): each version is read into one of three buffers
	// the collector reuses, each poll reports the version run, and against
	// a hub without it the collector attaches to the gRPC push stream
	// instead. Given a cluster (a hub list or etcd://…), each poll goes to
	// the primary's data plane; given a relay's address, the relay's push
	// stream (a relay serves no data plane).
	ViaDataPlane = "dataplane"
)

// CollectorConfig configures a Collector.
type CollectorConfig struct {
	// Hub is the hub's address, a cluster's (a hub list or etcd://…), or,
	// with ViaPush or ViaDataPlane, a relay's; required.
	Hub string
	// Model to follow; required.
	Model string
	// CollectorID names the collector in `rlhub sync status`; "" means
	// go-<pid>-<time>.
	CollectorID string
	// Via is ViaPush, ViaStore or ViaDataPlane; "" means ViaPush.
	Via string
	// Weights receives each version in place (names, dtypes and shapes
	// must match, or the version is refused and Weights left as they
	// were); nil means the collector only keeps the snapshot (Current).
	// With ViaDataPlane, Current's bytes are valid only until two newer
	// versions have arrived (the buffers are reused): use Weights, or copy.
	Weights *StateDict
	// Logger; nil means one that discards.
	Logger *slog.Logger
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
	// NoFollowLives keeps the older rule: only versions newer than the
	// one running are applied, so after a model is deleted and pushed
	// again (`rlhub model rm`, a training run restarted under the same
	// name) the collector keeps the deleted model's weights until the new
	// model's versions pass them. false, the default, follows lives
	// (docs/weight-sync.md, "Lives"): on every way it gets versions
	// (Via, and a Failover's relay and primary) the collector asks the
	// hub to send the new model's newest at once and applies it, though
	// it is not newer. Fencing by epoch holds either way. A hub that
	// predates lives ignores the request and names no life, so the older
	// rule then holds with NoFollowLives false too.
	NoFollowLives bool
	// AnswerWithin (ViaPush) bounds how long each attach of the push
	// stream, the first in NewCollector and every one after the stream
	// ended, waits for the hub to answer a health check: the stream has
	// no first message, so a hub that accepted the connection and then
	// answers nothing (hung, SIGSTOPped) would otherwise look like one
	// with no newer version. None within it fails the attach
	// (NewCollector, or the next one after the backoff; Status shows
	// it). 0 means 10 s; negative skips the check.
	AnswerWithin time.Duration
}

func (c *CollectorConfig) validate() error {
	if c.Hub == "" || c.Model == "" {
		return errors.New("rlhub: CollectorConfig needs Hub and Model")
	}
	if c.CollectorID == "" {
		c.CollectorID = fmt.Sprintf("go-%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	switch c.Via {
	case "":
		c.Via = ViaPush
	case ViaPush, ViaStore, ViaDataPlane:
	default:
		return fmt.Errorf("rlhub: CollectorConfig.Via %q (want %q, %q or %q)", c.Via, ViaPush, ViaStore, ViaDataPlane)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Collector keeps a collector's weights at the newest version of a model
// and reports the version it runs. Poll and Run may be called from any
// goroutine (applies are serialized); Close ends it, and any Poll or Run
// in progress.
type Collector struct {
	cfg    CollectorConfig
	conn   *grpc.ClientConn
	fo     *wsync.Failover        // ViaPush: the stream, attached again when it ends (a failover, a restart)
	first  io.Closer              // fo's first stream, closed by Close even if fo never took it
	relays *dial.RelayFinder      // ViaPush to etcd://: this host's relay, from one etcd watch
	store  *storerpc.Client       // ViaStore
	dp     *wsync.DataPlaneClient // ViaDataPlane
	bulk   *bulk.Client           // ViaDataPlane: dp's data-plane client, closed after dp
	recv   *wsync.Receiver
	mu     sync.Mutex // guards closed

	// reports holds the newest applied version not yet reported
	// (ViaStore), for the reporter goroutine, which Close stops and waits
	// for: an apply does not wait for the hub's answer.
	reports  chan uint64
	reporter sync.WaitGroup

	closed bool

	// attached is when NewCollector opened the first push stream, which
	// the Failover takes at its first call (Status before it).
	attached time.Time

	// turn, for a source that serves one call at a time and reuses what
	// it returned (ViaDataPlane's buffers, a cluster's Failover), is held
	// by the Poll or Run calling it, through the apply: another waits
	// for its turn within its own ctx. nil: calls run side by side.
	turn chan struct{}

	// closing is done once Close is called: it ends the Poll and Run in
	// progress (a cluster's Failover and the data-plane client close only
	// once their call has returned).
	closing context.Context
	stop    context.CancelFunc

	// calls (ViaStore, ViaDataPlane) is what the collector's own calls to
	// the hub saw, for Status: the gRPC connection's state says nothing of
	// the data plane, nor of a hub that took the connection and hangs.
	calls callState
}

// callState is what a collector's own calls to the hub through its source
// (Poll, Run's waits) saw: the latest's outcome, once Close is called
// no more. Safe for concurrent use.
type callState struct {
	mu     sync.Mutex // guards the fields below
	failed bool       // the latest call to the hub failed (or Close was called)
	since  time.Time  // when failed last changed; NewCollector at first
	err    error      // why, while failed
	closed bool       // Close was called: calls that end after are not recorded
}

// record notes the outcome of a call to the hub: err nil, it answered.
func (s *callState) record(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if failed := err != nil; failed != s.failed {
		s.failed, s.since = failed, time.Now()
	}
	s.err = err
}

// close notes Close: not connected from now on.
func (s *callState) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failed {
		s.failed, s.since = true, time.Now()
	}
	s.err, s.closed = errCollectorClosed, true
}

func (s *callState) status() CollectorStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := CollectorStatus{Connected: !s.failed, Since: s.since}
	if s.failed {
		st.LastError = errs.Clip(s.err.Error(), maxStatusError)
	}
	return st
}

// applyError is an error of the collector's own apply (the version
// refused: its layout is not Weights'): the hub answered.
type applyError struct{ err error }

func (e applyError) Error() string { return e.err.Error() }
func (e applyError) Unwrap() error { return e.err }

// sawCall records, for Status, how a call that reached the collector's
// source ended (err: Poll's, or Run's). Not the hub's failures: the
// caller's cancel (of Poll or Run) or Close, Run's ctx ending (Run waits
// for as long as its caller lets it), another call holding the source,
// and an apply refused (the hub answered). A Poll's deadline passing is:
// the hub did not answer in the time the caller gave it.
func (c *Collector) sawCall(ctx context.Context, err error, run bool) {
	var refused applyError
	switch {
	case c.fo != nil:
		return // ViaPush: the Failover's state
	case c.closing.Err() != nil, errors.Is(ctx.Err(), context.Canceled), run && ctx.Err() != nil,
		errors.Is(err, wsync.ErrSourceInUse):
		return
	case errors.As(err, &refused):
		err = nil
	}
	c.calls.record(err)
}

// NewCollector connects to the hub (ViaPush: opens the stream, bounded by
// ctx) and returns a collector running no version yet.
func NewCollector(ctx context.Context, cfg CollectorConfig) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	conn, err := cfg.Security.dial().GRPC(cfg.Hub)
	if err != nil {
		return nil, fmt.Errorf("rlhub: dial %s: %w", cfg.Hub, err)
	}
	c := &Collector{cfg: cfg, conn: conn}
	c.closing, c.stop = context.WithCancel(context.Background())
	var src wsync.Source
	var onApplied func(uint64)
	switch cfg.Via {
	case ViaPush:
		// Under a Failover on one hub too: its stream ends when the hub
		// restarts (durable, it keeps its versions), and the collector
		// attaches again on the connection rather than stopping.
		t, err := dial.ParseTarget(cfg.Hub)
		if err := c.followPush(ctx, err == nil && len(t.Etcd) > 0); err != nil {
			conn.Close()
			return nil, err
		}
		src, onApplied = c.fo, c.fo.Running
	case ViaStore:
		c.store, err = storerpc.NewClient(storerpc.ClientConfig{Conn: conn})
		if err != nil {
			conn.Close()
			return nil, err
		}
		src = wsync.StoreSource{Store: c.store, Name: cfg.Model}
		c.reports = make(chan uint64, 1)
		c.reporter.Go(c.reportLoop)
		onApplied = c.queueReport
	case ViaDataPlane:
		c.bulk = cfg.Security.dial().Bulk() // TLS and the token, as the gRPC connection
		c.dp, err = wsync.NewDataPlaneClient(wsync.DataPlaneConfig{Addr: cfg.Hub, Bulk: c.bulk, Conn: conn,
			CollectorID: cfg.CollectorID, Model: cfg.Model, FollowLives: !cfg.NoFollowLives, Logger: cfg.Logger})
		if err != nil {
			c.bulk.Close()
			conn.Close()
			return nil, err
		}
		src = c.dp
		onApplied = func(v uint64) { _ = c.dp.Running(v) }
	}
	if c.dp != nil || c.fo != nil {
		c.turn = make(chan struct{}, 1)
	}
	var apply wsync.ApplyFunc
	if cfg.Weights != nil {
		copyInto := wsync.CopyInto(cfg.Weights)
		apply = func(snap *Snapshot) error {
			if err := copyInto(snap); err != nil {
				return applyError{err} // not the hub's failure (sawCall)
			}
			return nil
		}
	}
	if c.fo == nil {
		c.calls.since = time.Now()
		// Each version applied is a call to the hub answered: Run's
		// waits record only so, or when Run fails.
		report := onApplied
		onApplied = func(v uint64) {
			c.calls.record(nil)
			report(v)
		}
	}
	c.recv, err = wsync.NewReceiver(wsync.ReceiverConfig{Source: src, Apply: apply, OnApplied: onApplied,
		FollowLives: !cfg.NoFollowLives})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// errNoRelay is the relay dialer's answer when etcd announces no relay
// of the model on this host: the Failover goes on to the primary.
var errNoRelay = errors.New("no relay of the model is announced on this host")

// followPush sets c.fo up for ViaPush: with etcd (relays announce
// themselves there), first the push stream of the relay announced for the
// model on this host, as c.relays last saw it; then the stream on c.conn,
// which reconnects to a restarted hub and, on a cluster, follows the
// primary. The first stream is attached here, bounded by ctx (an error
// from the hub, such as a refused token, fails NewCollector); the Failover attaches the next when
// the one it holds ends, most preferred first, so a collector whose
// relay died continues from the primary, and one on the primary goes to a
// relay found at its next probe (every second) or dial.
func (c *Collector) followPush(ctx context.Context, viaEtcd bool) error {
	cfg, d := c.cfg, c.cfg.Security.dial()
	follow := !cfg.NoFollowLives
	// attach opens a stream for a collector at version have of life life
	// (0: unknown), following lives unless NoFollowLives.
	attach := func(ctx context.Context, conn *grpc.ClientConn, have, life uint64) (*wsync.Client, error) {
		return wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: cfg.CollectorID,
			Model: cfg.Model, Start: have, FollowLives: follow, StartLife: life, AnswerWithin: cfg.AnswerWithin,
			Logger: cfg.Logger})
	}
	if viaEtcd {
		f, err := d.FindRelays(cfg.Hub, cfg.Model)
		if err != nil {
			return err
		}
		c.relays = f
	}
	relay := func(ctx context.Context, have, life uint64) (wsync.Source, io.Closer, error) {
		lctx, cancel := context.WithTimeout(ctx, dial.DefaultResolveTimeout)
		addr, ok, err := c.relays.Local(lctx)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			return nil, nil, errNoRelay
		}
		rc, err := d.GRPC(addr)
		if err != nil {
			return nil, nil, err
		}
		s, err := attach(ctx, rc, have, life)
		if err != nil {
			rc.Close()
			return nil, nil, err
		}
		return s, &closeAll{cs: []io.Closer{s, rc}}, nil
	}
	// The first stream, the relay's when there is one, else the
	// primary's: handed to the Failover by that dialer's first call (dials
	// are serialized by the Failover).
	var first struct {
		relay bool
		src   wsync.Source
		cl    io.Closer
	}
	if viaEtcd {
		if s, cl, err := relay(ctx, 0, 0); err == nil {
			first.relay, first.src, first.cl = true, s, cl
		} else if !errors.Is(err, errNoRelay) {
			cfg.Logger.Info("rlhub: no relay stream for now; following the primary", "model", cfg.Model, "err", err)
		}
	}
	if first.cl == nil {
		s, err := attach(ctx, c.conn, 0, 0)
		if err != nil {
			c.relays.Close()
			return err
		}
		first.src, first.cl = s, s
	}
	c.first, c.attached = first.cl, time.Now()
	take := func(relay bool) (wsync.Source, io.Closer, bool) {
		if first.cl == nil || first.relay != relay {
			return nil, nil, false
		}
		s, cl := first.src, first.cl
		first.src, first.cl = nil, nil
		return s, cl, true
	}
	// Each dialer's Dial and DialLives (the Failover dials the latter
	// when following lives, with the life of the version the collector
	// runs) hand over the first stream when it is theirs.
	var ds []wsync.Dialer
	if viaEtcd {
		dialRelay := func(ctx context.Context, have, life uint64) (wsync.Source, io.Closer, error) {
			if s, cl, ok := take(true); ok {
				return s, cl, nil
			}
			s, cl, err := relay(ctx, have, life)
			if err == nil {
				if _, unused, ok := take(false); ok { // a relay appeared: the primary's first stream is not needed
					unused.Close()
				}
			}
			return s, cl, err
		}
		ds = append(ds, wsync.Dialer{Name: "relay", DialLives: dialRelay,
			Dial: func(ctx context.Context, have uint64) (wsync.Source, io.Closer, error) {
				return dialRelay(ctx, have, 0)
			}})
	}
	dialPush := func(ctx context.Context, have, life uint64) (wsync.Source, io.Closer, error) {
		if s, cl, ok := take(false); ok {
			return s, cl, nil
		}
		s, err := attach(ctx, c.conn, have, life)
		if err != nil {
			return nil, nil, err
		}
		return s, s, nil
	}
	ds = append(ds, wsync.Dialer{Name: "push", DialLives: dialPush,
		Dial: func(ctx context.Context, have uint64) (wsync.Source, io.Closer, error) { return dialPush(ctx, have, 0) }})
	fo, err := wsync.NewFailover(wsync.FailoverConfig{Logger: cfg.Logger, Dialers: ds, FollowLives: follow})
	if err != nil {
		c.first.Close()
		c.relays.Close()
		return err
	}
	c.fo = fo
	return nil
}

// closeAll closes each in turn (a relay's stream, then its connection),
// once; later calls return the first call's error.
type closeAll struct {
	cs   []io.Closer
	once sync.Once
	err  error
}

func (a *closeAll) Close() error {
	a.once.Do(func() {
		var out []error
		for _, c := range a.cs {
			out = append(out, c.Close())
		}
		a.err = errors.Join(out...)
	})
	return a.err
}

// queueReport hands v, the version just applied, to reportLoop; it
// replaces a version not yet reported (applies are serialized, so v is
// the newest).
func (c *Collector) queueReport(v uint64) {
	for {
		select {
		case c.reports <- v:
			return
		default:
		}
		select {
		case <-c.reports:
		default:
		}
	}
}

// reportLoop reports each version queueReport hands it until Close.
func (c *Collector) reportLoop() {
	for {
		select {
		case <-c.closing.Done():
			return
		case v := <-c.reports:
			c.report(v)
		}
	}
}

// report tells the hub the version a store-fed collector runs, within 10
// s or until Close; a failed report is logged and the next apply reports
// again.
func (c *Collector) report(v uint64) {
	ctx, cancel := context.WithTimeout(c.closing, 10*time.Second)
	defer cancel()
	err := wsync.Report(ctx, c.conn, &rlhubv1.CollectorReport{CollectorId: c.cfg.CollectorID,
		Model: c.cfg.Model, Version: v, Via: "pull"})
	if err != nil {
		c.cfg.Logger.Warn("rlhub: version report failed", "model", c.cfg.Model, "version", v, "err", err)
	}
}

// errCollectorClosed is Poll's and Run's error once Close was called.
var errCollectorClosed = fmt.Errorf("%w: rlhub: the collector is closed", ErrUnavailable)

// callCtx is ctx, also ended by Close; done returns err, or
// errCollectorClosed for a call that Close ended.
func (c *Collector) callCtx(ctx context.Context) (context.Context, func(err error) error) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.closing, cancel)
	return ctx, func(err error) error {
		stop()
		cancel()
		if err != nil && c.closing.Err() != nil {
			return errCollectorClosed
		}
		return err
	}
}

// takeTurn waits, within ctx, for the source's turn (Collector.turn);
// release gives it back.
func (c *Collector) takeTurn(ctx context.Context) (release func(), err error) {
	if c.turn == nil {
		return func() {}, nil
	}
	select {
	case c.turn <- struct{}{}:
		return func() { <-c.turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Poll applies the newest version if it is newer than the one running
// (or, unless NoFollowLives, of another life: the model deleted and
// pushed again); it reports whether it applied one. Beside a Run on ViaDataPlane or a
// cluster, it waits for Run to end, within ctx.
func (c *Collector) Poll(ctx context.Context) (bool, error) {
	ctx, done := c.callCtx(ctx)
	release, err := c.takeTurn(ctx)
	if err != nil {
		return false, done(err)
	}
	defer release()
	ok, err := c.recv.Poll(ctx)
	c.sawCall(ctx, err, false)
	return ok, done(err)
}

// Run applies every newer version as it arrives until ctx ends or Close
// is called.
func (c *Collector) Run(ctx context.Context) error {
	ctx, done := c.callCtx(ctx)
	release, err := c.takeTurn(ctx)
	if err != nil {
		return done(err)
	}
	defer release()
	err = c.recv.Run(ctx)
	c.sawCall(ctx, err, true)
	return done(err)
}

// Version is the version the collector runs (0: none yet).
func (c *Collector) Version() uint64 { return c.recv.Version() }

// Transport is how versions arrive: "push" or "store" (the Via), and for
// ViaDataPlane "dataplane", or "grpc" once the collector fell back to the
// push stream of a hub without the data plane; for ViaPush on an etcd://
// cluster, "relay" while the stream is the relay's on this host.
func (c *Collector) Transport() string {
	if c.dp != nil {
		return c.dp.Transport()
	}
	if c.fo != nil && c.fo.Current() == "relay" {
		return "relay"
	}
	return c.cfg.Via
}

// CollectorStatus is a Collector's view of its connection to the hub.
type CollectorStatus struct {
	// Connected: ViaPush, a push stream is open, the hub having answered
	// when it was attached; false while the collector is dialing again
	// (the hub restarted, died or hangs: see LastError). ViaStore and
	// ViaDataPlane: the latest call to the hub through the collector's
	// source (a Poll, or a wait of Run) was answered, or none has failed
	// yet. Run records an answered wait when it applies a version, a
	// failed one when it returns. Not the hub's failures: the caller's
	// cancel, Run's ctx ending, Close, a version refused for its layout;
	// a Poll whose ctx deadline passes is. After Close, false.
	Connected bool
	// Since is when Connected last changed (ViaStore and ViaDataPlane:
	// NewCollector's time until then).
	Since time.Time
	// LastError, while not Connected, is why: ViaPush, the latest failed
	// attach (e.g. the hub "sent nothing within 10s") or how the stream
	// ended; ViaStore and ViaDataPlane, the latest failed call's error.
	// At most maxStatusError bytes. "" while Connected.
	LastError string
}

// maxStatusError bounds CollectorStatus.LastError (an error may quote
// what a server sent).
const maxStatusError = 512

// Status reports whether the collector is connected (CollectorStatus), so
// a program can tell a collector at the newest version from one
// redialling a hung or dead hub. It is as of the last Poll or Run (ViaPush:
// the stream is attached again only within them; Run keeps it current).
func (c *Collector) Status() CollectorStatus {
	if c.fo == nil {
		return c.calls.status()
	}
	st := c.fo.State()
	switch {
	case st.Source != "":
		return CollectorStatus{Connected: true, Since: st.Since}
	case st.Err == nil && st.Since.IsZero():
		// The Failover has not dialed yet: the first stream, attached
		// by NewCollector, is still its to take.
		return CollectorStatus{Connected: true, Since: c.attached}
	}
	s := CollectorStatus{Since: st.Since}
	if st.Err != nil {
		s.LastError = errs.Clip(st.Err.Error(), maxStatusError)
	}
	return s
}

// Current is the snapshot of the running version (nil: none yet).
func (c *Collector) Current() *Snapshot { return c.recv.Current() }

// Close ends the Poll or Run in progress (it fails with ErrUnavailable),
// the stream and the connection; safe to call twice.
func (c *Collector) Close() error {
	c.stop()
	c.calls.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.reporter.Wait() // ended by c.stop
	var out []error
	if c.fo != nil {
		out = append(out, c.fo.Close(), c.first.Close(), c.relays.Close()) // Client.Close is safe twice
	}
	if c.store != nil {
		out = append(out, c.store.Close())
	}
	if c.dp != nil {
		out = append(out, c.dp.Close())
		c.bulk.Close()
	}
	out = append(out, c.conn.Close())
	return errors.Join(out...)
}
