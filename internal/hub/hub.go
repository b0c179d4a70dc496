// Package hub assembles rlhub's gRPC services into one server: the
// embedded single-machine hub that `rlhub serve` runs and that tests and
// `rlhub train` start in-process.
//
// To use it:
//  1. Fill a Config (the zero value listens on DefaultListen with an
//     in-memory data directory disabled: set DataDir to persist).
//  2. New(cfg) opens every service (loading checkpoints from DataDir).
//  3. Run(ctx) serves until ctx is done, then stops gracefully, with a hard
//     stop after Config.StopTimeout, and closes every service.
//     Or Start() + Close() for tests that want the address first.
package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/tap"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/netsec"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	"github.com/rlhub/rlhub/internal/wire/connlimit"
	"github.com/rlhub/rlhub/internal/wire/messagedue"
	"github.com/rlhub/rlhub/internal/wire/streamcap"
	"github.com/rlhub/rlhub/internal/wsync"
)

// DefaultListen is the default gRPC listen address.
const DefaultListen = "127.0.0.1:7470"

// The owners the hub's in-process services write the store as (store
// rule 6): a model the reducer reduces, or an ARS run's policy, takes
// pushes only from its owner.
const (
	OwnerReducer = "reducer"
	OwnerARS     = "ars"
)

// Config configures a hub.
type Config struct {
	// Listen is the TCP address to serve on; "" means DefaultListen. Use
	// "127.0.0.1:0" for a free port.
	Listen string
	// Advertise, when set, is the address other machines are told to
	// dial (etcd, the reducer's secondaries list): HOST or HOST:PORT, the
	// bound port when it has none (netsec.Advertised). "" means Listen's
	// host: set it when Listen names no machine (0.0.0.0 in a Kubernetes
	// pod, reached by its stable DNS name).
	Advertise string
	// Listener, when set, is served instead of binding Listen: a cluster
	// node hands its one socket from role to role (closing it ends only
	// this hub's use of it).
	Listener net.Listener
	// AddrFile, when not "", is a file the hub writes its bound address
	// to once it listens (written to a temporary name, then renamed, so a
	// reader never sees part of it): how a process that started the hub
	// on port 0 learns the port without racing for a free one. New
	// removes what is there before it opens the data (a killed hub's
	// address); Close removes it, unless another hub has written its own
	// address there since (a restart overlapping this one's stop).
	AddrFile string
	// DataDir is where services keep checkpoints (the store in
	// DataDir/store, the reducer's registrations, ledger and optimizer
	// state in DataDir/reducer: docs/durability.md); "" means nothing is
	// persisted (an in-memory hub, for tests and throwaway runs).
	DataDir string
	// Store configures the model store (retention, size and name limits);
	// the zero value means the store's defaults.
	Store store.Config
	// Reducer configures the gradient reducer: where its primary is
	// (Primary "" hosts it here, over this hub's store), how many
	// secondaries run here (0 means 1), batching and queue bounds. Store
	// and Addr are filled by the hub, and CloseTimeout when 0
	// (StopTimeout: the secondaries' flush at a stop).
	Reducer reducer.Config
	// Aggregator configures the learner aggregator (lease, task timeout,
	// failure policy, homogeneous info keys); the zero value means its
	// defaults. A nil Logger means the hub's.
	Aggregator aggregator.Config
	// ARS configures the ARS coordinator (leases, long polls, the test
	// crash hook); Store is the hub's, DataDir is DataDir/ars when the hub
	// has one (runs survive a restart), a nil Logger means the hub's.
	ARS arsrpc.Config
	// StoreNoDataPlane keeps model-store pushes, pulls and watches, and the
	// weight-sync data-plane watch, off the data plane (gRPC only, as on a
	// hub that predates them); the zero value serves them there too.
	StoreNoDataPlane bool
	// MaxMsgBytes bounds one gRPC message; 0 means 4 MiB (chunks are 1 MiB).
	MaxMsgBytes int
	// TLS, when set, is the server side of TLS for both planes on the
	// listener (certificate; ClientCAs + ClientAuth for mutual TLS); nil
	// serves plaintext. NextProtos is set by the hub.
	TLS *tls.Config
	// Auth checks every call's token against the policy table
	// (internal/auth); nil admits every call (the loopback default).
	Auth *auth.Verifier
	// AuthFile, with Auth, is the token file Auth was loaded from: the hub
	// reloads it while it serves (auth.Verifier.WatchFile), when its
	// identity, size or modification time changes (looked at every
	// AuthReloadInterval; 0 means auth.DefaultReloadInterval, negative
	// never) and on SIGHUP when AuthReloadOnSIGHUP. A revoked, changed or
	// expired token is refused from the next call, and its calls in
	// progress are cut. "" never reloads.
	AuthFile           string
	AuthReloadInterval time.Duration
	AuthReloadOnSIGHUP bool
	// StopTimeout bounds the graceful stop before a hard stop; 0 means 5s.
	StopTimeout time.Duration
	// MetricsListen, when set, serves Prometheus metrics (/metrics) and the
	// dashboard (/) over HTTP on this address (package metrics), and adds
	// gRPC server metrics; "" (the default) means no endpoint and no cost.
	MetricsListen string
	// MetricsRole names the hub on the dashboard; "" means "hub".
	MetricsRole string
	// The metrics endpoint is served with the hub's TLS and tokens (a
	// reader token on every request) when the hub has them; off loopback
	// it needs both unless MetricsInsecure (serve --insecure).
	MetricsInsecure bool
	// MetricsCluster, when set, adds a cluster member's role and
	// replication families to the metrics endpoint (internal/replica).
	MetricsCluster func() metrics.ClusterStats
	// Logger receives the hub's logs; nil means slog.Default().
	Logger *slog.Logger
	// WrapStore, when set, wraps the opened store before any service sees
	// it: a cluster primary's fencing and replication (replica.Fenced).
	// Close still closes the store it wrapped.
	WrapStore func(store.Store) store.Store
	// Gate, when set, is asked before every call on both planes except
	// health checks, reflection and rlhub.v1.Cluster: a non-nil refusal
	// (a primary that learnt it is deposed) is the answer, with its
	// trailers (internal/cluster, the standby refusal).
	Gate func() *cluster.Refusal
	// Replication, when set, serves rlhub.v1.Replica (a cluster primary's
	// replica.Source); nil serves a stub that answers FailedPrecondition
	// (this hub is not a cluster primary). It is closed with the others.
	Replication Service
	// StateChanged, when set, is told each file under DataDir/reducer,
	// DataDir/ars and DataDir/aggregator that the reducer, the ARS
	// coordinator or the aggregator wrote or removed (their
	// Config.StateChanged, unless set there), and each
	// file under DataDir/store the model store wrote or removed
	// (store.FileConfig.Changed): a cluster primary's
	// replica.Source.Changed, so that a replication unit ships what was
	// named instead of walking those directories. nil tells no one.
	StateChanged func(path string)
	// StateAppended, when set, is told a file under DataDir/reducer or
	// DataDir/ars that the reducer or the ARS coordinator only appended to
	// (a step journal, a run's progress.log), with where the new bytes
	// start, instead of StateChanged (their Config.StateAppended, when
	// their StateChanged is this one): a cluster primary's
	// replica.Source.Appended, so that a unit ships the new bytes only.
	StateAppended func(path string, from int64)
	// Limits bounds what a client can make the hub hold: half-open
	// connections, connections per peer, policy sizes. The zero value
	// means the defaults noted on each field (docs/security.md, Limits).
	Limits Limits
}

