package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/buildinfo"
)

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the rlhub version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(g.stdout, buildinfo.String())
			return err
		},
	}
}
