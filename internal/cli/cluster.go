package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/hub"
)

// clusterFlags are --etcd and --cluster, shared by serve and cluster status.
type clusterFlags struct {
	etcd     string
	name     string
	leaseTTL time.Duration
	embedded string
	embedURL string
	id       string
}

func (f *clusterFlags) endpoints() []string {
	var out []string
	for _, e := range strings.Split(f.etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			if !strings.Contains(e, "://") {
				e = "http://" + e
			}
			out = append(out, e)
		}
	}
	return out
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated (host:port or URL); with serve: join that cluster (experimental: election and membership only, see docs/cluster.md)")
	cmd.Flags().StringVar(&f.name, "cluster", "rlhub", "cluster name (keys under /rlhub/NAME/)")
}

func newClusterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Inspect a cluster of hubs on etcd (members, primary, epoch)",
	}
	var f clusterFlags
	var timeout time.Duration
	status := &cobra.Command{
		Use:   "status",
		Short: "List the cluster's members and its primary with the epoch of its term",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.etcd == "" {
				return errors.New("cluster status needs --etcd ENDPOINTS")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := cluster.Read(ctx, cluster.Config{Endpoints: f.endpoints(), Cluster: f.name, DialTimeout: timeout})
			if err != nil {
				return fmt.Errorf("cluster status: %w", err)
			}
			if st.Primary != nil {
				fmt.Fprintf(g.stdout, "cluster %s: primary %s\n", f.name, st.Primary)
			} else {
				fmt.Fprintf(g.stdout, "cluster %s: no primary\n", f.name)
			}
			tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MEMBER\tADDR\tROLE\tUP")
			for _, m := range st.Members {
				role := "standby"
				if st.Primary != nil && st.Primary.ID == m.ID {
					role = "primary"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", m.ID, m.Addr, role, time.Since(m.Started).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	f.register(status)
	status.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "deadline for reading etcd")
	cmd.AddCommand(status)
	return cmd
}

// runClustered serves h as a member of the cluster: it starts an embedded
// etcd first if asked, joins once the hub listens (advertising its bound
// address), campaigns, and leaves the cluster before the hub closes.
//
// The hub's behaviour does not change with its role yet: the election,
// membership and epochs are in place, replication and write gating on
// standbys are not (docs/cluster.md).
func runClustered(ctx context.Context, h *hub.Hub, f *clusterFlags, logger *slog.Logger) error {
	endpoints := f.endpoints()
	if f.embedded != "" {
		emb, err := cluster.StartEmbedded(cluster.EmbeddedConfig{Dir: f.embedded, ClientURL: f.embedURL})
		if err != nil {
			return err
		}
		defer emb.Close()
		logger.Info("embedded etcd serving", "endpoint", emb.Endpoint(), "dir", f.embedded)
		if len(endpoints) == 0 {
			endpoints = []string{emb.Endpoint()}
		}
	}
	if err := h.Start(); err != nil {
		return err
	}
	defer h.Close()
	id := f.id
	if id == "" { // unique per listening hub: hostname and port
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(h.Addr().String())
		id = host + "-" + port
	}
	m, err := cluster.Join(ctx, cluster.Config{Endpoints: endpoints, Cluster: f.name, ID: id, Addr: h.Addr().String(),
		LeaseTTL: f.leaseTTL, Logger: logger})
	if err != nil {
		return err
	}
	// Cluster/Primary now answers with the election's leader.
	h.Cluster().SetSource(clusterrpc.FromMember(m, f.name))
	var wg sync.WaitGroup
	cctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { campaignLoop(cctx, m, logger) })
	<-ctx.Done()
	cancel()
	wg.Wait()
	return errors.Join(m.Close(), h.Close())
}

// campaignLoop keeps the member in the election until ctx ends: it
// campaigns, holds the term until its lease is lost, and campaigns again
// after a pause when etcd is unreachable.
func campaignLoop(ctx context.Context, m *cluster.Member, logger *slog.Logger) {
	for ctx.Err() == nil {
		term, err := m.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			logger.Warn("cluster: campaign failed; retrying", "err", err)
			if errors.Is(err, cluster.ErrDeposed) {
				logger.Error("cluster: this hub's lease is gone; restart it to rejoin")
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-term.Lost():
			logger.Error("cluster: lost the primary's lease; stepping down", "epoch", term.Epoch)
			return
		}
	}
}