// Limits are the hub's bounds on client-held resources.
type Limits struct {
	// FrameTimeout: a connection's first 8 bytes, the rest of a
	// data-plane request frame once it started, and every data-plane
	// write must complete within it; 0 means bulk.DefaultFrameTimeout
	// (10s). `rlhub serve --frame-timeout`.
	FrameTimeout time.Duration
	// IdleTimeout: a data-plane connection with no request in progress
	// is closed after it; 0 means bulk.DefaultIdleTimeout (2m).
	// `--idle-timeout`.
	IdleTimeout time.Duration
	// BodyTimeout and BodyMinRate (bytes/s) bound how long a body may
	// take to arrive whole, or to be taken whole by its reader, whatever
	// its pace: one of n bytes (as its header announces) gets BodyTimeout
	// + n/BodyMinRate, on the data plane (bulk.Server.BodyTimeout) and on
	// gRPC streams alike (bodylimit); past it a push fails
	// DeadlineExceeded and changes nothing, a reader is cut off. 0 means
	// bulk.DefaultBodyTimeout (30s) and bulk.DefaultBodyMinRate (1 MiB/s);
	// a negative BodyMinRate means a fixed BodyTimeout whatever n.
	// `--body-timeout`, `--body-min-rate`.
	BodyTimeout time.Duration
	BodyMinRate int64
	// MaxConnsPerPeer caps the open connections (gRPC and data plane) of
	// one peer IP; 0 means bulk.DefaultMaxConnsPerPeer (256), negative no
	// cap. `--max-conns-per-peer`.
	MaxConnsPerPeer int
	// MaxStreamsPerPeer caps the gRPC streams one peer IP may hold open
	// at once (watches, weight streams, pushes in flight, replication); a
	// stream past it fails ResourceExhausted. 0 means
	// streamcap.DefaultPerPeer (4096), negative no cap.
	// `--max-streams-per-peer`.
	MaxStreamsPerPeer int
	// HandshakeTimeout bounds a gRPC connection's HTTP/2 handshake
	// (grpc.ConnectionTimeout); 0 means 10s (connlimit).
	HandshakeTimeout time.Duration
	// KeepaliveTime is how long a gRPC connection may be silent before the
	// hub pings it, and KeepaliveTimeout how long it then waits for the
	// ack before closing the connection (a peer that vanished, a half-open
	// connection); 0 means 1m and 20s (connlimit). The hub accepts client
	// pings every 10s or slower, even without a call in progress
	// (connlimit.MinClientPingInterval).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MaxPolicyParams bounds one ARS run's policy; 0 means
	// arsrpc.DefaultMaxPolicyParams. `--max-policy-params`.
	MaxPolicyParams int64
	// MaxPushBytesInFlight bounds the bytes the model-store pushes in
	// progress hold together; 0 means
	// storerpc.DefaultMaxPushBytesInFlight (4 GiB).
	// `--max-push-bytes-in-flight`.
	MaxPushBytesInFlight int64
}

