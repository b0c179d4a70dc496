package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/replica"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// clusterFlags are --etcd and --cluster, shared by serve and cluster status.
type clusterFlags struct {
	etcd     string
	name     string
	leaseTTL time.Duration
	embedded string
	embedURL string
	id       string
	// acks and ackTimeout: --replica-acks, --replica-ack-timeout.
	acks       string
	ackTimeout time.Duration
	// faultBackoff: --replica-fault-backoff.
	faultBackoff time.Duration
	// scrubEvery: --replica-scrub-every.
	scrubEvery time.Duration
	// insecure is serve's --insecure: it allows plaintext etcd off
	// loopback too.
	insecure bool
	// sync: --replica-sync (when a standby acknowledges a unit).
	sync string
	// transport: --replica-transport (how a standby follows).
	transport string
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
	cmd.Flags().StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated (host:port or URL); with serve: join that cluster (standbys follow the primary and take over: docs/cluster.md)")
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
		Short: "List the cluster's members, its primary and the epoch of its term, and each member's replication",
		Long: "status reads the members and the primary from etcd, then asks each member's hub\n" +
			"(with the connection flags) where it stands: UNIT is the newest replication unit\n" +
			"the primary asked for, or a standby applied; LAG is how many units a standby is\n" +
			"behind, as the primary counts its acknowledgements (\"not following\": no stream\n" +
			"open); SYNCED is yes while a standby holds the primary's full state. \"?\": the\n" +
			"hub did not answer within --timeout (the reason is printed below the table).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.etcd == "" {
				return errors.New("cluster status needs --etcd ENDPOINTS")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := cluster.Read(ctx, cluster.Config{Endpoints: f.endpoints(), Cluster: f.name, DialTimeout: timeout, Security: etcdSecurity(ctx, false)})
			if err != nil {
				return fmt.Errorf("cluster status: %w", err)
			}
			if st.Primary != nil {
				fmt.Fprintf(g.stdout, "cluster %s: primary %s\n", f.name, st.Primary)
			} else {
				fmt.Fprintf(g.stdout, "cluster %s: no primary\n", f.name)
			}
			if st.InSync != nil {
				fmt.Fprintf(g.stdout, "in sync (only these may take over): %s (recorded at epoch %d)\n", strings.Join(st.InSync.Members, ","), st.InSync.Epoch)
			}
			repl, failed := replicationOf(ctx, st.Members)
			var primary *rlhubv1.ReplicationResponse
			if st.Primary != nil {
				primary = repl[st.Primary.ID]
			}
			tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MEMBER\tADDR\tROLE\tUP\tUNIT\tLAG\tSYNCED")
			for _, m := range st.Members {
				role := "standby"
				if st.Primary != nil && st.Primary.ID == m.ID {
					role = "primary"
				}
				unit, lag, synced := replicationColumns(m.ID, repl[m.ID], primary, role == "primary")
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\n", m.ID, m.Addr, role, time.Since(m.Started).Round(time.Second), unit, lag, synced)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, m := range st.Members {
				if err, ok := failed[m.ID]; ok {
					fmt.Fprintf(g.stdout, "%s: replication unknown: %v\n", m.ID, err)
				}
			}
			return nil
		},
	}
	f.register(status)
	status.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "deadline for reading etcd")
	cmd.AddCommand(status)

	var ff clusterFlags
	var yes bool
	forget := &cobra.Command{
		Use:   "forget-in-sync",
		Short: "Let any member take over, accepting the loss of what only the in-sync members held (they are gone for good)",
		Long: "With --replica-acks all, only a member the cluster's in-sync record lists (cluster status:\n" +
			"\"in sync\") may serve as primary: the others' copies may lack acknowledged publishes.\n" +
			"When every listed member is lost for good (its disk gone), the others wait for ever.\n" +
			"forget-in-sync deletes the record: the member with the newest copy among those left is\n" +
			"elected, and the publishes only the lost members held are lost. docs/cluster.md, \"Who may\n" +
			"take over\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ff.etcd == "" {
				return errors.New("cluster forget-in-sync needs --etcd ENDPOINTS")
			}
			if !yes {
				return errors.New("cluster forget-in-sync loses what only the in-sync members held: give --yes once they are gone for good")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rec, err := cluster.ForgetInSync(ctx, cluster.Config{Endpoints: ff.endpoints(), Cluster: ff.name, DialTimeout: timeout, Security: etcdSecurity(ctx, false)})
			if err != nil {
				return fmt.Errorf("cluster forget-in-sync: %w", err)
			}
			if rec == nil {
				fmt.Fprintf(g.stdout, "cluster %s: no in-sync record; any member may take over\n", ff.name)
				return nil
			}
			fmt.Fprintf(g.stdout, "cluster %s: forgot the in-sync record (%s, epoch %d); any member may take over\n", ff.name, strings.Join(rec.Members, ","), rec.Epoch)
			return nil
		},
	}
	ff.register(forget)
	forget.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "deadline for reaching etcd")
	forget.Flags().BoolVar(&yes, "yes", false, "confirm that the in-sync members are lost for good")
	cmd.AddCommand(forget)
	return cmd
}

