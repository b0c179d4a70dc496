package dial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A cluster target is an address string that names a cluster of hubs
// instead of one hub; Config.GRPC given one returns a connection that
// follows the cluster's primary:
//
//	host:port                 one hub (no following: today's behaviour)
//	h1:p1,h2:p2,...           any of these hubs answers Cluster/Primary
//	etcd://e1:2379,e2/NAME    read the primary of cluster NAME from etcd
//
// Every client that takes a hub address therefore takes a cluster too
// (`--hub a,b,c`, or `--etcd E --cluster N`, which the CLI turns into the
// etcd form with EtcdTarget).
//
// Following, as the connection does it (docs/cluster.md, Clients):
//   - The primary is resolved before the first call, and again when a
//     connection to it fails or is lost, when a call runs out its deadline
//     (a primary cut off by a partition stalls its connection rather than
//     closing it), and at once when a hub refuses a call as a standby (its
//     trailer names the primary: that one is used).
//     An answer whose epoch is older than one already seen is ignored.
//   - Unary calls wait for a connection to the primary (gRPC's
//     wait-for-ready) within their deadline, so a call made while there is
//     none is sent once there is one: never sent, never applied.
//   - A unary call refused as a standby was not applied: it is retried on
//     the primary named, up to MaxFollowAttempts times. A unary call whose
//     connection died after it was sent is retried only when idempotent
//     (reads: pulls, lists, status); any other is returned to the caller
//     (its outcome is unknown; a gradient push is counted lost).
//   - A stream is opened only once there is a ready connection to the
//     primary (waiting within its context and at most FollowTimeout).
//     Streams are not retried here (their messages are the caller's); a
//     stream that fails makes the next resolve happen at once, so the
//     caller's reconnect lands on the new primary.
//   - A unary call whose context has no deadline gets FollowTimeout.
//   - Given etcd, the connection also watches the election, so it learns
//     of a new primary's term as etcd does, not only when a call to the old
//     one fails: a primary whose machine died answers nothing and resets
//     nothing (its connections stall until keepalives give up, a minute
//     later). When the followed primary moves to another address, every
//     call, stream and data-plane request (PlaneContext) still in flight on
//     the old one ends with Unavailable ("the primary moved"), and is
//     treated as any call whose connection died: reads are sent again to
//     the new primary, anything else is returned with its outcome unknown.

// Metadata the hubs put in a standby's refusal (HELPERS contract; the hub
// side is internal/cluster).
const (
	PrimaryTrailer = cluster.TrailerPrimary
	EpochTrailer   = cluster.TrailerEpoch
)

// Defaults of the cluster target's settings.
const (
	DefaultFollowTimeout   = 2 * time.Minute
	DefaultResolveTimeout  = 3 * time.Second
	MaxFollowAttempts      = 8
	maxTargetBytes         = 4096
	followBackoffBase      = 50 * time.Millisecond
	followBackoffMax       = time.Second
	resolveMinInterval     = 50 * time.Millisecond
	waitResolveEvery       = 100 * time.Millisecond
	followSchemeName       = "rlhub-cluster"
	defaultEtcdClusterName = "rlhub"
)

// Target is a parsed address string.
type Target struct {
	// Hubs are the hub addresses given (one for a plain address).
	Hubs []string
	// Etcd are etcd client URLs (http://host:port); with Cluster, the
	// primary is read from etcd.
	Etcd    []string
	Cluster string
}

// Clustered reports whether t follows a primary (more than one hub, or
// etcd) rather than dialing one address.
func (t Target) Clustered() bool { return len(t.Hubs) > 1 || len(t.Etcd) > 0 }

// String renders t in the syntax ParseTarget reads.
func (t Target) String() string {
	if len(t.Etcd) > 0 {
		eps := make([]string, len(t.Etcd))
		for i, e := range t.Etcd {
			eps[i] = strings.TrimPrefix(e, "http://")
		}
		return "etcd://" + strings.Join(eps, ",") + "/" + t.Cluster
	}
	return strings.Join(t.Hubs, ",")
}

