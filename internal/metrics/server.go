package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/netsec"
)

// GRPCServerMetrics counts a gRPC server's RPCs (go-grpc-middleware's
// providers/prometheus, names rlhub_grpc_server_*). Create one only when
// the endpoint is on: its interceptors are the one cost metrics add to
// each RPC.
type GRPCServerMetrics struct {
	m *grpcprom.ServerMetrics
}

// NewGRPCServerMetrics returns server metrics with a handling-time
// histogram.
func NewGRPCServerMetrics() *GRPCServerMetrics {
	return &GRPCServerMetrics{m: grpcprom.NewServerMetrics(
		grpcprom.WithServerCounterOptions(grpcprom.WithNamespace("rlhub")),
		grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace("rlhub"),
			grpcprom.WithHistogramBuckets([]float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300})),
	)}
}

// ServerOptions are the interceptors to pass to grpc.NewServer.
func (g *GRPCServerMetrics) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.m.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(g.m.StreamServerInterceptor()),
	}
}

// Config configures a metrics endpoint.
type Config struct {
	// Listen is the HTTP address (host:port; port 0 picks one). Required.
	Listen string
	// Sources are the Stats the endpoint reads.
	Sources Sources
	// GRPC, when set, adds the gRPC server metrics of the server it
	// intercepts.
	GRPC *GRPCServerMetrics
	// Role names the process on the dashboard ("hub", "relay",
	// "reducer", "ars worker"); "" means "rlhub".
	Role string
	// MaxLabelValues caps the collectors per model, learners, runs and
	// models exported with their own label value (the rest share
	// OtherLabel); 0 means 50.
	MaxLabelValues int
	// StatsTimeout bounds the store look-ups of one weight-sync Stats
	// call; 0 means 2s.
	StatsTimeout time.Duration
	// StateReuse is how long one reading of the Sources answers the
	// dashboard (/api/state and the page): a request that arrives less
	// than StateReuse after the last reading started gets its figures,
	// so any number of open pages and pollers cost at most one reading
	// per StateReuse. 0 means 500ms (the page polls every second);
	// negative: every request reads anew. Either way, requests that
	// arrive while a reading is in progress share it (so do /metrics
	// scrapes, which never reuse a finished one: docs/metrics.md).
	StateReuse time.Duration
	// ShutdownTimeout bounds the HTTP server's graceful stop; 0 means 2s.
	ShutdownTimeout time.Duration
	// TLS, when set, serves HTTPS with it (a ClientCAs pool with
	// RequireAndVerifyClientCert makes it mutual TLS); nil serves HTTP.
	TLS *tls.Config
	// Auth, when set, requires a known, unexpired token of role reader or
	// above on every request: "Authorization: Bearer TOKEN", or HTTP basic
	// authentication with the token as the password (what a browser
	// prompts for on the dashboard). Without it, 401. nil: no token.
	Auth *auth.Verifier
	// Insecure allows a Listen address off loopback without both TLS and
	// Auth; without it New refuses one (secure by default, as serve).
	Insecure bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultStateReuse is Config.StateReuse's default: half the page's poll
// period, so one open page still sees every poll's figures fresh.
const DefaultStateReuse = 500 * time.Millisecond

func (c *Config) validate() error {
	if c.Listen == "" {
		return errors.New("metrics: Config.Listen is required")
	}
	if c.Role == "" {
		c.Role = "rlhub"
	}
	if c.MaxLabelValues == 0 {
		c.MaxLabelValues = 50
	}
	if c.StatsTimeout == 0 {
		c.StatsTimeout = 2 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 2 * time.Second
	}
	if c.StateReuse == 0 {
		c.StateReuse = DefaultStateReuse
	}
	if c.MaxLabelValues < 1 || c.StatsTimeout < 0 || c.ShutdownTimeout < 0 {
		return fmt.Errorf("metrics: MaxLabelValues %d must be ≥ 1 and timeouts non-negative", c.MaxLabelValues)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if !c.Insecure && !netsec.IsLoopback(c.Listen) && (c.TLS == nil || c.Auth == nil) {
		return fmt.Errorf("metrics: --metrics-listen %s is not a loopback address and the endpoint would be open to anyone who reaches it: serve it with TLS and tokens (serve, relay: --tls-cert, --tls-key and --auth-tokens), or allow it anyway (serve, relay: --insecure; worker ars: --metrics-insecure)", c.Listen)
	}
	return nil
}

// loopbackHost refuses a request to a loopback endpoint without tokens
// unless its Host names loopback (localhost or a loopback address): a web
// page the operator's browser opens elsewhere could otherwise read the
// dashboard's state through a name it points at 127.0.0.1 (DNS
// rebinding), since the browser then takes the page and the endpoint for
// one origin.
func loopbackHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, "metrics: this loopback endpoint answers requests for localhost or a loopback address only", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// guard refuses requests without a reader token (Config.Auth).
func guard(v *auth.Verifier, next http.Handler) http.Handler {
	if v == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			_, tok, _ = r.BasicAuth()
		}
		p, err := v.Authenticate(strings.TrimSpace(tok))
		if err == nil && p.Role < auth.Reader {
			err = errors.New("the metrics endpoint needs role reader")
		}
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Basic realm="rlhub metrics", charset="UTF-8"`)
			http.Error(w, "rlhub metrics: a reader token is required (Authorization: Bearer TOKEN, or the token as the basic-auth password)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clientCert refuses requests without a verified client certificate when
// need is set (the endpoint's TLS is mutual).
func clientCert(need bool, next http.Handler) http.Handler {
	if !need {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "rlhub metrics: a client certificate is required (mutual TLS)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Server is the HTTP endpoint: /metrics (Prometheus text format), / (the
// dashboard), /api/state (the dashboard's JSON), and the probes /healthz
// and /readyz (health.go), which alone need no token.
type Server struct {
	cfg  Config
	reg  *prometheus.Registry
	lis  net.Listener
	srv  *http.Server
	dash *dashboard
	// gather serves /metrics: reg, gathered and encoded once for the
	// scrapes that arrive together.
	gather *scrapes

	stop   func()    // set by Start
	once   sync.Once // guards Close
	runErr error     // Run's result, written before stop returns
	// grace, when set (CloseWithin), bounds Run's graceful shutdown
	// instead of ShutdownTimeout.
	grace atomic.Pointer[time.Duration]
}

// New registers the collectors and listens on cfg.Listen.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	stats := newStatsCollector(cfg.Sources, cfg.MaxLabelValues, cfg.StatsTimeout)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		stats,
	)
	if cfg.GRPC != nil {
		reg.MustRegister(cfg.GRPC.m)
	}
	// Scrapes that arrive together share one gather: the Sources (and the
	// Go and process collectors) are read once for all of them, and its
	// response is encoded once for each way they ask for it.
	s := &Server{cfg: cfg, reg: reg, dash: newDashboard(cfg, stats), gather: &scrapes{reg: reg, opts: promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}}}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.gather)
	s.dash.register(mux)
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen: %w", err)
	}
	var needCert bool
	if cfg.TLS != nil {
		tc := cfg.TLS.Clone()
		tc.NextProtos = []string{"http/1.1"}
		// Mutual TLS is checked per request, not at the handshake, so that
		// a probe without a certificate (Kubernetes' HTTPS probes present
		// none) reaches /healthz and /readyz; every other path still wants
		// a certificate the client CA signed (clientCert). A certificate
		// that is presented is verified at the handshake as before.
		if needCert = tc.ClientAuth == tls.RequireAndVerifyClientCert; needCert {
			tc.ClientAuth = tls.VerifyClientCertIfGiven
		}
		lis = tls.NewListener(lis, tc)
	}
	s.lis = lis
	var h http.Handler = guard(cfg.Auth, mux)
	if cfg.Auth == nil && netsec.IsLoopback(cfg.Listen) {
		h = loopbackHost(h)
	}
	s.srv = &http.Server{Handler: probes(cfg.Sources, clientCert(needCert, h)), ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
	return s, nil
}

// Addr is the address the endpoint listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Registry is the endpoint's registry (tests gather from it directly).
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Run serves until ctx is done, then shuts down gracefully (bounded by
// ShutdownTimeout) and returns. Call it once.
func (s *Server) Run(ctx context.Context) error {
	scheme := "http://"
	if s.cfg.TLS != nil {
		scheme = "https://"
	}
	s.cfg.Logger.Info("metrics serving", "addr", scheme+s.Addr(), "role", s.cfg.Role, "tokens", s.cfg.Auth != nil)
	if !netsec.IsLoopback(s.cfg.Listen) && (s.cfg.TLS == nil || s.cfg.Auth == nil) {
		// Allowed (Insecure, or validate would have refused), never silently:
		// --insecure is given for --listen, and covers this port too.
		s.cfg.Logger.Warn("INSECURE: the metrics endpoint and dashboard are served off loopback without TLS and tokens: anyone who reaches the port reads every model's name and figures",
			"addr", scheme+s.Addr(), "tls", s.cfg.TLS != nil, "tokens", s.cfg.Auth != nil)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.lis) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		errc <- err
	}
	timeout := s.cfg.ShutdownTimeout
	if g := s.grace.Load(); g != nil {
		timeout = *g
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if e := s.srv.Shutdown(sctx); e != nil {
		s.srv.Close()
	}
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, e)
	}
	return err
}

// Start serves in the background until Close: for owners (the hub) that
// have no Run loop of their own.
func (s *Server) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.stop = func() { cancel(); <-done }
	go func() { defer close(done); s.runErr = s.Run(ctx) }()
}

// Close stops a Start-ed server and waits for it; safe to call twice.
func (s *Server) Close() error { return s.CloseWithin(s.cfg.ShutdownTimeout) }

// CloseWithin is Close with the graceful shutdown bounded by grace as
// well as ShutdownTimeout, whichever is shorter: an owner with a stop
// budget of its own (the hub's StopTimeout) keeps to it. Requests still
// in progress after it are cut.
func (s *Server) CloseWithin(grace time.Duration) error {
	s.once.Do(func() {
		if s.stop != nil {
			g := max(min(grace, s.cfg.ShutdownTimeout), 0)
			s.grace.Store(&g)
			s.stop()
		} else {
			s.lis.Close()
		}
	})
	return s.runErr
}