// runClustered serves cfg's hub as a member of the cluster
// (internal/replica): a standby that follows the primary into --data and
// refuses writes until it is elected, then the primary, opened on that
// data; an embedded etcd is started first if asked.
func runClustered(ctx context.Context, cfg hub.Config, f *clusterFlags, logger *slog.Logger) error {
	acks, err := parseAcks(f.acks)
	if err != nil {
		return err
	}
	syncMode, err := replica.ParseSyncMode(f.sync)
	if err != nil {
		return err
	}
	transport, err := replica.ParseTransport(f.transport)
	if err != nil {
		return err
	}
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
	dc := dialConfig(ctx)
	node, err := replica.NewNode(replica.NodeConfig{
		Hub:        cfg,
		Cluster:    cluster.Config{Endpoints: endpoints, Cluster: f.name, ID: f.id, LeaseTTL: f.leaseTTL, Security: etcdSecurity(ctx, f.insecure)},
		Acks:       acks,
		AckTimeout: f.ackTimeout,
		// A standby that cannot write its copy leaves for this long.
		FaultBackoff: f.faultBackoff,
		Sync:         syncMode,
		ScrubEvery:   f.scrubEvery,
		// A test-only hook: SIGKILL a standby at a named point of a unit's
		// install (replica.FollowerConfig.CrashAt).
		CrashAt: os.Getenv("RLHUB_TEST_REPLICA_CRASH"),
		Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			// The replication stream carries whole model versions: windows
			// of a unit's size, so one is not paced by 64 KiB round trips.
			return dc.GRPC(addr, grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(16<<20),
				grpc.WithReadBufferSize(1<<20), grpc.WithWriteBufferSize(1<<20))
		},
		// The data plane's client, with the same TLS and token.
		Bulk:      dc.Bulk(),
		Transport: transport,
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	return node.Run(ctx) // Cluster/Primary answers with the election in every role
}

func parseAcks(s string) (int, error) {
	if s == "all" {
		return replica.AcksAll, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--replica-acks %q: want all, 0 or a positive count", s)
	}
	return n, nil
}

// replicationOf asks every member (at its registered address, with the
// command's connection flags) for its place in the replication, within
// ctx, all at once; members that did not answer are in failed.
func replicationOf(ctx context.Context, members []cluster.MemberInfo) (map[string]*rlhubv1.ReplicationResponse, map[string]error) {
	type answer struct {
		id   string
		resp *rlhubv1.ReplicationResponse
		err  error
	}
	out := make(chan answer, len(members))
	for _, m := range members {
		go func() { // the owner: the loop below waits for every answer
			conn, err := dialHub(ctx, m.Addr)
			if err != nil {
				out <- answer{id: m.ID, err: err}
				return
			}
			defer conn.Close()
			resp, err := rlhubv1.NewClusterClient(conn).Replication(ctx, &rlhubv1.ReplicationRequest{})
			out <- answer{m.ID, resp, err}
		}()
	}
	repl, failed := map[string]*rlhubv1.ReplicationResponse{}, map[string]error{}
	for range members {
		a := <-out
		switch {
		case a.err != nil:
			failed[a.id] = grpcerr.FromStatus(a.err)
		case a.resp.GetMemberId() != a.id:
			// The address is another hub's now (a member restarted on a
			// new port, and another took the old one).
			failed[a.id] = fmt.Errorf("its address answers as member %s", errs.Quote(a.resp.GetMemberId()))
		default:
			repl[a.id] = a.resp
		}
	}
	return repl, failed
}

// replicationColumns are a member's UNIT, LAG and SYNCED (r: its answer,
// nil when it gave none; primary: the primary's): its own unit and, for a
// standby, the units it is behind as the primary counts them ("-" where
// there is nothing to say, "?" where no hub said).
func replicationColumns(id string, r, primary *rlhubv1.ReplicationResponse, isPrimary bool) (unit, lag, synced string) {
	unit, lag, synced = "?", "?", "?"
	if r != nil {
		unit = fmt.Sprint(r.GetUnit())
	}
	if isPrimary {
		return unit, "-", "-"
	}
	if r != nil {
		synced = "no"
		if r.GetSynced() {
			synced = "yes"
		}
	}
	if primary != nil {
		lag = "not following"
		for _, f := range primary.GetFollowers() {
			if f.GetMemberId() == id {
				lag = fmt.Sprint(f.GetLag())
			}
		}
	}
	return unit, lag, synced
}
