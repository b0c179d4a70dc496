package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/rlhub/rlhub/internal/errs"
)

// Reader is a long-lived read-only view of a cluster for clients: it keeps
// its etcd connections (Read opens one per call) and answers where the
// primary is. Its reads and watches go through whichever etcd member
// answers (endpoints.go). Safe for concurrent use.
type Reader struct {
	cfg Config
	cli *clientv3.Client
	eps *endpoints // a client per endpoint, dialled on first use

	once sync.Once
	err  error
}

// readerAttempt is how long one etcd endpoint has to answer a Reader's
// read before the next is asked, and readerBadFor how long one that did
// not is asked last.
const (
	readerAttempt = time.Second
	readerBadFor  = 10 * time.Second
)

// OpenReader connects to etcd with cfg (Addr and ID unused). It does not
// wait for etcd: the first Leader call does, under its context.
func OpenReader(cfg Config) (*Reader, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	cli, ec, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	r := &Reader{cfg: cfg, cli: cli}
	r.eps = newEndpoints(&r.cfg, ec, cli, conn{kv: cli.KV, lease: cli.Lease}, readerAttempt, readerBadFor, false)
	return r, nil
}

// read runs fn through the endpoints (endpoints.do) and, when none
// answered within its attempt, once more through the Reader's own client
// with what is left of ctx: an etcd slower than the attempt everywhere
// (a loaded machine) is still waited for, within ctx. With one endpoint
// there is none to pass to: fn runs on the Reader's client, within ctx.
func (r *Reader) read(ctx context.Context, fn func(context.Context, clientv3.KV) error) error {
	if len(r.eps.eps) == 1 {
		return fn(ctx, r.cli)
	}
	err := r.eps.do(ctx, func(ctx context.Context, c conn) error { return fn(ctx, c.kv) })
	if err != nil && ctx.Err() == nil {
		err = fn(ctx, r.cli)
	}
	return err
}

// Name is the cluster's name.
func (r *Reader) Name() string { return r.cfg.Cluster }

// Leader is the current primary, ErrNoLeader while an election runs, or
// Unavailable when etcd does not answer within ctx.
func (r *Reader) Leader(ctx context.Context) (Leader, error) {
	st, err := r.Status(ctx)
	if err != nil {
		return Leader{}, err
	}
	if st.Primary == nil {
		return Leader{}, ErrNoLeader
	}
	return *st.Primary, nil
}

// Status reads the members and the primary.
func (r *Reader) Status(ctx context.Context) (Status, error) {
	var st Status
	err := r.read(ctx, func(ctx context.Context, kv clientv3.KV) error {
		var err error
		st, err = status(ctx, kv, &r.cfg)
		return err
	})
	return st, err
}

// Close closes the etcd connections. Safe to call more than once.
func (r *Reader) Close() error {
	r.once.Do(func() {
		err := r.eps.close()
		if cerr := r.cli.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if err != nil {
			r.err = fmt.Errorf("%w: cluster: close: %v", errs.ErrUnavailable, err)
		}
	})
	return r.err
}

// ServiceInfo is a relay or a hub of secondary reducers announced in etcd
// under /rlhub/CLUSTER/services/KIND/ID, for the clients that use it to
// find (Reader.Services, Reader.WatchServices, LocalRelay). The JSON form
// is read by the Python client too (rlhub.discover).
type ServiceInfo struct {
	Kind  string `json:"kind"`
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Model string `json:"model,omitempty"`
	// Host is the hostname of the machine the service runs on (Announce
	// fills it with os.Hostname when ""): collectors look for the relay on
	// their own host.
	Host string `json:"host,omitempty"`
	// Shm is a relay's shared-memory segment (a collector on Host may read
	// it instead of the relay's stream); "" when it has none.
	Shm string `json:"shm,omitempty"`
	// Secondaries are the ids of the secondary reducers served at Addr
	// (KindSecondary): a client pushes to (Addr, id).
	Secondaries []string `json:"secondaries,omitempty"`
}

// Service kinds.
const (
	KindRelay     = "relay"
	KindSecondary = "secondary"
)

// Announcement is a service's registration: it lives as long as its lease
// (kept alive until Close, or until the process dies and the lease's TTL
// passes).
type Announcement struct {
	cli  *clientv3.Client
	k    *keeper // the lease's renewals (keeper.go)
	sess *concurrency.Session
	once sync.Once
	err  error
}

