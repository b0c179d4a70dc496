package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func newPingCmd(g *globals) *cobra.Command {
	var hub hubFlags
	var wait bool
	cmd := &cobra.Command{
		Use:   "ping",
		Short: "Check that a hub or relay is up (gRPC health round trip)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return hub.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				start := time.Now()
				// Without --wait a hub that refuses the connection is an
				// answer (Unavailable at once), not a reason to sit out
				// --timeout, as every other command fails.
				resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(wait))
				if err != nil {
					return fmt.Errorf("health check %s: %w", hub.addr, err)
				}
				if resp.Status != healthpb.HealthCheckResponse_SERVING {
					return fmt.Errorf("hub %s is %v", hub.addr, resp.Status)
				}
				fmt.Fprintf(g.stdout, "hub %s: %v in %v\n", hub.addr, resp.Status, time.Since(start).Round(time.Microsecond))
				return nil
			})
		},
	}
	hub.register(cmd, "hub address")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait up to --timeout for a hub that is starting, instead of failing at once")
	return cmd
}
