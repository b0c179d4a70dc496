package cli

import (
	"context"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/wsync"
)

// newSyncCmd is `rlhub sync status`: weight-sync lag as the hub sees it.
func newSyncCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Weight sync: which version each collector runs",
	}
	var hub hubFlags
	var model string
	status := &cobra.Command{
		Use:   "status [--hub ADDR] [--model NAME]",
		Short: "Show each collector's version and lag, and a lag histogram, per model",
		Long: "status lists, per model, the newest version the hub has and every collector that\n" +
			"attached to the push stream or reported a version (directly or through a relay):\n" +
			"the version it runs, its lag (newest - version), how it gets weights, and a\n" +
			"histogram of collectors per lag bucket.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var st []wsync.ModelStatus
			err := hub.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) (err error) {
				st, err = wsync.Status(ctx, conn, model)
				return err
			})
			if err != nil {
				return fmt.Errorf("sync status %s: %w", hub.addr, err)
			}
			printSyncStatus(g, st, time.Now())
			return nil
		},
	}
	hub.register(status, "hub (or relay) address")
	status.Flags().StringVar(&model, "model", "", "only this model")
	cmd.AddCommand(status, newShmWriterCmd(g))
	return cmd
}

func printSyncStatus(g *globals, st []wsync.ModelStatus, now time.Time) {
	if len(st) == 0 {
		fmt.Fprintln(g.stdout, "no collectors")
		return
	}
	for i, ms := range st {
		if i > 0 {
			fmt.Fprintln(g.stdout)
		}
		fmt.Fprintf(g.stdout, "model %s: newest v%d, %d collectors\n", ms.Model, ms.Newest, len(ms.Collectors))
		tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "COLLECTOR\tVERSION\tLAG\tVIA\tATTACHED\tREPORTED")
		for _, c := range ms.Collectors {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%v\t%s ago\n", c.ID, c.Version, c.Lag, c.Via, c.Attached, now.Sub(c.Reported).Round(time.Millisecond))
		}
		tw.Flush()
		var hist []string
		for _, b := range ms.Histogram {
			label := fmt.Sprintf("≤%d", b.Max)
			if b.Max == math.MaxUint64 {
				label = "more"
			}
			hist = append(hist, fmt.Sprintf("%s:%d", label, b.Count))
		}
		fmt.Fprintf(g.stdout, "lag histogram: %s\n", strings.Join(hist, " "))
	}
}