// Announce registers info under a fresh lease of cfg.LeaseTTL (cfg's
// Endpoints, Cluster, LeaseTTL and DialTimeout are used; ID and Addr are
// info's). An announcement with the same kind and id that is still there
// is waited out for its lease's TTL (and a second): a process restarted
// after kill -9 finds its predecessor's entry, which lapses within that
// time. One still there after it belongs to a live process and is refused
// (errs.ErrExists).
func Announce(ctx context.Context, cfg Config, info ServiceInfo) (*Announcement, error) {
	cfg.ID, cfg.Addr = info.ID, info.Addr
	if info.Host == "" {
		h, err := HostName()
		if err != nil {
			return nil, err
		}
		info.Host = h
	}
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	if !namePattern.MatchString(info.Kind) {
		return nil, fmt.Errorf("%w: cluster: service kind must match %s", errs.ErrInvalid, namePattern)
	}
	cli, ec, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	k, sess, err := lease(ctx, &cfg, cli, ec)
	if err != nil {
		cli.Close()
		return nil, etcdError(cfg.Endpoints, err)
	}
	a := &Announcement{cli: cli, k: k, sess: sess}
	val, _ := json.Marshal(info)
	key := path.Join(cfg.prefix(), "services", info.Kind, info.ID)
	for waited := false; ; waited = true {
		var resp *clientv3.TxnResponse
		resp, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(sess.Lease()))).
			Commit()
		if err != nil {
			err = etcdError(cfg.Endpoints, err)
			break
		}
		if resp.Succeeded {
			break
		}
		if !waited {
			cfg.Logger.Info("cluster: waiting for an earlier announcement with this id to lapse", "kind", info.Kind, "id", info.ID)
			var gone bool
			if gone, err = waitGone(ctx, cli, key); err != nil {
				err = etcdError(cfg.Endpoints, err)
				break
			}
			if gone {
				continue
			}
		}
		err = fmt.Errorf("%w: cluster: %s %q is announced by a live process (its entry outlived its lease's TTL)", errs.ErrExists, info.Kind, info.ID)
		break
	}
	if err != nil {
		a.Close()
		return nil, err
	}
	cfg.Logger.Info("cluster: announced", "kind", info.Kind, "id", info.ID, "addr", info.Addr, "model", info.Model)
	return a, nil
}

// waitGone waits for key to be deleted, for as long as the lease it is
// under could outlive its holder (its granted TTL, and a second): true once
// it is gone, false when it is still there after that.
func waitGone(ctx context.Context, cli *clientv3.Client, key string) (bool, error) {
	g, err := cli.Get(ctx, key)
	if err != nil {
		return false, err
	}
	if len(g.Kvs) == 0 {
		return true, nil
	}
	wait := 2 * time.Second
	if id := g.Kvs[0].Lease; id != 0 {
		if l, err := cli.TimeToLive(ctx, clientv3.LeaseID(id)); err == nil && l.GrantedTTL > 0 {
			wait = time.Duration(l.GrantedTTL) * time.Second
		}
	}
	wctx, cancel := context.WithTimeout(ctx, wait+time.Second)
	defer cancel()
	for wr := range cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(g.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			if wctx.Err() != nil {
				break // the wait is over: said below
			}
			return false, err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return true, nil
			}
		}
	}
	return false, ctx.Err()
}

// Lost closes when the announcement's lease is gone.
func (a *Announcement) Lost() <-chan struct{} { return a.sess.Done() }

// Close revokes the lease (the entry goes at once) and closes the etcd
// client. Safe to call more than once.
func (a *Announcement) Close() error {
	a.once.Do(func() {
		err := a.sess.Close()
		select {
		case <-a.sess.Done():
			err = nil // revoked, or already gone
		default:
		}
		a.k.close()
		a.err = errors.Join(err, a.cli.Close())
	})
	return a.err
}

