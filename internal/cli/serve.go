package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/hub"
)

func newServeCmd(g *globals) *cobra.Command {
	var cfg hub.Config
	var role string
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
			switch role {
			case "all":
				if cfg.Reducer.Primary != "" {
					return fmt.Errorf("--primary needs --role reducer")
				}
			case "reducer":
				if cfg.Reducer.Primary == "" {
					return fmt.Errorf("--role reducer needs --primary ADDR")
				}
			default:
				return fmt.Errorf("--role %q: want all or reducer", role)
			}
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
	f.StringVar(&role, "role", "all", "all: host every service, the reducer primary included; reducer: host secondary reducers of the primary at --primary")
	f.StringVar(&cfg.Reducer.Primary, "primary", "", "address of the hub hosting the reducer primary (with --role reducer)")
	f.IntVar(&cfg.Reducer.Secondaries, "reducer-secondaries", 1, "secondary reducers hosted here (-1: none)")
	f.IntVar(&cfg.Reducer.BatchSize, "reduce-batch-size", 4, "gradients per batch a secondary forwards")
	f.DurationVar(&cfg.Reducer.MaxWait, "max-wait", 5*time.Millisecond, "longest a batch waits to fill before it is forwarded")
	f.IntVar(&cfg.Reducer.MaxQueue, "max-queue-size", 0, "gradients a secondary holds before refusing pushes (0: 4 × batch size)")
	return cmd
}
