package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
)

// dialHub opens a client connection to a hub address.
func dialHub(addr string) (*grpc.ClientConn, error) {
	// The unzeroed receive-buffer pool, as every rlhub client uses: the
	// relay and collectors behind this connection receive whole models.
	opts := append(chunkcodec.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

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
	conn, err := dialHub(f.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	return fn(ctx, conn)
}
