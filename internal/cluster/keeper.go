package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The keeper: a member's lease renewals and the reads that prove its
// term, through whichever etcd member answers.
//
// etcd's own client keeps a lease's keep-alives on one stream, on one
// member's connection, and notices a member that went silent (its machine
// partitioned, or dead without resetting its connections) only through
// gRPC's connection keepalive, which gRPC holds to at least 10 s: a 2 s
// lease lapses long before. The keeper instead renews with one
// KeepAliveOnce at a time, through a client per etcd endpoint, taking the
// endpoints in turn, each with a deadline of a fraction of the lease
// (attempt): an endpoint that does not answer in time is passed over for
// the next at once, and skipped for a while (badFor). The session
// (concurrency.Session, whose keep-alive the keeper replaces: keptLease)
// and the term proof (Term.renew) are fed by the answers, exactly as
// from etcd's own keep-alives: etcd's answer, never the keeper's
// patience, decides that a lease lives.
type keeper struct {
	ttl     time.Duration
	attempt time.Duration
	badFor  time.Duration
	log     *slog.Logger

	main conn // the member's client: the fallback while no endpoint's is connected
	eps  []*endpoint

	ctx    context.Context // ends at close: the endpoints' clients' dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // the endpoints' dials and the keep loops (each ends with its ctx: the session's, cancelled by Session.Close)

	mu     sync.Mutex
	next   int       // the endpoint the next call starts at
	lastOK time.Time // the send time of the newest renewal etcd answered

	passed   atomic.Int64 // attempts that gave up on an endpoint (tests)
	renewals atomic.Int64 // renewals etcd answered (tests)
}

// conn is what a call through the keeper uses: a client's KV and its
// own Lease (the member's client's Lease is the keeper's: keptLease).
type conn struct {
	kv    clientv3.KV
	lease clientv3.Lease
}

// endpoint is one etcd endpoint's own client.
type endpoint struct {
	url   string
	ready chan struct{} // closed once cli or err is set
	cli   *clientv3.Client
	c     conn
	err   error
	own   bool // cli is the member's client (a single endpoint): not the keeper's to close

	badUntil time.Time // keeper.mu: skipped until then, unless every endpoint is
}

// keeperAttempt is how long one endpoint has to answer one call: a
// quarter lease, at least 250ms.
func keeperAttempt(ttl time.Duration) time.Duration { return max(ttl/4, 250*time.Millisecond) }

// newKeeper starts a client per endpoint of ec (dialled in the
// background: with etcd authentication a client fetches a token first,
// and an endpoint that does not answer must not hold up the others).
func newKeeper(cfg *Config, main *clientv3.Client, ec etcdClient) *keeper {
	ttl := time.Duration(cfg.ttlSeconds()) * time.Second
	k := &keeper{ttl: ttl, attempt: keeperAttempt(ttl), badFor: 5 * ttl, log: cfg.Logger,
		main: conn{kv: main.KV, lease: main.Lease}, lastOK: time.Now()}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	if len(ec.endpoints) == 1 {
		e := &endpoint{url: ec.endpoints[0], ready: make(chan struct{}), cli: main, c: k.main, own: true}
		close(e.ready)
		k.eps = []*endpoint{e}
		return k
	}
	for _, u := range ec.endpoints {
		e := &endpoint{url: u, ready: make(chan struct{})}
		k.eps = append(k.eps, e)
		k.wg.Go(func() {
			cli, err := newClient(cfg, ec, []string{u}, k.ctx)
			if err == nil && k.ctx.Err() != nil {
				cli.Close()
				cli, err = nil, k.ctx.Err()
			}
			e.cli, e.err = cli, err
			if cli != nil {
				e.c = conn{kv: cli.KV, lease: cli.Lease}
			}
			close(e.ready)
		})
	}
	return k
}

// close ends the dials, waits for the keep loops (their session is
// closed first) and closes the endpoints' clients.
func (k *keeper) close() {
	k.cancel()
	k.wg.Wait()
	for _, e := range k.eps {
		if e.cli != nil && !e.own {
			e.cli.Close()
		}
	}
}

// final errors are etcd's answer, the same through every endpoint.
func final(err error) bool {
	return errors.Is(err, ErrDeposed) || errors.Is(err, rpctypes.ErrLeaseNotFound)
}

// order is the endpoints for one call: in turn from next, those not
// recently passed over first.
func (k *keeper) order() []*endpoint {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	n := len(k.eps)
	start := k.next
	k.next = (k.next + 1) % n
	var good, bad []*endpoint
	for i := range n {
		e := k.eps[(start+i)%n]
		if now.Before(e.badUntil) {
			bad = append(bad, e)
		} else {
			good = append(good, e)
		}
	}
	return append(good, bad...)
}

