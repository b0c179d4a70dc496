package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/wsync"
)

// newRelayCmd is `rlhub relay`: one upstream subscription per host,
// serving the host's collectors from shared memory and a local stream.
func newRelayCmd(g *globals) *cobra.Command {
	var cfg wsync.RelayConfig
	var upstream string
	var noShm bool
	var metricsListen string
	cmd := &cobra.Command{
		Use:   "relay --upstream ADDR --model NAME",
		Short: "Relay a model's versions to this host's collectors (shared memory + stream)",
		Long: "relay attaches once to the upstream hub's weight-sync stream and republishes\n" +
			"every version to the collectors of this host: into a shared-memory segment\n" +
			"(--shm, layout in docs/shm-layout.md) and on its own WeightSync stream\n" +
			"(--listen). A version crosses the network once per host. Local collectors'\n" +
			"version reports are forwarded upstream. Collectors that list the upstream as\n" +
			"their fallback keep running when the relay dies. SIGINT/SIGTERM stops it and\n" +
			"removes the segment.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := dialHub(cmd.Context(), upstream)
			if err != nil {
				return err
			}
			defer conn.Close()
			cfg.Upstream = conn
			cfg.UpstreamAddr = upstream
			cfg.Logger = g.logger
			if noShm {
				cfg.ShmPath = ""
			} else if cfg.ShmPath == "" {
				cfg.ShmPath = wsync.DefaultShmPath(cfg.Model)
			}
			var gm *metrics.GRPCServerMetrics
			if metricsListen != "" {
				gm = metrics.NewGRPCServerMetrics()
				cfg.ServerOptions = gm.ServerOptions()
			}
			r, err := wsync.NewRelay(cfg)
			if err != nil {
				return err
			}
			if metricsListen != "" {
				ms, err := metrics.New(metrics.Config{Listen: metricsListen, GRPC: gm, Role: "relay " + cfg.Model, Logger: g.logger,
					Sources: metrics.Sources{Sync: r.Service().Stats}})
				if err != nil {
					return err
				}
				return runBoth(cmd.Context(), r.Run, ms.Run)
			}
			// With --etcd the relay is announced in etcd for collectors
			// to find (docs/cluster.md, Clients).
			withdraw, err := announce(cmd, g.logger, cluster.ServiceInfo{Kind: cluster.KindRelay, ID: cfg.ID, Addr: r.Addr(), Model: cfg.Model})
			if err != nil {
				done, stop := context.WithCancel(cmd.Context())
				stop()
				_ = r.Run(done) // releases the listener and segment
				return err
			}
			defer withdraw()
			g.logger.Info("relay serving", "model", cfg.Model, "upstream", upstream, "listen", r.Addr(), "shm", cfg.ShmPath)
			fmt.Fprintf(g.stdout, "relay %s: listening on %s, shm %q\n", cfg.Model, r.Addr(), cfg.ShmPath)
			return r.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&upstream, "upstream", "", "upstream hub address (required)")
	f.StringVar(&cfg.Model, "model", "", "model to relay (required)")
	f.StringVar(&cfg.ID, "id", "", "the relay's collector id upstream (default relay-<hostname>)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7471", "where local collectors attach")
	f.StringVar(&cfg.ShmPath, "shm", "", "shared-memory segment (default /dev/shm/rlhub-<model>)")
	f.BoolVar(&noShm, "no-shm", false, "serve the stream only, no shared-memory segment")
	f.Int64Var(&cfg.ShmCapacity, "shm-capacity", 0, "segment slot size in bytes (default: twice the first version)")
	f.StringVar(&cfg.ShmGroup, "shm-group", "", "group (name or id) the segment belongs to, mode 0660; default 0600, this user only")
	f.IntVar(&cfg.ShmSlots, "shm-slots", 2, "segment slots: 2 + n let n local collectors lease versions and use them in place instead of copying")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics and the dashboard over HTTP on this address (default off)")
	cmd.MarkFlagRequired("upstream")
	cmd.MarkFlagRequired("model")
	return cmd
}
