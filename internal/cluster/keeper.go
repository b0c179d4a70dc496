package cluster

import (
	"context"
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
// member's connection, and notices a member that went silent only through
// gRPC's connection keepalive (endpoints.go): a 2 s lease lapses long
// before. The keeper instead renews with one KeepAliveOnce at a time
// through its endpoints (do), each attempt with a deadline of a fraction
// of the lease. The session (concurrency.Session, whose keep-alive the
// keeper replaces: keptLease) and the term proof (Term.renew) are fed by
// the answers, exactly as from etcd's own keep-alives: etcd's answer,
// never the keeper's patience, decides that a lease lives.
type keeper struct {
	*endpoints
	ttl time.Duration

	loops sync.WaitGroup // the keep loops (each ends with its ctx: the session's, cancelled by Session.Close)

	lastMu sync.Mutex
	lastOK time.Time // lastMu: the send time of the newest renewal etcd answered

	renewals atomic.Int64 // renewals etcd answered (tests)
}

// keeperAttempt is how long one endpoint has to answer one call: a
// quarter lease, at least 250ms.
func keeperAttempt(ttl time.Duration) time.Duration { return max(ttl/4, 250*time.Millisecond) }

// newKeeper starts a client per endpoint of ec, main standing in for
// them until one is connected.
func newKeeper(cfg *Config, main *clientv3.Client, ec etcdClient) *keeper {
	ttl := time.Duration(cfg.ttlSeconds()) * time.Second
	c := conn{kv: main.KV, lease: main.Lease}
	return &keeper{endpoints: newEndpoints(cfg, ec, main, c, keeperAttempt(ttl), 5*ttl, true), ttl: ttl, lastOK: time.Now()}
}

// close waits for the keep loops (their session is closed first), then
// ends the dials and closes the endpoints' clients.
func (k *keeper) close() {
	k.loops.Wait()
	_ = k.endpoints.close()
}

// renewed records a renewal etcd answered, sent at sent.
func (k *keeper) renewed(sent time.Time) {
	k.renewals.Add(1)
	k.lastMu.Lock()
	if sent.After(k.lastOK) {
		k.lastOK = sent
	}
	k.lastMu.Unlock()
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
			k.lastMu.Lock()
			silent := time.Since(k.lastOK)
			k.lastMu.Unlock()
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
	l.k.loops.Go(func() { l.k.keep(ctx, id, out) })
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
