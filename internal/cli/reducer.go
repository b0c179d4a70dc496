package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"

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
			c, err := reducer.NewClient(reducer.ClientConfig{Hub: addr})
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
	cmd.AddCommand(stats)
	return cmd
}

func printReducerStats(g *globals, r *rlhubv1.ReducerStatsResponse) {
	row := func(name string, c *rlhubv1.ReducerCounters) {
		var dropped uint64
		for _, n := range c.GetDropped() {
			dropped += n
		}
		fmt.Fprintf(g.stdout, "%-16s pushed %d  reduced %d  applied %d  steps %d  dropped %d  queue %d\n",
			name, c.GetPushed(), c.GetReduced(), c.GetApplied(), c.GetSteps(), dropped, c.GetQueueDepth())
		for _, reason := range slices.Sorted(maps.Keys(c.GetDropped())) {
			fmt.Fprintf(g.stdout, "%-16s   dropped %-14s %d\n", "", reason, c.GetDropped()[reason])
		}
	}
	row("total", r.GetTotal())
	for _, name := range slices.Sorted(maps.Keys(r.GetParts())) {
		row(name, r.GetParts()[name])
	}
	for _, m := range slices.Sorted(maps.Keys(r.GetVersions())) {
		fmt.Fprintf(g.stdout, "model %s at version %d\n", m, r.GetVersions()[m])
	}
	fmt.Fprintf(g.stdout, "admitted→published p50 %.0fµs p99 %.0fµs\n", r.GetPublishP50Us(), r.GetPublishP99Us())
}
