package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/aggregator"
)

func newAggregatorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "aggregator",
		Short: "Inspect the learner aggregator",
	}
	var addr string
	var timeout time.Duration
	status := &cobra.Command{
		Use:   "status",
		Short: "List attached learners, their leases and task counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := dialHub(addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := aggregator.NewClient(conn).Status(ctx)
			if err != nil {
				return fmt.Errorf("aggregator status %s: %w", addr, err)
			}
			task := st.TaskId
			if task == "" {
				task = "(none)"
			}
			fmt.Fprintf(g.stdout, "task %s; learners attached %d (ever %d, removed %d); learn ok %d, failed %d; re-splits %d\n",
				task, len(st.Learners), st.AttachedTotal, st.RemovedTotal, st.LearnOk, st.LearnFailed, st.Resplits)
			tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LEARNER\tLEASE LEFT\tSTARTED TASK\tDONE\tFAILED\tRESOURCES")
			for _, l := range st.Learners {
				var res []string
				for k, v := range l.Resources {
					res = append(res, k+"="+v)
				}
				slices.Sort(res)
				fmt.Fprintf(tw, "%s\t%v\t%s\t%d\t%d\t%s\n", l.LearnerId, time.Duration(l.LeaseRemainingMs)*time.Millisecond,
					l.StartedTask, l.TasksDone, l.TasksFailed, strings.Join(res, ","))
			}
			return tw.Flush()
		},
	}
	status.Flags().StringVar(&addr, "hub", "127.0.0.1:7470", "hub address")
	status.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the hub")
	cmd.AddCommand(status)
	return cmd
}
