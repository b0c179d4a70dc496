package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/learner"
)

func newLearnerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "learner",
		Short: "Run a learner that attaches to the hub's aggregator",
	}
	ex := &learner.Example{}
	var addr, model string
	example := &cobra.Command{
		Use:   "example",
		Short: "Run the example linear-regression learner until interrupted",
		Long: "example attaches to the aggregator, takes its weights from the task info (\"w\")\n" +
			"and returns, per share of a batch (\"x\" F32 [n,d], \"y\" F32 [n], optional \"row\"\n" +
			"I64 [n]), the gradient and loss sums of a squared loss. With --model it reads the\n" +
			"weights from the model store and pushes each share's gradient to the reducer.\n" +
			"It re-attaches after any break. Events are printed on stdout, one per line.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ex.ID == "" {
				host, _ := os.Hostname()
				ex.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
			}
			ex.Events = g.stdout
			ex.Dial = dialConfig(cmd.Context())
			if model != "" {
				closeClients, err := ex.UseHub(addr, model)
				if err != nil {
					return err
				}
				defer closeClients()
			}
			cfg := ex.Config(addr)
			cfg.Logger = g.logger
			cfg.OnAttach = func() { fmt.Fprintf(g.stdout, "attached %s\n", ex.ID) }
			err := learner.Run(cmd.Context(), cfg)
			if errors.Is(err, context.Canceled) {
				return nil // interrupted: a clean stop
			}
			return err
		},
	}
	f := example.Flags()
	f.StringVar(&addr, "hub", "127.0.0.1:7470", "hub address")
	f.StringVar(&ex.ID, "id", "", "learner id (default HOST-PID)")
	f.Int64Var(&ex.BatchSize, "batch-size", 32, "rows demanded per learn")
	f.DurationVar(&ex.Delay, "delay", 0, "sleep before each learn (drills)")
	f.BoolVar(&ex.BadInfo, "bad-info", false, "return malformed info (drills)")
	f.StringVar(&model, "model", "", "train this store model (tensor \"w\" [d]) through the hub's reducer instead of taking \"w\" from the task info")
	cmd.AddCommand(example)
	return cmd
}