func (l *Limits) validate() error {
	if l.FrameTimeout == 0 {
		l.FrameTimeout = bulk.DefaultFrameTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = bulk.DefaultIdleTimeout
	}
	if l.MaxConnsPerPeer == 0 {
		l.MaxConnsPerPeer = bulk.DefaultMaxConnsPerPeer
	}
	if l.MaxStreamsPerPeer == 0 {
		l.MaxStreamsPerPeer = streamcap.DefaultPerPeer
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = bulk.DefaultBodyTimeout
	}
	if l.BodyMinRate == 0 {
		l.BodyMinRate = bulk.DefaultBodyMinRate
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = connlimit.DefaultHandshakeTimeout
	}
	if l.KeepaliveTime == 0 {
		l.KeepaliveTime = connlimit.DefaultKeepaliveTime
	}
	if l.KeepaliveTimeout == 0 {
		l.KeepaliveTimeout = connlimit.DefaultKeepaliveTimeout
	}
	if l.FrameTimeout < 0 || l.IdleTimeout < 0 || l.BodyTimeout < 0 || l.HandshakeTimeout < 0 || l.KeepaliveTime < 0 || l.KeepaliveTimeout < 0 || l.MaxPolicyParams < 0 || l.MaxPushBytesInFlight < 0 {
		return fmt.Errorf("hub: negative limit in %+v", *l)
	}
	return nil
}

// ApplyBulk sets s's connection and body bounds (a data-plane server,
// which holds both planes' connections) from l: MaxConnsPerPeer,
// FrameTimeout, IdleTimeout, BodyTimeout and BodyMinRate. A zero field
// leaves s's own (bulk.NewServer's defaults, which are l's), so l need
// not have been validated: a cluster standby (internal/replica) serves the
// hub's address with them between terms, before the hub is opened.
func (l Limits) ApplyBulk(s *bulk.Server) {
	if l.MaxConnsPerPeer != 0 {
		s.MaxConnsPerPeer = l.MaxConnsPerPeer // negative: no cap, in both
	}
	if l.FrameTimeout > 0 {
		s.FrameTimeout = l.FrameTimeout
	}
	if l.IdleTimeout > 0 {
		s.IdleTimeout = l.IdleTimeout
	}
	if l.BodyTimeout > 0 {
		s.BodyTimeout = l.BodyTimeout
	}
	if l.BodyMinRate != 0 {
		s.BodyMinRate = max(l.BodyMinRate, 0) // negative: a fixed BodyTimeout, bulk's 0
	}
}