var clusterName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ParseTarget reads an address string (see the syntax above). Errors
// quote the input bounded (errs.Quote).
func ParseTarget(s string) (Target, error) {
	if len(s) > maxTargetBytes {
		return Target{}, fmt.Errorf("%w: dial: address of %d bytes is too long", errs.ErrInvalid, len(s))
	}
	if rest, ok := strings.CutPrefix(s, "etcd://"); ok {
		// The name follows the last '/' (endpoints may be URLs).
		eps, name := rest, defaultEtcdClusterName
		if i := strings.LastIndex(rest, "/"); i >= 0 && !strings.HasSuffix(rest[:i], ":/") {
			eps, name = rest[:i], rest[i+1:]
		}
		if !clusterName.MatchString(name) {
			return Target{}, fmt.Errorf("%w: dial: cluster name %s must match %s", errs.ErrInvalid, errs.Quote(name), clusterName)
		}
		t := Target{Cluster: name}
		for _, e := range strings.Split(eps, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			if !strings.Contains(e, "://") {
				e = "http://" + e
			}
			t.Etcd = append(t.Etcd, e)
		}
		if len(t.Etcd) == 0 {
			return Target{}, fmt.Errorf("%w: dial: %s names no etcd endpoint", errs.ErrInvalid, errs.Quote(s))
		}
		return t, nil
	}
	var t Target
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil && strings.Contains(s, ",") {
			return Target{}, fmt.Errorf("%w: dial: hub address %s in a list must be host:port", errs.ErrInvalid, errs.Quote(h))
		}
		t.Hubs = append(t.Hubs, h)
	}
	if len(t.Hubs) == 0 {
		return Target{}, fmt.Errorf("%w: dial: empty hub address", errs.ErrInvalid)
	}
	return t, nil
}

// EtcdTarget is the address string of cluster name read from etcd
// endpoints (comma-separated host:port or URLs): what --etcd and
// --cluster become.
func EtcdTarget(endpoints, name string) string {
	if name == "" {
		name = defaultEtcdClusterName
	}
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, strings.TrimPrefix(e, "http://"))
		}
	}
	return "etcd://" + strings.Join(eps, ",") + "/" + name
}

// Primary is where a followed cluster's primary is, as a client saw it.
type Primary struct {
	Addr  string
	Epoch uint64
}

// Refusal reads a standby's refusal from a call's error and trailer: the
// primary it names (Addr "" when the standby does not know one) and true,
// or false when err is not a standby refusal. It is cluster.AsRefusal, the
// contract's one reader, whose bounds apply: an address that is over 300
// bytes or holds white space, or an epoch that is not a number, names no
// primary (the client resolves again instead).
func Refusal(err error, trailer metadata.MD) (Primary, bool) {
	r, ok := cluster.AsRefusal(err, trailer)
	if !ok {
		return Primary{}, false
	}
	return Primary{Addr: r.Primary, Epoch: r.Epoch}, true
}

// RefusalText reads a standby's refusal from its message (the data plane
// carries only the text): the primary named (Addr "" when unknown), or
// false when msg is not a refusal (cluster.ParseRefusal).
func RefusalText(msg string) (Primary, bool) {
	r, ok := cluster.ParseRefusal(msg)
	if !ok {
		return Primary{}, false
	}
	return Primary{Addr: r.Primary, Epoch: r.Epoch}, true
}

// Offer tells the connection conn (from Config.GRPC on a cluster target)
// of a standby's refusal seen elsewhere (on the data plane): it follows
// the primary named, or resolves again when p.Addr is "". A plain
// connection ignores it.
func Offer(conn interface{ Target() string }, p Primary) {
	if f := followerOf(conn); f != nil {
		f.hint(p)
	}
}