// Services lists the live announcements of kind ("" every kind) for model
// ("" any model), by id.
func (r *Reader) Services(ctx context.Context, kind, model string) ([]ServiceInfo, error) {
	p := path.Join(r.cfg.prefix(), "services") + "/"
	if kind != "" {
		p = path.Join(p, kind) + "/"
	}
	var resp *clientv3.GetResponse
	err := r.read(ctx, func(ctx context.Context, kv clientv3.KV) error {
		var err error
		resp, err = kv.Get(ctx, p, clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, etcdError(r.cfg.Endpoints, err)
	}
	var out []ServiceInfo
	for _, kv := range resp.Kvs {
		var s ServiceInfo
		if json.Unmarshal(kv.Value, &s) == nil && (model == "" || s.Model == model) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind+"/"+out[i].ID < out[j].Kind+"/"+out[j].ID })
	return out, nil
}

// WatchServices calls fn with every live announcement of kind ("" every
// kind), by id, first with the list at the start and then after each
// change (an announcement put, withdrawn, or dropped with its lease), until
// ctx ends; it returns ctx's error. A watch that fails (etcd restarting, a
// compacted revision) is opened again from a fresh list, after a back-off.
// fn runs on WatchServices' goroutine, one call at a time.
func (r *Reader) WatchServices(ctx context.Context, kind string, fn func([]ServiceInfo)) error {
	p := path.Join(r.cfg.prefix(), "services") + "/"
	if kind != "" {
		p = path.Join(p, kind) + "/"
	}
	var live map[string]ServiceInfo
	return r.watchPrefix(ctx, p, nil, func(_ context.Context, _ *clientv3.Client, resp *clientv3.GetResponse) error {
		live = map[string]ServiceInfo{}
		for _, kv := range resp.Kvs {
			var s ServiceInfo
			if json.Unmarshal(kv.Value, &s) == nil {
				live[string(kv.Key)] = s
			}
		}
		fn(sortedServices(live))
		return nil
	}, func(_ context.Context, _ *clientv3.Client, events []*clientv3.Event) error {
		for _, ev := range events {
			var s ServiceInfo
			if ev.Type == clientv3.EventTypeDelete {
				delete(live, string(ev.Kv.Key))
			} else if json.Unmarshal(ev.Kv.Value, &s) == nil {
				live[string(ev.Kv.Key)] = s
			}
		}
		fn(sortedServices(live))
		return nil
	})
}

// WatchLeader calls fn with the primary (the election's leader) at the
// start and again after each change of the election's keys (a term won,
// a leader's key deleted or dropped with its lease), until ctx ends; it
// returns ctx's error. While an election runs there is no leader and fn is
// not called. A watch that fails, or whose etcd member falls silent, is
// opened again (watchPrefix). fn runs on WatchLeader's goroutine, one call
// at a time; it may see the same leader twice.
func (r *Reader) WatchLeader(ctx context.Context, fn func(Leader)) error {
	// The leader is read through the member the watch is on, within the
	// watch's patience: a read stuck on a silent member would hold the
	// watch as long as the member's connection looks alive.
	leader := func(ctx context.Context, cli *clientv3.Client) error {
		rctx, cancel := context.WithTimeout(ctx, watchSilence)
		defer cancel()
		st, err := status(rctx, cli, &r.cfg)
		if err != nil {
			return err
		}
		if st.Primary != nil {
			fn(*st.Primary)
		}
		return nil
	}
	return r.watchPrefix(ctx, r.cfg.electionPrefix(),
		[]clientv3.OpOption{clientv3.WithKeysOnly(), clientv3.WithLimit(1)},
		func(ctx context.Context, cli *clientv3.Client, _ *clientv3.GetResponse) error {
			return leader(ctx, cli)
		},
		func(ctx context.Context, cli *clientv3.Client, _ []*clientv3.Event) error { return leader(ctx, cli) })
}

func sortedServices(m map[string]ServiceInfo) []ServiceInfo {
	out := make([]ServiceInfo, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind+"/"+out[i].ID < out[j].Kind+"/"+out[j].ID })
	return out
}

// LocalRelay is the relay announced for model on host ("" means this
// machine's, HostName), and false when there is none (a collector then
// uses the hub). Of several, the first by id.
func (r *Reader) LocalRelay(ctx context.Context, model, host string) (ServiceInfo, bool, error) {
	if host == "" {
		h, err := HostName()
		if err != nil {
			return ServiceInfo{}, false, err
		}
		host = h
	}
	ss, err := r.Services(ctx, KindRelay, model)
	if err != nil {
		return ServiceInfo{}, false, err
	}
	s, ok := PickRelay(ss, model, host)
	return s, ok, nil
}

// HostEnv, when set, names the machine this process runs on (HostName).
const HostEnv = "RLHUB_HOST"

// hostPattern is what HostEnv may hold: a host or node name.
var hostPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// HostName is the name of the machine this process runs on, as a relay
// announces it (ServiceInfo.Host) and a collector looks for it
// (PickRelay): $RLHUB_HOST when set, else the hostname. In Kubernetes a
// pod's hostname is the pod's own, so relay and collector pods set
// RLHUB_HOST to the node's name (the downward API's spec.nodeName) to
// find each other. A value that is not a host name is an error (it is
// not shown: the environment is unbounded input).
func HostName() (string, error) {
	if h := os.Getenv(HostEnv); h != "" {
		if !hostPattern.MatchString(h) {
			return "", fmt.Errorf("%w: cluster: $%s (%d bytes) is not a host name: letters, digits, '.', '-' and '_', at most 253", errs.ErrInvalid, HostEnv, len(h))
		}
		return h, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("%w: cluster: this machine's hostname: %v (set $%s)", errs.ErrInvalid, err, HostEnv)
	}
	return h, nil
}

// PickRelay is, of announcements ss (sorted by kind and id, as Services
// and WatchServices give them), the first relay of model on host, and
// false when there is none: LocalRelay's choice, for a caller that keeps
// the list from a watch.
func PickRelay(ss []ServiceInfo, model, host string) (ServiceInfo, bool) {
	for _, s := range ss {
		if s.Kind == KindRelay && s.Model == model && s.Host == host {
			return s, true
		}
	}
	return ServiceInfo{}, false
}