func (c *Config) validate() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxMsgBytes == 0 {
		c.MaxMsgBytes = 4 << 20
	}
	if c.MaxMsgBytes < 1<<16 {
		return fmt.Errorf("hub: MaxMsgBytes %d is below 64 KiB", c.MaxMsgBytes)
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 5 * time.Second
	}
	if c.StopTimeout < 0 {
		return fmt.Errorf("hub: negative StopTimeout %v", c.StopTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.AuthFile != "" && c.Auth == nil {
		return errors.New("hub: AuthFile needs Auth (the verifier loaded from it)")
	}
	return c.Limits.validate()
}

// Service is one gRPC service hosted by the hub.
type Service interface {
	// Register attaches the service's handlers to s. Called once by New.
	Register(s *grpc.Server)
	// Close stops the service's background work and waits for it. Called
	// once, after the gRPC server has stopped.
	Close() error
}

// BulkService is implemented by services that also take requests on the
// hub's data plane (package bulk: plain TCP on the gRPC port for large
// bodies, such as the reducer's gradient pushes).
type BulkService interface {
	RegisterBulk(*bulk.Server)
}

// Drainer is implemented by services with long-lived streams (watches).
// Close calls Drain before the graceful stop, and the service then ends
// those streams (clients see Unavailable and reconnect elsewhere), so the
// graceful stop does not wait for them until its hard-stop timeout.
type Drainer interface {
	Drain()
}

// Hub is a running set of services behind one gRPC server.
type Hub struct {
	cfg      Config
	store    store.Store // opened first, closed last (wrapped by WrapStore)
	opened   store.Store // what openStore returned: the one Close closes
	grpc     *grpc.Server
	health   *health.Server
	services []Service
	reducer  *reducer.Service    // one of services
	sync     *wsync.Service      // one of services
	agg      *aggregator.Service // one of services
	ars      *arsrpc.Service     // one of services
	cluster  *clusterrpc.Service // one of services: Cluster/Primary
	metrics  *metrics.Server     // nil without MetricsListen

	bulk    *bulk.Server       // the data plane beside grpc on the same port
	bodies  *bodylimit.Limiter // grpc's streams' body deadlines
	streams *streamcap.Cap     // grpc's streams per peer (nil: no cap)
	calls   *streamcap.Calls   // grpc's calls in progress per peer, from their headers (nil: no cap)

	mu       sync.Mutex
	lis      net.Listener
	addrFile os.FileInfo // the address file Start wrote (nil: none)
	serveErr chan error
	closed   bool

	// The token file's watcher (Config.AuthFile): started by Start,
	// stopped and waited for by Close.
	authStop   context.CancelFunc
	authDone   chan struct{}
	authReload chan struct{}
	hup        chan os.Signal
}

// New builds a hub and opens its services. extra services are hosted beside
// the built-in ones (tests use this to add fakes).
func New(cfg Config, extra ...Service) (*Hub, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.AddrFile != "" {
		// An earlier run's address must not be read as this one's while
		// this one opens its data (recovery reads every retained
		// version), nor when it fails to open it or to listen: a run
		// killed with SIGKILL left its address there.
		if err := os.Remove(cfg.AddrFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("hub: address file: %w", err)
		}
	}
	h := &Hub{cfg: cfg}
	st, err := openStore(&h.cfg)
	if err != nil {
		return nil, err
	}
	h.store, h.opened = st, st
	if cfg.WrapStore != nil {
		h.store = cfg.WrapStore(st)
	}
	lim := h.cfg.Limits
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.MaxMsgBytes), grpc.MaxSendMsgSize(cfg.MaxMsgBytes)}
	// Half-open and vanished peers: the handshake is bounded, and a
	// silent connection is pinged and closed without an ack.
	opts = append(opts, connlimit.ServerOptions(lim.HandshakeTimeout, lim.KeepaliveTime, lim.KeepaliveTimeout)...)
	opts = append(opts, chunkcodec.ServerOptions()...)
	// Metrics first, so refused calls are counted too.
	var grpcMetrics *metrics.GRPCServerMetrics
	if cfg.MetricsListen != "" {
		grpcMetrics = metrics.NewGRPCServerMetrics()
		opts = append(opts, grpcMetrics.ServerOptions()...)
	}
	// A unary message is at most MaxMsgBytes: it is due within
	// BodyTimeout + MaxMsgBytes/BodyMinRate, as a pushed body of that size.
	due := messagedue.Clock{After: bulk.BodyDeadline(lim.BodyTimeout, lim.BodyMinRate, int64(cfg.MaxMsgBytes)),
		Bound: "the server's --body-timeout plus its maximum size at --body-min-rate", Logger: cfg.Logger}
	opts = append(opts, due.ServerOptions()...)
	if cfg.Gate != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(gateUnary(cfg.Gate)), grpc.ChainStreamInterceptor(gateStream(cfg.Gate)))
	}
	if cfg.Auth != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(cfg.Auth.UnaryInterceptor()),
			grpc.ChainStreamInterceptor(cfg.Auth.StreamInterceptor()))
	}
	if lim.MaxStreamsPerPeer > 0 { // counted once authenticated: a refused stream holds nothing
		h.streams = streamcap.New(lim.MaxStreamsPerPeer)
		opts = append(opts, grpc.ChainStreamInterceptor(h.streams.StreamInterceptor()))
		// Every call, unary ones included, from its headers: as many
		// again as the streams, so a peer at its stream cap still makes
		// unary calls.
		h.calls = streamcap.NewCalls(2 * lim.MaxStreamsPerPeer)
	}
	// On a call's headers, before grpc-go starts its handler: the token
	// and role (a unary call's interceptors run only once its whole
	// request message came), then the calls a peer has in progress, then
	// the clock of its message (messagedue).
	opts = append(opts, grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := cfg.Auth.Tap(ctx, info.FullMethodName, info.Header)
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		if h.calls != nil {
			if err := h.calls.Tap(ctx); err != nil {
				return nil, err
			}
		}
		return due.Arm(ctx, info.FullMethodName), nil
	}))
	// Innermost: the streams' body deadlines, as on the data plane.
	h.bodies = bodylimit.New(bodylimit.Config{Allowance: lim.BodyTimeout, MinRate: lim.BodyMinRate, Logger: cfg.Logger})
	opts = append(opts, grpc.ChainStreamInterceptor(h.bodies.StreamInterceptor()))
	if cfg.TLS != nil {
		// The data plane's listener does the TLS handshake for both planes.
		opts = append(opts, grpc.Creds(bulk.TLSCredentials()))
	}
	h.grpc = grpc.NewServer(opts...)
	h.health = health.NewServer()
	healthpb.RegisterHealthServer(h.grpc, h.health)
	reflection.Register(h.grpc)

	services, err := h.builtinServices()
	if err != nil {
		return nil, errors.Join(err, st.Close())
	}
	repl := cfg.Replication
	if repl == nil {
		repl = replicaStub{}
	}
	h.services = append(append(services, repl), extra...)
	h.bulk = bulk.NewServer()
	lim.ApplyBulk(h.bulk)
	if cfg.TLS != nil {
		h.bulk.TLS = bulk.ServerTLS(cfg.TLS)
	}
	if cfg.Auth != nil {
		h.bulk.Guard = cfg.Auth
	}
	if cfg.Gate != nil {
		h.bulk.Guard = gateGuard{gate: cfg.Gate, next: h.bulk.Guard}
	}
	for _, s := range h.services {
		s.Register(h.grpc)
		if b, ok := s.(BulkService); ok {
			b.RegisterBulk(h.bulk)
		}
	}
	if cfg.MetricsListen != "" {
		if h.metrics, err = h.newMetrics(grpcMetrics); err != nil {
			return nil, errors.Join(err, closeAll(h.services), st.Close())
		}
	}
	return h, nil
}