// idempotent lists the unary methods a follower may send again after a
// connection died with the call in flight: reads, which change nothing.
var idempotent = map[string]bool{
	"/rlhub.v1.Cluster/Primary":                 true,
	"/rlhub.v1.Cluster/Replication":             true,
	"/rlhub.v1.ModelStore/Pull":                 true,
	"/rlhub.v1.ModelStore/List":                 true,
	"/rlhub.v1.Reducer/Secondaries":             true,
	"/rlhub.v1.Reducer/Stats":                   true,
	"/rlhub.v1.ReducerPrimary/Describe":         true,
	"/rlhub.v1.WeightSync/Status":               true,
	"/rlhub.v1.LearnerAggregator/Resources":     true,
	"/rlhub.v1.LearnerAggregator/Status":        true,
	"/rlhub.v1.LearnerAggregator/GetDataDemand": true,
	"/rlhub.v1.ARS/PullPolicy":                  true,
	"/grpc.health.v1.Health/Check":              true,
	"/grpc.health.v1.Health/List":               true,
}

// Idempotent reports whether a unary method may be sent again after its
// outcome became unknown.
func Idempotent(method string) bool { return idempotent[method] }

var followers sync.Map // endpoint → *follower, while its connection is open
var followerSeq atomic.Uint64

// CurrentPrimary is the primary a connection from Config.GRPC on a
// cluster target follows now (for the data plane, which dials addresses
// itself); false for any other connection, and while no primary is known.
func CurrentPrimary(conn interface{ Target() string }) (Primary, bool) {
	if f := followerOf(conn); f != nil {
		p := f.current()
		return p, p.Addr != ""
	}
	return Primary{}, false
}

func followerOf(conn interface{ Target() string }) *follower {
	if cc, ok := conn.(*grpc.ClientConn); conn == nil || (ok && cc == nil) {
		return nil
	}
	if ep, ok := strings.CutPrefix(conn.Target(), followSchemeName+":///"); ok {
		if f, ok := followers.Load(ep); ok {
			return f.(*follower)
		}
	}
	return nil
}

// follow opens a connection that follows t's primary.
func (c Config) follow(t Target, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	f := &follower{cfg: c, t: t, seeds: map[string]*grpc.ClientConn{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	f.base, f.stopBase = context.WithCancel(context.Background())
	f.term, f.endTerm = context.WithCancelCause(context.Background())
	f.timeout = c.FollowTimeout
	if f.timeout <= 0 {
		f.timeout = DefaultFollowTimeout
	}
	if len(t.Etcd) > 0 {
		r, err := cluster.OpenReader(cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, DialTimeout: DefaultResolveTimeout, Security: c.Etcd})
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", t, err)
		}
		f.etcd = r
	}
	f.endpoint = strconv.FormatUint(followerSeq.Add(1), 10)
	followers.Store(f.endpoint, f)
	opts := append(c.Options(),
		grpc.WithResolvers(f),
		// The resolver is built once and closed with the connection.
		grpc.WithIdleTimeout(0),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: followBackoffBase, Multiplier: 1.6, Jitter: 0.2, MaxDelay: followBackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithChainUnaryInterceptor(f.unary),
		grpc.WithChainStreamInterceptor(f.stream),
	)
	conn, err := grpc.NewClient(followSchemeName+":///"+f.endpoint, append(opts, extra...)...)
	if err != nil {
		f.shutdown()
		return nil, fmt.Errorf("dial %s: %w", t, err)
	}
	conn.Connect() // build the resolver now: the first lookup starts at once
	return conn, nil
}

// follower is one connection's resolver (resolver.Builder and
// resolver.Resolver) and its interceptors. Its goroutine is started by
// Build and stopped by Close, which gRPC calls when the connection closes.
type follower struct {
	cfg      Config
	t        Target
	endpoint string
	timeout  time.Duration
	etcd     *cluster.Reader

	// upd is held by an offer from taking it (setting cur) until gRPC
	// has been told of it: offers come from several goroutines at once
	// (the loop, the etcd watch, refusals' hints), and one that set cur
	// first must not reach gRPC last — the connection would dial an older
	// primary than cur, whose refusals name cur and so change nothing.
	// Taken before mu.
	upd     sync.Mutex
	mu      sync.Mutex
	cur     Primary
	lastErr error
	// term ends (endTerm, with a *PrimaryMovedError) when cur moves to
	// another address: what was in flight on the old primary is given up.
	term    context.Context
	endTerm context.CancelCauseFunc
	cc      resolver.ClientConn
	seeds   map[string]*grpc.ClientConn // Cluster/Primary connections, by hub address

	// looked is closed when a lookup begun after a call timed out has
	// ended (nil: none asked for): the calls made meanwhile wait for it
	// (awaitLookup) rather than follow the timed-out one onto the stalled
	// connection. lookAfter is the number of lookups begun when it was
	// asked for, begun the count so far; all guarded by mu.
	looked    chan struct{}
	lookAfter uint64
	begun     uint64

	kick     chan struct{}
	done     chan struct{}
	base     context.Context // ends with done: bounds every lookup
	stopBase context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	held atomic.Int64 // inTerm's holds on a term not yet released (tests)
}

