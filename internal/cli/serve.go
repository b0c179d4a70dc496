package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/hub"
)

func newServeCmd(g *globals) *cobra.Command {
	var cfg hub.Config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the hub: every rlhub service behind one gRPC server",
		Long: "serve runs the embedded single-machine hub: the model store (checkpoints under\n" +
			"--data), the reducers, weight sync, the learner aggregator and the ARS\n" +
			"coordinator, plus the standard gRPC health service. SIGINT or SIGTERM stops it\n" +
			"gracefully.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Logger = g.logger
			h, err := hub.New(cfg)
			if err != nil {
				return err
			}
			return h.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", hub.DefaultListen, "gRPC listen address")
	f.StringVar(&cfg.DataDir, "data", "rlhub-data", "directory for checkpoints (\"\" keeps nothing on disk)")
	f.DurationVar(&cfg.StopTimeout, "stop-timeout", 5*time.Second, "graceful stop budget before a hard stop")
	return cmd
}
