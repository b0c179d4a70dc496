package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/tap"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/streamcap"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/relay"
)

// newRelayCmd is `rlhub relay`: one upstream subscription per host,
// serving the host's collectors from shared memory and a local stream.
func newRelayCmd(g *globals) *cobra.Command {
	var cfg relay.Config
	var upstream string
	var noShm bool
	var metricsListen string
	var sec serveSecurity
	cmd := &cobra.Command{
		Use:   "relay --upstream ADDR --model NAME",
		Short: "Relay a model's versions to this host's collectors (shared memory + stream)",
		Long: "relay attaches once to the upstream hub's weight-sync stream and republishes\n" +
			"every version to the collectors of this host: into a shared-memory segment\n" +
			"(--shm, layout in docs/shm-layout.md) and on its own WeightSync stream\n" +
			"(--listen). A version crosses the network once per host. Local collectors'\n" +
			"version reports are forwarded upstream. Collectors that list the upstream as\n" +
			"their fallback keep running when the relay dies. SIGINT/SIGTERM stops it and\n" +
			"removes the segment. The local stream takes the hub's server flags: --tls-cert\n" +
			"and --tls-key (also the relay's client certificate upstream), --tls-client-ca,\n" +
			"--auth-tokens (reloaded on SIGHUP and when it changes); off loopback it needs\n" +
			"TLS and tokens, or --insecure.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseNonPositive(cmd, "body-timeout", "body-min-rate"); err != nil {
				return err
			}
			// relay.Config reads every negative value as -1 (no cap), and
			// 0 as the default for its streams while relayTap, given the
			// flag's value, then capped no calls: refused, not half-applied.
			if err := refuseBelowMinusOne(cmd, "max-streams-per-peer"); err != nil {
				return err
			}
			if cfg.MaxStreamsPerPeer == 0 {
				return fmt.Errorf("--max-streams-per-peer 0: give -1 for no cap, or a count (default %d)", streamcap.DefaultPerPeer)
			}
			if err := sec.refuseIgnored(cmd); err != nil {
				return err
			}
			conn, err := dialHub(cmd.Context(), upstream)
			if err != nil {
				return err
			}
			defer conn.Close()
			cfg.Upstream = conn
			cfg.UpstreamAddr = upstream
			// The data plane with the connection's TLS and token, as
			// every client dials it.
			cfg.UpstreamBulk = dialConfig(cmd.Context()).Bulk()
			defer cfg.UpstreamBulk.Close()
			cfg.Logger = g.logger
			if noShm {
				cfg.ShmPath = ""
			} else if cfg.ShmPath == "" {
				cfg.ShmPath = wsync.DefaultShmPath(cfg.Model)
			}
			tc, v, err := sec.resolve(g, "relay", cfg.Listen)
			if err != nil {
				return err
			}
			var gm *metrics.GRPCServerMetrics
			if metricsListen != "" { // metrics first, so refused calls are counted
				gm = metrics.NewGRPCServerMetrics()
				cfg.ServerOptions = gm.ServerOptions()
			}
			if tc != nil {
				cfg.ServerOptions = append(cfg.ServerOptions, grpc.Creds(credentials.NewTLS(tc)))
			}
			if v != nil {
				cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(v.UnaryInterceptor()), grpc.ChainStreamInterceptor(v.StreamInterceptor()))
			}
			cfg.ServerOptions = append(cfg.ServerOptions, grpc.InTapHandle(relayTap(v, cfg.MaxStreamsPerPeer)))
			r, err := relay.New(cfg)
			if err != nil {
				return err
			}
			run := r.Run
			if v != nil {
				run = func(ctx context.Context) error {
					return runBoth(ctx, r.Run, func(ctx context.Context) error { return sec.watchTokens(ctx, v, g) })
				}
			}
			var ms *metrics.Server
			if metricsListen != "" {
				mcfg := metrics.Config{Listen: metricsListen, GRPC: gm, Role: "relay " + cfg.Model, Logger: g.logger,
					Sources: metrics.Sources{Sync: r.Service().Stats, GRPCBodies: r.BodyStats, RelayRefused: func() uint64 { return r.Refusals().Count }}, TLS: tc, Auth: v, Insecure: sec.insecure}
				if v != nil {
					mcfg.Sources.Auth = v.Stats
				}
				if ms, err = metrics.New(mcfg); err != nil {
					closeRelay(cmd.Context(), r)
					return err
				}
			}
			// With --etcd the relay is announced in etcd for collectors
			// to find (docs/cluster.md, Clients).
			withdraw, err := announce(cmd, g.logger, cluster.ServiceInfo{Kind: cluster.KindRelay, ID: cfg.ID, Addr: r.Addr(), Model: cfg.Model, Shm: cfg.ShmPath}, sec.insecure)
			if err != nil {
				if ms != nil {
					_ = ms.Close()
				}
				closeRelay(cmd.Context(), r)
				return err
			}
			defer withdraw()
			g.logger.Info("relay serving", "model", cfg.Model, "upstream", upstream, "listen", r.Addr(), "shm", cfg.ShmPath, "tls", tc != nil, "tokens", v != nil)
			fmt.Fprintf(g.stdout, "relay %s: listening on %s, shm %q\n", cfg.Model, r.Addr(), cfg.ShmPath)
			if ms != nil {
				return runBoth(cmd.Context(), run, ms.Run)
			}
			return run(cmd.Context())
		},
	}
	f := cmd.Flags()
	sec.register(cmd)
	f.StringVar(&upstream, "upstream", "", "upstream hub address (required)")
	f.StringVar(&cfg.Model, "model", "", "model to relay (required)")
	f.StringVar(&cfg.ID, "id", "", "the relay's collector id upstream (default relay-<hostname>)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7471", "where local collectors attach (not loopback: needs TLS and --auth-tokens, or --insecure)")
	f.StringVar(&cfg.ShmPath, "shm", "", "shared-memory segment (default /dev/shm/rlhub-<model>)")
	f.BoolVar(&noShm, "no-shm", false, "serve the stream only, no shared-memory segment")
	cmd.MarkFlagsMutuallyExclusive("shm", "no-shm") // --no-shm would drop --shm without a word
	f.Int64Var(&cfg.ShmCapacity, "shm-capacity", 0, "segment slot size in bytes (default: twice the first version)")
	f.StringVar(&cfg.ShmGroup, "shm-group", "", "group (name or id) the segment belongs to, mode 0660; default 0600, this user only")
	f.IntVar(&cfg.ShmSlots, "shm-slots", 0, "segment slots: 2 + n let n local collectors lease versions and copy them straight into their weights; 0 sizes it (up to 10 slots within 1 GiB of /dev/shm)")
	for _, seg := range []string{"shm-group", "shm-slots", "shm-capacity"} {
		cmd.MarkFlagsMutuallyExclusive(seg, "no-shm") // they configure the segment --no-shm does not make
	}
	f.Var((*byteSize)(&cfg.MaxModelBytes), "max-model-bytes", "largest version the relay takes from the upstream's data plane (bytes, or with a KiB/MiB/GiB suffix); a larger one is refused, counted (rlhub_relay_versions_refused_total) and logged, and the relay keeps serving the one it has (default 4 GiB)")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics and the dashboard over HTTP on this address (default off)")
	f.DurationVar(&cfg.BodyTimeout, "body-timeout", bulk.DefaultBodyTimeout, "a local collector must read a version sent on its stream within this plus its length at --body-min-rate, or it is cut off (Unavailable) and attaches again for the newest")
	f.IntVar(&cfg.MaxStreamsPerPeer, "max-streams-per-peer", streamcap.DefaultPerPeer, "streams (collectors' weight streams) one peer IP may hold open on the relay at once; more fail ResourceExhausted (-1: no cap)")
	cfg.BodyMinRate = bulk.DefaultBodyMinRate
	f.Var((*byteSize)(&cfg.BodyMinRate), "body-min-rate", "the slowest rate (bytes/s, or with a KiB/MiB/GiB suffix) a version's deadline allows for: --body-timeout + length / this")
	cmd.MarkFlagRequired("upstream")
	cmd.MarkFlagRequired("model")
	return cmd
}

// closeRelay releases a relay that will not run (its listener and segment):
// Run on a context already cancelled returns at once.
func closeRelay(parent context.Context, r *relay.Relay) {
	done, stop := context.WithCancel(parent)
	stop()
	_ = r.Run(done)
}

// relayTap checks a call's token and role on its headers and counts the
// calls a peer has in progress, unary ones included, against twice
// maxStreams (none when maxStreams ≤ 0), as the hub's tap does: grpc-go
// starts a unary handler's goroutine on the headers and runs its
// interceptors only once the whole request message came, so without it a
// peer with no token held a goroutine per WeightSync/Report call it
// opened and never finished, for as long as it liked.
func relayTap(v *auth.Verifier, maxStreams int) tap.ServerInHandle {
	var calls *streamcap.Calls
	if maxStreams > 0 {
		calls = streamcap.NewCalls(2 * maxStreams)
	}
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := v.Tap(ctx, info.FullMethodName, info.Header)
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		if calls != nil {
			if err := calls.Tap(ctx); err != nil {
				return nil, err
			}
		}
		return ctx, nil
	}
}
