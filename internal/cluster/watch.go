package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rlhub/rlhub/internal/errs"
)

// A Reader's watches (WatchLeader, WatchServices) and the member that
// stops answering.
//
// etcd's client sends a watch stream to one member's connection and
// leaves it there while the connection looks alive. A member whose
// machine is cut off, or which is stopped, keeps its sockets open and
// answers nothing: the watch hears nothing until gRPC's connection
// keepalive gives up (the Reader's 5 s, raised to gRPC's 10 s floor, plus
// 2 s), and a primary that moved meanwhile — the primary's own machine
// cut, with the etcd member it runs — is missed for that long. So every
// watchProbe a watch asks its member for a progress notification
// (RequestProgress, which etcd answers at once on the watch stream), and
// a watch that has heard nothing — no event, no notification — for
// watchSilence gives that member up: the watch, and the reads it makes,
// move to the next endpoint, each through a client of its own (one
// client's streams would stay on the silent member's connection; the
// Reader's endpoints), and the Reader's reads try that member last.
const (
	watchProbe   = 500 * time.Millisecond
	watchSilence = 2 * time.Second
)

// watchPrefix reads the keys under p (with get's options) and hands the
// answer to read, then watches p from the next revision and hands each
// batch of events to each, until ctx ends; it returns ctx's error. read
// and each run on the caller's goroutine with the client the watch uses,
// for any read they make (bounded by watchSilence, as the first read
// is). A watch that fails — etcd restarting, a compacted revision, a
// member that lost its leader, a member silent for watchSilence, read or
// each failing — starts again from a fresh read on the next endpoint,
// after a back-off of 50 ms, doubling to 1 s.
func (r *Reader) watchPrefix(ctx context.Context, p string, get []clientv3.OpOption,
	read func(context.Context, *clientv3.Client, *clientv3.GetResponse) error,
	each func(context.Context, *clientv3.Client, []*clientv3.Event) error,
) error {
	backoff := 50 * time.Millisecond
	// Each watch starts at an endpoint of its own, so that a fleet's
	// watches spread over the members as etcd's client spread them.
	n := len(r.eps.eps)
	for ep := rand.IntN(n); ; ep = (ep + 1) % n {
		cli, err := r.eps.client(ctx, ep)
		if err == nil {
			err = r.watchOn(ctx, cli, p, get, read, each, &backoff)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if n > 1 {
			r.eps.passOver(r.eps.eps[ep], fmt.Errorf("watch: %w", err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// watchOn is one watch through cli: the read, then the events until the
// watch fails or its member falls silent. It resets *backoff once the
// read succeeded.
func (r *Reader) watchOn(ctx context.Context, cli *clientv3.Client, p string, get []clientv3.OpOption,
	read func(context.Context, *clientv3.Client, *clientv3.GetResponse) error,
	each func(context.Context, *clientv3.Client, []*clientv3.Event) error, backoff *time.Duration,
) error {
	gctx, cancel := context.WithTimeout(ctx, watchSilence)
	resp, err := cli.Get(gctx, p, append([]clientv3.OpOption{clientv3.WithPrefix()}, get...)...)
	cancel()
	if err != nil {
		return err
	}
	if err := read(ctx, cli, resp); err != nil {
		return err
	}
	*backoff = 50 * time.Millisecond
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	probe := time.NewTicker(watchProbe)
	defer probe.Stop()
	heard := time.Now()
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return errors.New("the watch ended")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			heard = time.Now()
			if len(wr.Events) > 0 {
				if err := each(ctx, cli, wr.Events); err != nil {
					return err
				}
			}
		case <-probe.C:
			if silent := time.Since(heard); silent > watchSilence {
				return fmt.Errorf("%w: the etcd member answered nothing for %v", errs.ErrUnavailable, silent.Round(time.Millisecond))
			}
			// Answered on wch; the stream is the watch's (its context's
			// metadata names it).
			pctx, pcancel := context.WithTimeout(wctx, watchProbe)
			_ = cli.RequestProgress(pctx)
			pcancel()
		}
	}
}
