package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

// grpcClientConn is what dialHub returns.
type grpcClientConn = grpc.ClientConn

// hubFlags are the --hub and --timeout flags of a one-shot command that
// asks a hub something and prints the answer.
type hubFlags struct {
	addr    string
	timeout time.Duration
}

func (f *hubFlags) register(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.addr, "hub", "127.0.0.1:7470", what)
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline for the call")
}

// call dials the hub, runs fn under the command's context with the
// --timeout deadline, and closes the connection.
func (f *hubFlags) call(cmd *cobra.Command, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	conn, err := dialHub(cmd.Context(), f.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	return fn(ctx, conn)
}