func (f *follower) Scheme() string { return followSchemeName }

func (f *follower) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	f.mu.Lock()
	f.cc = cc
	f.mu.Unlock()
	f.wg.Go(f.loop)
	if f.etcd != nil {
		f.wg.Go(func() {
			_ = f.etcd.WatchLeader(f.base, func(l cluster.Leader) { f.offer(Primary{Addr: l.Addr, Epoch: l.Epoch}) })
		})
	}
	f.ResolveNow(resolver.ResolveNowOptions{})
	return f, nil
}

// ResolveNow asks the loop to resolve (gRPC calls it on every failed
// connection attempt and lost connection).
func (f *follower) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Close stops the loop and closes the seed connections and etcd.
func (f *follower) Close() { f.shutdown() }

func (f *follower) shutdown() {
	f.stopOnce.Do(func() {
		close(f.done)
		f.stopBase()
		f.wg.Wait()
		f.mu.Lock()
		f.endTerm(nil)
		f.mu.Unlock()
		followers.Delete(f.endpoint)
		f.mu.Lock()
		for _, c := range f.seeds {
			c.Close()
		}
		f.seeds = nil
		f.mu.Unlock()
		if f.etcd != nil {
			f.etcd.Close()
		}
	})
}

func (f *follower) current() Primary {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

// loop resolves on each kick until it has an answer, backing off while
// none comes; kicks closer than resolveMinInterval are merged.
func (f *follower) loop() {
	wait := followBackoffBase
	for {
		select {
		case <-f.done:
			return
		case <-f.kick:
		}
		for {
			f.mu.Lock()
			f.begun++
			n := f.begun
			f.mu.Unlock()
			ctx, cancel := context.WithTimeout(f.base, DefaultResolveTimeout)
			p, err := f.resolve(ctx)
			cancel()
			if err == nil {
				f.offer(p)
			}
			f.mu.Lock()
			if f.looked != nil && n > f.lookAfter {
				close(f.looked)
				f.looked = nil
			}
			f.mu.Unlock()
			if err == nil {
				wait = followBackoffBase
				break
			}
			f.mu.Lock()
			f.lastErr = err
			cc, known := f.cc, f.cur.Addr != ""
			f.mu.Unlock()
			if !known && cc != nil {
				cc.ReportError(err)
			}
			select {
			case <-f.done:
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, followBackoffMax)
		}
		select {
		case <-f.done:
			return
		case <-time.After(resolveMinInterval):
		}
	}
}

// offer makes p the primary unless an answer with a newer epoch was seen.
// A primary at another address than the one followed ends the old one's
// term: what is in flight there is given up (after the connection was
// told of p, so that what is sent again goes to p). Offers are taken one
// at a time (upd), so the address gRPC dials is always cur's.
func (f *follower) offer(p Primary) {
	if p.Addr == "" {
		return
	}
	f.upd.Lock()
	defer f.upd.Unlock()
	f.mu.Lock()
	if p.Epoch < f.cur.Epoch || p == f.cur {
		f.mu.Unlock()
		return
	}
	var end func()
	if old := f.cur; old.Addr != "" && old.Addr != p.Addr {
		endOld := f.endTerm
		f.term, f.endTerm = context.WithCancelCause(context.Background())
		end = func() { endOld(&PrimaryMovedError{Cluster: f.t.String(), From: old, To: p}) }
	}
	f.cur, f.lastErr = p, nil
	cc := f.cc
	f.mu.Unlock()
	if cc != nil {
		_ = cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: p.Addr, ServerName: HostOf(p.Addr)}}})
	}
	if end != nil {
		end()
	}
}