// do runs fn through one endpoint's client after another, each with the
// attempt deadline, until one answers (nil), fn fails with etcd's final
// answer (final), or ctx ends. While no endpoint's client is connected
// yet, fn runs on the member's client.
func (k *keeper) do(ctx context.Context, fn func(context.Context, conn) error) error {
	var last error
	tried := 0
	for _, e := range k.order() {
		select {
		case <-e.ready:
		default:
			continue
		}
		if e.err != nil {
			last = fmt.Errorf("etcd %s: %w", e.url, e.err)
			continue
		}
		tried++
		actx, cancel := context.WithTimeout(ctx, k.attempt)
		err := fn(actx, e.c)
		cancel()
		if err == nil {
			k.answered(e)
			return nil
		}
		if final(err) || ctx.Err() != nil {
			return err
		}
		last = fmt.Errorf("etcd %s: %w", e.url, err)
		k.passOver(e, err)
	}
	if tried == 0 {
		return fn(ctx, k.main)
	}
	return last
}

func (k *keeper) answered(e *endpoint) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !e.badUntil.IsZero() {
		e.badUntil = time.Time{}
		k.log.Info("cluster: etcd endpoint answers again", "endpoint", e.url)
	}
}

func (k *keeper) passOver(e *endpoint, err error) {
	k.passed.Add(1)
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.badUntil.IsZero() && len(k.eps) > 1 {
		k.log.Warn("cluster: etcd endpoint did not answer in time; using the others", "endpoint", e.url, "err", err)
	}
	e.badUntil = time.Now().Add(k.badFor)
}

// renewed records a renewal etcd answered, sent at sent.
func (k *keeper) renewed(sent time.Time) {
	k.renewals.Add(1)
	k.mu.Lock()
	if sent.After(k.lastOK) {
		k.lastOK = sent
	}
	k.mu.Unlock()
}

// giveUp is how long after its newest answered renewal a lease is taken
// as gone while no endpoint answers at all: the lease's TTL, plus the
// time etcd may take to elect a leader (etcd extends every lease when a
// new leader takes over, by its election timeout, 1 s by default, so a
// lease outlives an election, which takes 1–2 election timeouts and more
// on a loaded machine). Waiting longer than the TTL never extends a
// term: the term proof (Term) counts from the renewals etcd answered.
func (k *keeper) giveUp() time.Duration { return k.ttl + max(k.ttl, 5*time.Second) }

// keepAliveOnce renews lease id once through the endpoints: the answer's
// TTL, ErrLeaseNotFound once etcd says the lease is gone, or an error
// when no endpoint answered.
func (k *keeper) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	sent := time.Now()
	var resp *clientv3.LeaseKeepAliveResponse
	err := k.do(ctx, func(ctx context.Context, c conn) error {
		r, err := c.lease.KeepAliveOnce(ctx, id)
		if err == nil && r.TTL <= 0 {
			err = rpctypes.ErrLeaseNotFound
		}
		resp = r
		return err
	})
	if err != nil {
		return nil, err
	}
	k.renewed(sent)
	return resp, nil
}

// keep renews lease id every third of its TTL (as etcd's client does)
// and sends each answer on out (dropped if out is full); it closes out
// when ctx ends, when etcd says the lease is gone, or when no endpoint
// answered for giveUp.
func (k *keeper) keep(ctx context.Context, id clientv3.LeaseID, out chan<- *clientv3.LeaseKeepAliveResponse) {
	defer close(out)
	every := max(k.ttl/3, 100*time.Millisecond)
	for {
		resp, err := k.keepAliveOnce(ctx, id)
		wait := every
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			select {
			case out <- resp:
			default:
			}
		case final(err):
			k.log.Warn("cluster: etcd: the lease is gone", "err", err)
			return
		default:
			k.mu.Lock()
			silent := time.Since(k.lastOK)
			k.mu.Unlock()
			if silent > k.giveUp() {
				k.log.Warn("cluster: no etcd endpoint renewed the lease; taking it as lost", "silent", silent.Round(time.Millisecond), "err", err)
				return
			}
			wait = min(every, 100*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// keptLease is the member's client's Lease with the keep-alive (the
// session's) and the revocation done by the keeper.
type keptLease struct {
	clientv3.Lease
	k *keeper
}

func (l *keptLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	out := make(chan *clientv3.LeaseKeepAliveResponse, 16)
	l.k.wg.Go(func() { l.k.keep(ctx, id, out) })
	return out, nil
}

func (l *keptLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	return l.k.keepAliveOnce(ctx, id)
}

func (l *keptLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	var resp *clientv3.LeaseRevokeResponse
	err := l.k.do(ctx, func(ctx context.Context, c conn) error {
		r, err := c.lease.Revoke(ctx, id)
		resp = r
		return err
	})
	return resp, err
}
