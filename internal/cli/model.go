package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
)

// newModelCmd is `rlhub model push|pull|ls|rm`: the model store from the
// command line.
func newModelCmd(g *globals) *cobra.Command {
	var addr string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Push, pull and list models in a hub's ordered model store",
	}
	cmd.PersistentFlags().StringVar(&addr, "hub", "127.0.0.1:7470", "hub address")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 2*time.Minute, "deadline for the whole operation")
	client := func(ctx context.Context) (*storerpc.Client, context.Context, context.CancelFunc, error) {
		c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, Dial: dialConfig(ctx)})
		if err != nil {
			return nil, nil, nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		return c, ctx, func() { cancel(); c.Close() }, nil
	}
	cmd.AddCommand(newModelPushCmd(g, client), newModelPullCmd(g, client), newModelLsCmd(g, client), newModelRmCmd(g, client), newModelBenchCmd(g, client))
	return cmd
}

type clientFunc func(ctx context.Context) (*storerpc.Client, context.Context, context.CancelFunc, error)

func newModelPushCmd(g *globals, client clientFunc) *cobra.Command {
	var name string
	var version, expect, epoch uint64
	cmd := &cobra.Command{
		Use:   "push --name NAME --version V [--expect N] FILE.safetensors",
		Short: "Push a safetensors file as a new version (compare-and-set with --expect)",
		Long: "push uploads FILE as version V of model NAME. With --expect N the push lands only\n" +
			"if N is the current version (0: the model must not exist yet); without it only\n" +
			"the version and epoch rules apply. A refused push prints the current version.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			blob, err := readAligned(args[0])
			if err != nil {
				return err
			}
			// Fail fast on a file the hub would refuse anyway.
			if _, err := safetensors.Decode(blob); err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			req := store.PushRequest{Name: name, Version: version, Expect: store.ExpectAny, Epoch: epoch, Blob: blob}
			if cmd.Flags().Changed("expect") {
				req.Expect = expect
			}
			c, ctx, done, err := client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			info, err := c.Push(ctx, req)
			if err != nil {
				return fmt.Errorf("push %s v%d: %w", name, version, err)
			}
			fmt.Fprintf(g.stdout, "pushed %s v%d (epoch %d, %d bytes)\n", info.Name, info.Version, info.Epoch, info.Bytes)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "model name (required)")
	f.Uint64Var(&version, "version", 0, "version to write, greater than the current one (required)")
	f.Uint64Var(&expect, "expect", 0, "version expected to be current (0: must not exist); omit to skip the check")
	f.Uint64Var(&epoch, "epoch", 0, "writer epoch (fencing token)")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("version")
	return cmd
}

func newModelPullCmd(g *globals, client clientFunc) *cobra.Command {
	var name, out string
	var version uint64
	cmd := &cobra.Command{
		Use:   "pull --name NAME [--version V] -o FILE",
		Short: "Pull a model version (newest by default) into a safetensors file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			snap, err := c.Get(ctx, name, version)
			if err != nil {
				return fmt.Errorf("pull %s: %w", name, err)
			}
			if err := atomicfile.Write(out, snap.Blob); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "pulled %s v%d (epoch %d, %d bytes) to %s\n", snap.Name, snap.Version, snap.Epoch, len(snap.Blob), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "model name (required)")
	f.Uint64Var(&version, "version", 0, "exact version; 0 means the newest")
	f.StringVarP(&out, "output", "o", "", "file to write (required)")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("output")
	return cmd
}

func newModelLsCmd(g *globals, client clientFunc) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List models: newest version, epoch, size, time and retained versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			infos, err := c.List(ctx)
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tEPOCH\tBYTES\tCREATED\tRETAINED\tOWNER")
			for _, in := range infos {
				ret := make([]string, len(in.Retained))
				for i, v := range in.Retained {
					ret[i] = fmt.Sprint(v)
				}
				owner := in.Owner
				if owner == "" {
					owner = "-"
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", in.Name, in.Version, in.Epoch, in.Bytes,
					in.Created.UTC().Format(time.RFC3339), strings.Join(ret, ","), owner)
			}
			return tw.Flush()
		},
	}
}

// newModelRmCmd is `rlhub model rm`: the store's Delete.
//
// TODO(sec-auth): an administrator's operation; the role table must allow
// the Delete RPC to the admin role only.
func newModelRmCmd(g *globals, client clientFunc) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "rm --name NAME",
		Short: "Delete a model: every version, its epoch and its owner (an administrator's operation)",
		Long: "rm removes model NAME from the hub's store, in memory and on disk, whoever owns it\n" +
			"(a model the reducer reduces stops taking gradients: its next step cannot publish).\n" +
			"A later push of version 1 creates the model afresh.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := c.Delete(ctx, name); err != nil {
				return fmt.Errorf("rm %s: %w", name, err)
			}
			fmt.Fprintf(g.stdout, "deleted %s\n", name)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "model name (required)")
	cmd.MarkFlagRequired("name")
	return cmd
}

// readAligned reads a whole file into an 8-byte-aligned buffer, so the
// decoded tensors can be viewed in place.
func readAligned(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	buf := tensor.AlignedBytes(int(st.Size()))
	if _, err := io.ReadFull(fh, buf); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf, nil
}
