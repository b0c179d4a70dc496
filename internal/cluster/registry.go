package cluster

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rlhub/rlhub/internal/errs"
)

// Reader is a long-lived read-only view of a cluster for clients: it keeps
// one etcd connection (Read opens one per call) and answers where the
// primary is. Safe for concurrent use.
type Reader struct {
	cfg Config
	cli *clientv3.Client

	once sync.Once
	err  error
}

// OpenReader connects to etcd with cfg (Addr and ID unused). It does not
// wait for etcd: the first Leader call does, under its context.
func OpenReader(cfg Config) (*Reader, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	cli, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	return &Reader{cfg: cfg, cli: cli}, nil
}

// Name is the cluster's name.
func (r *Reader) Name() string { return r.cfg.Cluster }

// Leader is the current primary, ErrNoLeader while an election runs, or
// Unavailable when etcd does not answer within ctx.
func (r *Reader) Leader(ctx context.Context) (Leader, error) {
	st, err := status(ctx, r.cli, &r.cfg)
	if err != nil {
		return Leader{}, err
	}
	if st.Primary == nil {
		return Leader{}, ErrNoLeader
	}
	return *st.Primary, nil
}

// Status reads the members and the primary.
func (r *Reader) Status(ctx context.Context) (Status, error) { return status(ctx, r.cli, &r.cfg) }

// Close closes the etcd connection. Safe to call more than once.
func (r *Reader) Close() error {
	r.once.Do(func() {
		if err := r.cli.Close(); err != nil {
			r.err = fmt.Errorf("%w: cluster: close: %v", errs.ErrUnavailable, err)
		}
	})
	return r.err
}