// openStore opens the model store: in memory when DataDir is "", else
// file-backed under DataDir (checkpoints recovered).
func openStore(cfg *Config) (store.Store, error) {
	if cfg.DataDir == "" {
		return store.NewMemory(cfg.Store)
	}
	return store.OpenFile(store.FileConfig{Dir: filepath.Join(cfg.DataDir, "store"), Store: cfg.Store, Logger: cfg.Logger, Changed: cfg.StateChanged})
}

// Store is the hub's model store, shared by every service that reads or
// publishes models. It stays open until Close has stopped every service.
func (h *Hub) Store() store.Store { return h.store }

// Reducer is the hub's gradient reducer (its primary, unless
// Config.Reducer.Primary names a remote one, and its secondaries): the Go
// API of the counters `rlhub reducer stats` prints (Reducer().Stats()).
func (h *Hub) Reducer() *reducer.Service { return h.reducer }

// builtinServices opens the services every hub hosts. Each issue's service
// is added here; h.cfg is validated and h.Store() is open.
func (h *Hub) builtinServices() (out []Service, err error) {
	// On any failure, close what was opened, newest first.
	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll(out))
			out = nil
		}
	}()
	add := func(s Service, err error) error {
		if err == nil {
			out = append(out, s)
		}
		return err
	}
	if err := add(storerpc.New(storerpc.Config{Store: h.store, NoBulk: h.cfg.StoreNoDataPlane, Auth: h.cfg.Auth, Logger: h.cfg.Logger,
		MaxPushBytesInFlight: h.cfg.Limits.MaxPushBytesInFlight, Deleted: h.modelDeleted, PushGuard: h.guardPush})); err != nil {
		return nil, err
	}
	acfg := h.cfg.Aggregator
	if acfg.Logger == nil {
		acfg.Logger = h.cfg.Logger
	}
	if acfg.DataDir == "" && h.cfg.DataDir != "" {
		acfg.DataDir = filepath.Join(h.cfg.DataDir, "aggregator")
	}
	if acfg.StateChanged == nil {
		acfg.StateChanged = h.cfg.StateChanged
	}
	if acfg.MaxResponseBytes == 0 {
		acfg.MaxResponseBytes = h.cfg.MaxMsgBytes
	}
	if sw, ok := h.store.(store.StateWriter); ok && acfg.WriteState == nil {
		acfg.WriteState = sw.WriteState
	}
	agg, err := aggregator.New(acfg)
	if err := add(agg, err); err != nil {
		return nil, err
	}
	h.agg = agg
	// The ARS coordinator and the reducer write through owner views of the
	// store: the models they manage take no other writer's pushes (store
	// rule 6). Remote store pushes carry their token's identity
	// (storerpc) and are refused there.
	arscfg := h.cfg.ARS
	arscfg.Store = store.Owned{Store: h.store, Owner: OwnerARS}
	if arscfg.MaxPolicyParams == 0 {
		arscfg.MaxPolicyParams = h.cfg.Limits.MaxPolicyParams
	}
	if h.cfg.DataDir != "" {
		arscfg.DataDir = filepath.Join(h.cfg.DataDir, "ars")
	}
	if arscfg.Logger == nil {
		arscfg.Logger = h.cfg.Logger
	}
	if arscfg.StateChanged == nil {
		arscfg.StateChanged, arscfg.StateAppended = h.cfg.StateChanged, h.cfg.StateAppended
	}
	arsSvc, err := arsrpc.New(arscfg)
	if err := add(arsSvc, err); err != nil {
		return nil, err
	}
	h.ars = arsSvc
	syncSvc, err := wsync.NewService(wsync.ServiceConfig{Versions: h.store, NoDataPlane: h.cfg.StoreNoDataPlane, Logger: h.cfg.Logger})
	if err := add(syncSvc, err); err != nil {
		return nil, err
	}
	h.sync = syncSvc
	rcfg := h.cfg.Reducer
	rcfg.Store = store.Owned{Store: h.store, Owner: OwnerReducer}
	if rcfg.StateDir == "" && rcfg.Primary == "" && h.cfg.DataDir != "" {
		rcfg.StateDir = filepath.Join(h.cfg.DataDir, "reducer")
	}
	rcfg.Addr = func() string { // what clients are told to push to
		if a := h.Addr(); a != nil {
			if adv, err := netsec.Advertised(h.cfg.Listen, h.cfg.Advertise, a); err == nil {
				return adv // --listen's name, which the certificate is for
			}
			return a.String()
		}
		return ""
	}
	if rcfg.Logger == nil {
		rcfg.Logger = h.cfg.Logger
	}
	if rcfg.CloseTimeout == 0 { // the secondaries' flush at a stop keeps to its budget
		rcfg.CloseTimeout = h.cfg.StopTimeout
	}
	if rcfg.StateChanged == nil {
		rcfg.StateChanged, rcfg.StateAppended = h.cfg.StateChanged, h.cfg.StateAppended
	}
	red, err := reducer.New(rcfg)
	if err := add(red, err); err != nil {
		return nil, err
	}
	h.reducer = red
	// Cluster/Primary: this hub answers itself until a cluster member
	// sets the election as its source (rlhub serve --etcd).
	csvc, err := clusterrpc.New(clusterrpc.Config{Self: rcfg.Addr})
	if err := add(csvc, err); err != nil {
		return nil, err
	}
	h.cluster = csvc
	return out, nil
}