// PrimaryMovedError ends a call, stream or data-plane request that was in
// flight on a primary when the cluster's primary moved to another hub.
// Its outcome is unknown (the old primary may have applied it); it
// matches errs.ErrUnavailable, and its gRPC status is Unavailable.
type PrimaryMovedError struct {
	Cluster  string
	From, To Primary
	// Err is how the call itself ended once its context was cancelled
	// (nil in the cause a context carries): a dial that never connected
	// shows here, so a caller can still tell that nothing was sent.
	Err error
}

func (e *PrimaryMovedError) Error() string {
	s := fmt.Sprintf("rlhub: cluster %s: the primary moved from %s (epoch %d) to %s (epoch %d) while this was in flight",
		e.Cluster, e.From.Addr, e.From.Epoch, e.To.Addr, e.To.Epoch)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *PrimaryMovedError) Is(target error) bool { return target == errs.ErrUnavailable }

func (e *PrimaryMovedError) Unwrap() error { return e.Err }

// GRPCStatus makes the error Unavailable to gRPC's status package.
func (e *PrimaryMovedError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// inTerm runs in a context that also ends when the followed primary moves
// away; stop releases it (the hold on the term, which lives as long as the
// primary does, and tctx's place in ctx) and may be called more than once.
// moved is the *PrimaryMovedError that ended it, or nil (ctx ended, or it
// has not ended).
func (f *follower) inTerm(ctx context.Context) (tctx context.Context, moved func() error, stop func()) {
	f.mu.Lock()
	term := f.term
	f.mu.Unlock()
	tctx, cancel := context.WithCancelCause(ctx)
	release := context.AfterFunc(term, func() { cancel(context.Cause(term)) })
	f.held.Add(1)
	moved = func() error {
		var pm *PrimaryMovedError
		if ctx.Err() == nil && errors.As(context.Cause(tctx), &pm) {
			return pm
		}
		return nil
	}
	return tctx, moved, sync.OnceFunc(func() { release(); cancel(nil); f.held.Add(-1) })
}

// resolve asks etcd, or every seed hub at once, where the primary is; of
// the hubs' answers the one with the largest epoch wins.
func (f *follower) resolve(ctx context.Context) (Primary, error) {
	if f.etcd != nil {
		l, err := f.etcd.Leader(ctx)
		if err != nil {
			return Primary{}, err
		}
		return Primary{Addr: l.Addr, Epoch: l.Epoch}, nil
	}
	type answer struct {
		p   Primary
		err error
	}
	answers := make(chan answer, len(f.t.Hubs))
	for _, h := range f.t.Hubs {
		conn, err := f.seed(h)
		if err != nil {
			answers <- answer{err: err}
			continue
		}
		go func() {
			r, err := rlhubv1.NewClusterClient(conn).Primary(ctx, &rlhubv1.PrimaryRequest{})
			if err != nil {
				answers <- answer{err: fmt.Errorf("%s: %w", h, err)}
				return
			}
			answers <- answer{p: Primary{Addr: r.GetAddress(), Epoch: r.GetEpoch()}}
		}()
	}
	var best Primary
	var errsOut []error
	for range f.t.Hubs {
		a := <-answers
		if a.err != nil {
			errsOut = append(errsOut, a.err)
			continue
		}
		// Held to a refusal's bound: an address no refusal could name
		// names no primary, whatever its epoch.
		if cluster.NamesPrimary(a.p.Addr) && (best.Addr == "" || a.p.Epoch > best.Epoch) {
			best = a.p
		}
	}
	if best.Addr == "" {
		if len(errsOut) == 0 {
			return Primary{}, fmt.Errorf("%w: no hub of %s knows a primary (an election is running)", errs.ErrUnavailable, f.t)
		}
		return Primary{}, fmt.Errorf("%w: no hub of %s answered where the primary is: %w", errs.ErrUnavailable, f.t, errors.Join(errsOut...))
	}
	return best, nil
}

func (f *follower) seed(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seeds == nil {
		return nil, errors.New("dial: connection closed")
	}
	if c, ok := f.seeds[addr]; ok {
		return c, nil
	}
	c, err := f.cfg.GRPC(addr, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: followBackoffBase, Multiplier: 1.6, Jitter: 0.2, MaxDelay: followBackoffMax}}))
	if err != nil {
		return nil, err
	}
	f.seeds[addr] = c
	return c, nil
}

