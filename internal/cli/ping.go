package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// dialHub opens a client connection to a hub address.
func dialHub(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

func newPingCmd(g *globals) *cobra.Command {
	var addr string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "ping",
		Short: "Check that a hub is up (gRPC health round trip)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := dialHub(addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			start := time.Now()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			if err != nil {
				return fmt.Errorf("health check %s: %w", addr, err)
			}
			if resp.Status != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("hub %s is %v", addr, resp.Status)
			}
			fmt.Fprintf(g.stdout, "hub %s: %v in %v\n", addr, resp.Status, time.Since(start).Round(time.Microsecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "hub", "127.0.0.1:7470", "hub address")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the hub")
	return cmd
}
