package dial

import (
	"context"
	"fmt"

	"github.com/rlhub/rlhub/internal/cluster"
)

// CollectorTarget is where a weight collector of model on this machine
// connects: for an etcd:// target, the relay announced in etcd for model
// on this host (`relay --etcd`, matched by hostname:
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