// hint acts on a standby's refusal: use the primary it names, or resolve
// again when it names none.
func (f *follower) hint(p Primary) {
	if p.Addr == "" {
		f.ResolveNow(resolver.ResolveNowOptions{})
		return
	}
	f.offer(p)
}

// noPrimary is the error of a call that never found a primary in time,
// with err's code.
func (f *follower) noPrimary(err error) error {
	return f.noPrimaryAs(status.Code(err), err, "")
}

// notSent is the error of a call that found no primary ready by its
// deadline and so was never sent: Unavailable, as from a hub that is
// down, and safe to send again (one that ran out its deadline on the
// primary is DeadlineExceeded: it may have been applied). The Python
// client answers the same.
func (f *follower) notSent(err error) error {
	return f.noPrimaryAs(codes.Unavailable, err, "; the call was not sent")
}

// gaveUp is the error of a call given up on, its last attempt's err:
// notSent when that attempt never had a connection (sentTo unset), else
// noPrimary.
func (f *follower) gaveUp(err error, sentTo peer.Peer) error {
	if sentTo.Addr == nil {
		return f.notSent(err)
	}
	return f.noPrimary(err)
}

func (f *follower) noPrimaryAs(code codes.Code, err error, suffix string) error {
	f.mu.Lock()
	cur, last := f.cur, f.lastErr
	f.mu.Unlock()
	where := "no primary found yet"
	if cur.Addr != "" {
		where = fmt.Sprintf("last primary %s (epoch %d) not reachable", cur.Addr, cur.Epoch)
	}
	if last != nil {
		return status.Errorf(code, "rlhub: cluster %s: %s; last lookup: %v%s", f.t, where, last, suffix)
	}
	return status.Errorf(code, "rlhub: cluster %s: %s: %v%s", f.t, where, status.Convert(err).Message(), suffix)
}

func (f *follower) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	wait := followBackoffBase
	f.awaitLookup(ctx)
	for attempt := 1; ; attempt++ {
		// Wait for the primary as a stream does (waitReady looks it up
		// every waitResolveEvery), not by gRPC's wait-for-ready alone,
		// which asks the resolver only after each failed reconnect: a
		// call made while the primary was dead found the one elected in
		// its place up to followBackoffMax late.
		if err := f.waitReady(ctx, cc); err != nil {
			return err
		}
		var tr metadata.MD
		var sentTo peer.Peer // set only once the call had a connection
		tctx, moved, stop := f.inTerm(ctx)
		err := invoker(tctx, method, req, reply, cc, append([]grpc.CallOption{grpc.WaitForReady(true), grpc.Trailer(&tr), grpc.Peer(&sentTo)}, opts...)...)
		if pm := moved(); err != nil && pm != nil {
			err = status.Error(codes.Unavailable, pm.Error())
		}
		stop()
		if err == nil {
			return nil
		}
		code := status.Code(err)
		if code == codes.DeadlineExceeded {
			// The call's deadline may end on the hub first: its handler
			// sees the deadline the call carried and answers
			// DeadlineExceeded while ctx has not ended here yet. Both are
			// a call that ran out its deadline on the primary.
			f.stalled()
			if ctx.Err() != nil {
				return f.gaveUp(err, sentTo)
			}
			return err
		}
		if code != codes.Unavailable {
			return err
		}
		if p, ok := Refusal(err, tr); ok {
			f.hint(p) // not applied: safe to send again
		} else {
			f.ResolveNow(resolver.ResolveNowOptions{})
			if !Idempotent(method) {
				return err // sent, outcome unknown: the caller decides
			}
		}
		if attempt >= MaxFollowAttempts {
			return f.gaveUp(err, sentTo)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return f.gaveUp(err, sentTo)
		case <-t.C:
		}
		wait = min(2*wait, followBackoffMax)
	}
}

