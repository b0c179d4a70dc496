package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func newReducerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reducer",
		Short: "Inspect the gradient reducer",
	}
	var addr string
	var timeout time.Duration
	stats := &cobra.Command{
		Use:   "stats",
		Short: "Print the reducer counters of a hub (pushed, reduced, applied, dropped by reason)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: dialConfig(cmd.Context())})
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			resp, err := c.Stats(ctx, "")
			if err != nil {
				return fmt.Errorf("reducer stats %s: %w", addr, err)
			}
			printReducerStats(g, resp)
			return nil
		},
	}
	stats.Flags().StringVar(&addr, "hub", "127.0.0.1:7470", "hub address")
	stats.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "deadline for the call")
	cmd.AddCommand(stats, newReducerRegisterCmd(g))
	return cmd
}

// printReducerStats prints a hub's reducer counters, converted back to the
// reducer.Stats the hub's Go API (hub.Hub.Reducer().Stats()) returns, so
// both show the same numbers.
func printReducerStats(g *globals, r *rlhubv1.ReducerStatsResponse) {
	st := reducer.StatsFromProto(r)
	row := func(name string, c reduce.Counters, queue int) {
		fmt.Fprintf(g.stdout, "%-16s pushed %d  reduced %d  applied %d  steps %d  dropped %d  queue %d  attempts %d\n",
			name, c.Pushed, c.Reduced, c.Applied, c.Steps, c.DroppedTotal(), queue, c.Attempts)
		for _, reason := range slices.Sorted(maps.Keys(c.Dropped)) {
			fmt.Fprintf(g.stdout, "%-16s   dropped %-14s %d\n", "", reason, c.Dropped[reason])
		}
	}
	row("total", st.Total, st.QueueDepth)
	for _, name := range slices.Sorted(maps.Keys(st.Parts)) {
		row(name, st.Parts[name], st.PartQueue[name])
	}
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		m := st.Models[name]
		fmt.Fprintf(g.stdout, "model %s at version %d, optimizer step %d (%d steps into reused blobs)\n", name, m.Version, m.OptimizerSteps, m.BlobsReused)
		if m.StateError != "" {
			fmt.Fprintf(g.stdout, "model %s: OPTIMIZER STATE NOT RECOVERED: %s\n", name, m.StateError)
		}
	}
	fmt.Fprintf(g.stdout, "admitted→published p50 %dµs p99 %dµs\n", st.P50.Microseconds(), st.P99.Microseconds())
	for _, a := range slices.Sorted(maps.Keys(st.Unreachable)) {
		fmt.Fprintf(g.stdout, "secondary hub %s UNREACHABLE (its counters are missing from the total): %s\n", a, st.Unreachable[a])
	}
}