// modelDeleted is told each model an administrator deleted (storerpc
// Config.Deleted): the reducer drops the model's registration, so that the
// model pushed again can be registered again without a restart, and an
// ARS run whose policy it was ends, failed, saying so. Both are opened
// before the hub serves a Delete.
func (h *Hub) modelDeleted(ctx context.Context, model string) {
	if h.reducer != nil {
		h.reducer.ModelDeleted(ctx, model)
	}
	if h.ars != nil {
		h.ars.ModelDeleted(ctx, model)
	}
}

// guardPush is asked before a store push lands (storerpc
// Config.PushGuard): the reducer refuses an optimizer host's checkpoint
// of a step of a model deleted since (reducer.Service.GuardHostState).
// The reducer is opened before the hub serves a push.
func (h *Hub) guardPush(ctx context.Context, model string, life uint64) (func(), error) {
	if h.reducer == nil {
		return func() {}, nil
	}
	return h.reducer.GuardHostState(ctx, model, life)
}

// Cluster is the hub's Cluster/Primary service; a clustered hub sets its
// Source to the election (clusterrpc.FromMember).
func (h *Hub) Cluster() *clusterrpc.Service { return h.cluster }

// closeAll closes services newest first and joins their errors.
func closeAll(services []Service) error {
	var errsOut []error
	for i := len(services) - 1; i >= 0; i-- {
		if err := services[i].Close(); err != nil {
			errsOut = append(errsOut, err)
		}
	}
	return errors.Join(errsOut...)
}

