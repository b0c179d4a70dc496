package dial

import (
	"context"
	"fmt"
	"sync"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
)

// CollectorTarget is where a weight collector of model on this machine
// connects: for an etcd:// target, the relay announced in etcd for model
// on this host (`relay --etcd`, matched by cluster.HostName:
// cluster.Reader.LocalRelay), with relay true; otherwise — no relay here,
// or a target that is not etcd — target itself (the hub, or the cluster's
// primary, followed). When etcd cannot be read it returns target and the
// error: the caller may use the hub and log it. A collector whose relay
// dies calls it again: once the relay's lease has expired it gets the hub.
func (c Config) CollectorTarget(ctx context.Context, target, model string) (addr string, relay bool, err error) {
	t, err := ParseTarget(target)
	if err != nil {
		return "", false, err
	}
	if len(t.Etcd) == 0 {
		return target, false, nil
	}
	r, err := cluster.OpenReader(cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, DialTimeout: DefaultResolveTimeout, Security: c.Etcd})
	if err != nil {
		return target, false, fmt.Errorf("dial: find the relay of %s: %w", model, err)
	}
	defer r.Close()
	s, ok, err := r.LocalRelay(ctx, model, "")
	if err != nil {
		return target, false, fmt.Errorf("dial: find the relay of %s: %w", model, err)
	}
	if !ok {
		return target, false, nil
	}
	return s.Addr, true, nil
}

// RelayFinder keeps where this machine's relay of one model is, from one
// etcd connection and one watch of the relays' announcements, so that a
// collector that looks again every second (wsync.Failover's probe, for
// hundreds of collectors) costs etcd nothing per look: Local answers from
// memory once the first list has arrived. Close stops the watch and waits
// for it.
type RelayFinder struct {
	model, host string
	r           *cluster.Reader
	stop        context.CancelFunc
	done        chan struct{}
	listed      chan struct{} // closed by the first list

	mu    sync.Mutex
	relay cluster.ServiceInfo
	found bool
}

// FindRelays starts a RelayFinder for model on this machine (matched by
// cluster.HostName, as cluster.Reader.LocalRelay) in the cluster that target
// (etcd://…) names. A target that is not etcd has no relays: it returns
// nil, and a nil *RelayFinder finds none.
func (c Config) FindRelays(target, model string) (*RelayFinder, error) {
	t, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	if len(t.Etcd) == 0 {
		return nil, nil
	}
	host, err := cluster.HostName()
	if err != nil {
		return nil, fmt.Errorf("dial: find the relay of %s: %w", model, err)
	}
	r, err := cluster.OpenReader(cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, DialTimeout: DefaultResolveTimeout, Security: c.Etcd})
	if err != nil {
		return nil, fmt.Errorf("dial: find the relay of %s: %w", model, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	f := &RelayFinder{model: model, host: host, r: r, stop: stop, done: make(chan struct{}), listed: make(chan struct{})}
	go func() {
		defer close(f.done)
		_ = r.WatchServices(ctx, cluster.KindRelay, f.take)
	}()
	return f, nil
}

// take is the watch's callback: the first relay (by id) of the model on
// this host.
func (f *RelayFinder) take(ss []cluster.ServiceInfo) {
	relay, found := cluster.PickRelay(ss, f.model, f.host)
	f.mu.Lock()
	f.relay, f.found = relay, found
	f.mu.Unlock()
	select {
	case <-f.listed:
	default:
		close(f.listed)
	}
}

// Local is the address of the relay of the model announced on this host,
// and false when there is none. Before the watch's first list it waits for
// it, at most until ctx ends (then an Unavailable error: etcd did not
// answer); after, it answers from memory, as of the watch's last change.
func (f *RelayFinder) Local(ctx context.Context) (addr string, ok bool, err error) {
	if f == nil {
		return "", false, nil
	}
	select {
	case <-f.listed:
	case <-ctx.Done():
		return "", false, fmt.Errorf("%w: dial: find the relay of %s: no answer from etcd yet: %v", errs.ErrUnavailable, f.model, ctx.Err())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.relay.Addr, f.found, nil
}

// Close stops the watch, waits for it and closes the etcd connection.
// Safe on nil and more than once.
func (f *RelayFinder) Close() error {
	if f == nil {
		return nil
	}
	f.stop()
	<-f.done
	return f.r.Close()
}
