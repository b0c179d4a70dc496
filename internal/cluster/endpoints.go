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

	"github.com/rlhub/rlhub/internal/errs"
)

// Calls through whichever etcd member answers.
//
// etcd's client spreads its calls over the endpoints' connections, keeps
// a stream (a watch, a lease's keep-alives) on one, and notices a member
// that went silent — its machine partitioned, or stopped, its sockets
// still open — only through gRPC's connection keepalive, which gRPC holds
// to at least 10 s: a 2 s lease lapses long before, and a primary that
// moved meanwhile is missed as long. endpoints keeps a client per etcd
// endpoint instead, for both kinds of use:
//   - a call (do) goes through one endpoint's client after another, each
//     with a deadline (attempt): an endpoint that does not answer in time
//     is passed over for the next at once, and tried last for badFor;
//   - a watch (client) stays on one endpoint's client and gives it up
//     itself when its member falls silent (watch.go), and says so
//     (passOver), so the calls try that one last too.
//
// A member's keeper (keeper.go) renews its lease and proves its term
// through one; a Reader reads and watches through one. Its clients are
// dialled in the background (with etcd authentication a client fetches a
// token first, and an endpoint that does not answer must not hold up the
// others): all at once for a member, on first use for a Reader.
type endpoints struct {
	attempt time.Duration
	badFor  time.Duration
	log     *slog.Logger
	cfg     *Config
	ec      etcdClient

	main conn // the owner's client: the fallback while no endpoint's is connected
	eps  []*endpoint

	ctx    context.Context // ends at close: the dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // the dials

	mu     sync.Mutex
	next   int  // the endpoint the next call starts at
	closed bool // close began: no more dials

	passed atomic.Int64 // attempts that gave up on an endpoint (tests)
}

// conn is what a call through endpoints uses: a client's KV and its own
// Lease (a member's client's Lease is its keeper's: keptLease).
type conn struct {
	kv    clientv3.KV
	lease clientv3.Lease
}

// endpoint is one etcd endpoint's own client.
type endpoint struct {
	url   string
	start sync.Once
	ready chan struct{} // closed once cli or err is set
	cli   *clientv3.Client
	c     conn
	err   error
	own   bool // cli is the owner's client (a single endpoint): not ours to close

	badUntil time.Time // endpoints.mu: tried last until then
}

// newEndpoints is a client per endpoint of ec, main (with its own
// connection c) standing in for them while none is connected, and alone
// when ec has one endpoint. eager dials them all now.
func newEndpoints(cfg *Config, ec etcdClient, main *clientv3.Client, c conn, attempt, badFor time.Duration, eager bool) *endpoints {
	s := &endpoints{attempt: attempt, badFor: badFor, log: cfg.Logger, cfg: cfg, ec: ec, main: c}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if len(ec.endpoints) == 1 {
		e := &endpoint{url: ec.endpoints[0], ready: make(chan struct{}), cli: main, c: c, own: true}
		e.start.Do(func() { close(e.ready) })
		s.eps = []*endpoint{e}
		return s
	}
	for _, u := range ec.endpoints {
		s.eps = append(s.eps, &endpoint{url: u, ready: make(chan struct{})})
	}
	if eager {
		for _, e := range s.eps {
			s.dial(e)
		}
	}
	return s
}

// dial starts e's client's dial, once.
func (s *endpoints) dial(e *endpoint) {
	e.start.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			e.err = fmt.Errorf("%w: cluster: the etcd clients are closed", errs.ErrUnavailable)
			close(e.ready)
			return
		}
		s.wg.Go(func() {
			cli, err := newClient(s.cfg, s.ec, []string{e.url}, s.ctx)
			if err == nil && s.ctx.Err() != nil {
				cli.Close()
				cli, err = nil, s.ctx.Err()
			}
			e.cli, e.err = cli, err
			if cli != nil {
				e.c = conn{kv: cli.KV, lease: cli.Lease}
			}
			close(e.ready)
		})
	})
}

// close ends the dials and closes the endpoints' clients; the caller
// has ended every use of them.
func (s *endpoints) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	var err error
	for _, e := range s.eps {
		if e.cli != nil && !e.own {
			err = errors.Join(err, e.cli.Close())
		}
	}
	return err
}

// final errors are etcd's answer, the same through every endpoint.
func final(err error) bool {
	return errors.Is(err, ErrDeposed) || errors.Is(err, rpctypes.ErrLeaseNotFound)
}

// order is the endpoints for one call: in turn from next, those not
// recently passed over first.
func (s *endpoints) order() []*endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	n := len(s.eps)
	start := s.next
	s.next = (s.next + 1) % n
	var good, bad []*endpoint
	for i := range n {
		e := s.eps[(start+i)%n]
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
// yet, fn runs on the main client, with ctx alone.
func (s *endpoints) do(ctx context.Context, fn func(context.Context, conn) error) error {
	var last error
	tried := 0
	for _, e := range s.order() {
		s.dial(e)
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
		actx, cancel := context.WithTimeout(ctx, s.attempt)
		err := fn(actx, e.c)
		cancel()
		if err == nil {
			s.answered(e)
			return nil
		}
		if final(err) || ctx.Err() != nil {
			return err
		}
		last = fmt.Errorf("etcd %s: %w", e.url, err)
		s.passOver(e, err)
	}
	if tried == 0 {
		return fn(ctx, s.main)
	}
	return last
}

// client is endpoint i's client, once dialled (within ctx): a watch's.
func (s *endpoints) client(ctx context.Context, i int) (*clientv3.Client, error) {
	e := s.eps[i]
	s.dial(e)
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		return nil, fmt.Errorf("etcd %s: %w", e.url, e.err)
	}
	return e.cli, nil
}

func (s *endpoints) answered(e *endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !e.badUntil.IsZero() {
		e.badUntil = time.Time{}
		s.log.Info("cluster: etcd endpoint answers again", "endpoint", e.url)
	}
}

// passOver tries e last for badFor: it did not answer a call in time, or
// a watch on it heard nothing.
func (s *endpoints) passOver(e *endpoint, err error) {
	s.passed.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.badUntil.IsZero() && len(s.eps) > 1 {
		s.log.Warn("cluster: etcd endpoint did not answer in time; using the others", "endpoint", e.url, "err", err)
	}
	e.badUntil = time.Now().Add(s.badFor)
}