// waitReady waits until cc has a ready connection to the primary, within
// ctx and at most FollowTimeout: a stream is opened only then, so one
// opened while there is no primary waits for one (bounded) and was never
// sent.
func (f *follower) waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	wctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown: // closed: it never becomes ready
			return status.Error(codes.Canceled, "grpc: the client connection is closing")
		}
		if st == connectivity.Idle {
			cc.Connect()
		}
		// Look the primary up every waitResolveEvery while waiting: gRPC
		// asks only after each failed reconnect, whose backoff reaches
		// followBackoffMax, so a primary elected meanwhile would otherwise
		// be found up to that late.
		sctx, scancel := context.WithTimeout(wctx, waitResolveEvery)
		changed := cc.WaitForStateChange(sctx, st)
		scancel()
		if changed {
			continue
		}
		if wctx.Err() == nil {
			f.ResolveNow(resolver.ResolveNowOptions{})
			continue
		}
		if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
			return f.notSent(status.FromContextError(err).Err())
		} else if err != nil {
			return status.FromContextError(err).Err()
		}
		return f.noPrimary(status.Error(codes.Unavailable, "no connection to a primary"))
	}
}

func (f *follower) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	f.awaitLookup(ctx)
	if err := f.waitReady(ctx, cc); err != nil {
		return nil, err
	}
	tctx, moved, stop := f.inTerm(ctx)
	s, err := streamer(tctx, desc, cc, method, opts...)
	if err != nil {
		if pm := moved(); pm != nil {
			err = status.Error(codes.Unavailable, pm.Error())
		}
		stop()
		if status.Code(err) == codes.Unavailable {
			f.ResolveNow(resolver.ResolveNowOptions{})
		}
		return nil, err
	}
	// A stream given up by ending its context (without reading it to its
	// end) releases its hold then.
	abandoned := context.AfterFunc(tctx, stop)
	release := func() { abandoned(); stop() }
	return &followedStream{ClientStream: s, f: f, moved: moved, stop: release, oneReply: !desc.ServerStreams}, nil
}

// followedStream notices a refusal or a dead connection on a stream, and
// ends with Unavailable when the primary it was opened on is replaced.
type followedStream struct {
	grpc.ClientStream
	f     *follower
	moved func() error
	stop  func() // releases the term's hold; once the stream has ended
	// oneReply: the stream ends with its one reply (a client stream's
	// CloseAndRecv), which RecvMsg returns without an error.
	oneReply bool
}

func (s *followedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		if pm := s.moved(); pm != nil {
			err = status.Error(codes.Unavailable, pm.Error())
		}
		s.stop()
	} else if s.oneReply {
		s.stop()
	}
	switch status.Code(err) {
	case codes.Unavailable:
		if p, ok := Refusal(err, s.ClientStream.Trailer()); ok {
			s.f.hint(p)
		} else {
			s.f.ResolveNow(resolver.ResolveNowOptions{})
		}
	case codes.DeadlineExceeded:
		s.f.stalled()
	}
	return err
}

// stalled acts on a call that ran out its deadline: the primary may be
// cut off by a partition, whose connection stalls instead of failing —
// gRPC keeps it READY until a keepalive goes unanswered (tens of seconds
// by default), and would send every call to it meanwhile. The primary is
// looked up again, and calls made until that lookup ends wait for it, so
// a new one elected meanwhile gets the next call
// (TestTimedOutCallLooksThePrimaryUpAgain). A lookup that names the same
// primary changes nothing.
func (f *follower) stalled() {
	f.mu.Lock()
	if f.looked == nil {
		f.looked, f.lookAfter = make(chan struct{}), f.begun
	}
	f.mu.Unlock()
	f.ResolveNow(resolver.ResolveNowOptions{})
}

// awaitLookup waits, within ctx, for the lookup a timed-out call asked
// for (stalled), if one is pending: a call made meanwhile then goes to the
// primary it finds, not onto the connection that stalled. A lookup ends
// within DefaultResolveTimeout, answered or not.
func (f *follower) awaitLookup(ctx context.Context) {
	f.mu.Lock()
	ch := f.looked
	f.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	case <-f.done:
	}
}