// Start listens and serves in the background. Addr is valid after it
// returns. Close stops it.
func (h *Hub) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lis != nil || h.closed {
		return errors.New("hub: already started or closed")
	}
	lis := h.cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", h.cfg.Listen); err != nil {
			return fmt.Errorf("hub: listen: %w", err)
		}
	}
	// The listener queues connections from here on, so the address may
	// be published before Serve starts.
	if h.cfg.AddrFile != "" {
		if err := WriteAddrFile(h.cfg.AddrFile, lis.Addr().String()); err != nil {
			lis.Close()
			return fmt.Errorf("hub: %w", err)
		}
		h.addrFile, _ = os.Stat(h.cfg.AddrFile)
	}
	h.lis = lis
	h.serveErr = make(chan error, 1)
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	grpcLis := h.bulk.Listen(lis) // data-plane connections stay with h.bulk
	go func() { h.serveErr <- h.grpc.Serve(grpcLis) }()
	if h.metrics != nil {
		h.metrics.Start()
	}
	h.startAuthWatch()
	h.cfg.Logger.Info("hub serving", "addr", lis.Addr().String(), "data", h.cfg.DataDir, "tls", h.cfg.TLS != nil, "tokens", h.cfg.Auth != nil)
	return nil
}

// WriteAddrFile publishes addr at path for whoever started the process
// (`serve --addr-file`): a reader sees no file or the whole address, never
// a part (atomicfile's temporary file and rename).
func WriteAddrFile(path, addr string) error {
	if err := atomicfile.Write(path, []byte(addr+"\n")); err != nil {
		return fmt.Errorf("address file: %w", err)
	}
	return nil
}

// Methods lists what the hub serves: every gRPC full method of every
// registered service and every data-plane method (the policy test checks
// each is in auth.Policy).
func (h *Hub) Methods() (grpcMethods, bulkMethods []string) {
	for name, info := range h.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			grpcMethods = append(grpcMethods, "/"+name+"/"+m.Name)
		}
	}
	sort.Strings(grpcMethods)
	return grpcMethods, h.bulk.Methods()
}

// Addr is the address the hub listens on, or nil before Start.
func (h *Hub) Addr() net.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lis == nil {
		return nil
	}
	return h.lis.Addr()
}

// Run starts the hub and serves until ctx is done or serving fails, then
// closes it.
func (h *Hub) Run(ctx context.Context) error {
	if err := h.Start(); err != nil {
		// What New opened (the store's lock on --data, the services and
		// their goroutines, the metrics listener) is closed too.
		return errors.Join(err, h.Close())
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-h.serveErr:
		h.serveErr <- err // Close reads it again
	}
	return errors.Join(err, h.Close())
}

// Close stops serving gracefully (hard stop after StopTimeout), then closes
// every service. Safe to call more than once.
func (h *Hub) Close() error { return h.CloseWithin(h.cfg.StopTimeout) }

// CloseWithin is Close with the graceful stop bounded by grace instead of
// StopTimeout (whichever is shorter): for a cluster primary stepping
// down, whose calls are refused from that moment (Config.Gate) and whose
// peers may be unreachable — its machine cut off, or a standby stopped.
// gRPC's graceful stop waits for every connection's drain (an HTTP/2
// GOAWAY and a ping the peer must answer, up to 5 s when it cannot) and
// for every handler in progress (a replication stream to a standby that
// reads nothing); the data plane for its requests in progress. After
// grace whatever is left is cut.
func (h *Hub) CloseWithin(grace time.Duration) error {
	grace = min(grace, h.cfg.StopTimeout)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	started, addrFile := h.lis != nil, h.addrFile
	var addr string // what Start wrote to the address file
	if started {
		addr = h.lis.Addr().String()
	}
	h.mu.Unlock()

	h.stopAuthWatch()
	h.health.Shutdown()
	var errsOut []error
	// The metrics endpoint stops beside the two planes, within the same
	// grace: before them, its own shutdown came on top of theirs.
	metricsDone := make(chan error, 1)
	if h.metrics != nil {
		go func() { metricsDone <- h.metrics.CloseWithin(grace) }()
	} else {
		metricsDone <- nil
	}
	for _, s := range h.services {
		if d, ok := s.(Drainer); ok {
			d.Drain()
		}
	}
	done := make(chan struct{})
	go func() { h.grpc.GracefulStop(); close(done) }()
	// The data plane stops at the same time: no new requests, those in
	// progress finish (or are cut at the same hard-stop deadline).
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	bulkDone := make(chan struct{})
	go func() { _ = h.bulk.Shutdown(stopCtx); close(bulkDone) }()
	select {
	case <-done:
	case <-stopCtx.Done():
		h.cfg.Logger.Warn("hub: graceful stop timed out, stopping hard")
		h.bulk.CloseAccepted() // gRPC's stop waits for handshakes in progress: cut them
		h.grpc.Stop()
		<-done
	}
	<-bulkDone
	cancel()
	if err := <-metricsDone; err != nil {
		errsOut = append(errsOut, err)
	}
	h.bodies.Wait() // handlers of streams cut at a body deadline: woken by the stop
	if started {
		if err := <-h.serveErr; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errsOut = append(errsOut, err)
		}
	}
	if err := closeAll(h.services); err != nil {
		errsOut = append(errsOut, err)
	}
	if err := h.opened.Close(); err != nil {
		errsOut = append(errsOut, err)
	}
	if addrFile != nil {
		// Nothing listens there any more, unless the file is another
		// hub's, started since (a restart overlapping this stop, even on
		// the same address): its address stays.
		fi, err := os.Stat(h.cfg.AddrFile)
		if b, rerr := os.ReadFile(h.cfg.AddrFile); err == nil && rerr == nil && string(b) == addr+"\n" && fi.ModTime().Equal(addrFile.ModTime()) {
			os.Remove(h.cfg.AddrFile)
		}
	}
	h.cfg.Logger.Info("hub stopped")
	return errors.Join(errsOut...)
}

