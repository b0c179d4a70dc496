package cluster

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/errs"
)

// EmbeddedConfig configures a single-node etcd inside the hub's process:
// for a local cluster without an etcd to run (rlhub serve --embedded-etcd
// DIR). Its data is durable in Dir like any etcd member's.
type EmbeddedConfig struct {
	// Dir holds etcd's data; required.
	Dir string
	// ClientURL is where etcd serves clients; "" means
	// http://127.0.0.1:2379. Other hubs of the cluster use it as
	// --etcd.
	ClientURL string
	// PeerURL is etcd's peer address; "" means http://127.0.0.1:2380.
	// A single node has no peers, but etcd binds it.
	PeerURL string
	// StartTimeout bounds waiting for the node to serve; 0 means 30s.
	StartTimeout time.Duration
}

// Embedded is a running single-node etcd.
type Embedded struct {
	e *embed.Etcd
}

// StartEmbedded starts a single-node etcd and returns once it serves.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: embedded etcd: no data directory", errs.ErrInvalid)
	}
	if cfg.ClientURL == "" {
		cfg.ClientURL = "http://127.0.0.1:2379"
	}
	if cfg.PeerURL == "" {
		cfg.PeerURL = "http://127.0.0.1:2380"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded etcd: client URL: %v", errs.ErrInvalid, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded etcd: peer URL: %v", errs.ErrInvalid, err)
	}
	ec := embed.NewConfig()
	ec.Name = "rlhub"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	// The hub logs what matters about the cluster itself; etcd's own zap
	// logs (errors on every orderly close included) would only be noise.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded etcd: %v", errs.ErrUnavailable, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Embedded{e: e}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: embedded etcd: %v", errs.ErrUnavailable, err)
	case <-time.After(cfg.StartTimeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("%w: embedded etcd did not start within %v", errs.ErrUnavailable, cfg.StartTimeout)
	}
}

// Endpoint is the client URL to give Config.Endpoints.
func (e *Embedded) Endpoint() string { return e.e.Config().AdvertiseClientUrls[0].String() }

// Close stops the node and waits for it.
func (e *Embedded) Close() { e.e.Close() }
