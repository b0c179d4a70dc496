package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/aggregator"
)

func newAggregatorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "aggregator",
		Short: "Inspect the learner aggregator",
	}
	var hub hubFlags
	status := &cobra.Command{
		Use:   "status",
		Short: "List attached learners, their leases and task counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var st aggregator.Stats
			err := hub.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) (err error) {
				st, err = aggregator.NewClient(conn).HubStats(ctx)
				return err
			})
			if err != nil {
				return fmt.Errorf("aggregator status %s: %w", hub.addr, err)
			}
			task := st.TaskID
			if task == "" {
				task = "(none)"
			}
			fmt.Fprintf(g.stdout, "task %s; learners attached %d (ever %d, removed %d); learn ok %d, failed %d; re-splits %d\n",
				task, len(st.Learners), st.Attached, st.Removed, st.LearnOK, st.LearnFailed, st.Resplits)
			tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LEARNER\tLEASE LEFT\tSTARTED TASK\tDONE\tFAILED\tRESOURCES")
			for _, l := range st.Learners {
				var res []string
				for k, v := range l.Resources {
					res = append(res, k+"="+v)
				}
				slices.Sort(res)
				fmt.Fprintf(tw, "%s\t%v\t%s\t%d\t%d\t%s\n", l.ID, l.LeaseLeft.Round(time.Millisecond),
					l.StartedTask, l.TasksDone, l.TasksFailed, strings.Join(res, ","))
			}
			return tw.Flush()
		},
	}
	hub.register(status, "hub address")
	cmd.AddCommand(status)
	return cmd
}