// newMetrics builds the metrics endpoint over every hosted service's
// Stats. It listens at once (so MetricsAddr is known after New) and serves
// from Start until Close.
func (h *Hub) newMetrics(g *metrics.GRPCServerMetrics) (*metrics.Server, error) {
	role := h.cfg.MetricsRole
	if role == "" {
		role = "hub"
	}
	src := metrics.Sources{
		Reducer:        h.reducer.Stats,
		ReducerLatency: h.reducer.PublishLatency,
		Sync:           h.sync.Stats,
		Aggregator:     h.agg.Stats,
		ARS:            h.ars.Stats,
	}
	if sr, ok := h.store.(store.StatsReader); ok {
		src.Store = sr.Stats
	}
	src.Cluster = h.cfg.MetricsCluster
	src.DataPlane = h.bulk.Stats
	src.GRPCBodies = h.bodies.Stats
	mcfg := metrics.Config{Listen: h.cfg.MetricsListen, Sources: src, GRPC: g, Role: role, Logger: h.cfg.Logger,
		TLS: h.cfg.TLS, Insecure: h.cfg.MetricsInsecure}
	if h.cfg.Auth != nil {
		mcfg.Auth = h.cfg.Auth
		mcfg.Sources.Auth = h.cfg.Auth.Stats
	}
	return metrics.New(mcfg)
}

// MetricsAddr is the metrics endpoint's address, or "" without
// Config.MetricsListen.
func (h *Hub) MetricsAddr() string {
	if h.metrics == nil {
		return ""
	}
	return h.metrics.Addr()
}

// startAuthWatch starts the token file's watcher (Config.AuthFile); h.mu
// is held.
func (h *Hub) startAuthWatch() {
	if h.cfg.AuthFile == "" {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.authStop, h.authDone = cancel, make(chan struct{})
	h.authReload = make(chan struct{}, 1)
	var hup chan os.Signal
	if h.cfg.AuthReloadOnSIGHUP {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		h.hup = hup
	}
	go func() {
		defer close(h.authDone)
		fwd := make(chan struct{})
		// SIGHUP and ReloadAuth both ask the watcher for a reload.
		go func() {
			defer close(fwd)
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
				case <-h.authReload:
				}
				select {
				case fwd <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}()
		h.cfg.Auth.WatchFile(ctx, h.cfg.AuthFile, h.cfg.AuthReloadInterval, fwd, h.cfg.Logger)
		for range fwd { // until the forwarder has ended
		}
	}()
}

// stopAuthWatch stops the watcher and waits for it.
func (h *Hub) stopAuthWatch() {
	h.mu.Lock()
	stop, done, hup := h.authStop, h.authDone, h.hup
	h.mu.Unlock()
	if stop == nil {
		return
	}
	if hup != nil {
		signal.Stop(hup)
	}
	stop()
	<-done
}

// ReloadAuth asks the hub to reload its token file now (what SIGHUP does
// with Config.AuthReloadOnSIGHUP); the reload happens in the background.
// It is a no-op without Config.AuthFile or before Start.
func (h *Hub) ReloadAuth() {
	h.mu.Lock()
	ch := h.authReload
	h.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default: // one is already pending
	}
}
