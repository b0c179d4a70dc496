package cli

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/streamcap"
)

func newServeCmd(g *globals) *cobra.Command {
	var cfg hub.Config
	var role, namePattern, mergeRule, homogKeys string
	var cl clusterFlags
	var sec serveSecurity
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the hub: every rlhub service behind one gRPC server",
		Long: "serve runs the embedded single-machine hub: the model store (checkpoints under\n" +
			"--data), the reducers, weight sync, the learner aggregator and the ARS\n" +
			"coordinator, plus the standard gRPC health service. SIGINT or SIGTERM stops it\n" +
			"gracefully.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Logger = g.logger
			// hub.Config reads 0 as "the default": a 0 given here would be
			// a silent 5 s stop, 1 MiB/s, 10 s, 3 versions retained, 1 GiB
			// pushes... refuse it instead, and a negative value with the
			// flag's name (the configs' own errors print their structs).
			if err := refuseNonPositive(cmd, "stop-timeout", "body-timeout", "body-min-rate", "frame-timeout", "idle-timeout", "max-wait",
				"reduce-batch-size", "reduce-journal-compact", "store-retain", "max-model-bytes", "max-push-bytes-in-flight",
				"max-header-bytes", "max-name-bytes", "max-policy-params", "ars-max-ended-runs"); err != nil {
				return err
			}
			// hub.Limits and reducer.Config read every negative value as
			// -1 (no cap, none): -5 is a typo, not a second way to say it.
			if err := refuseBelowMinusOne(cmd, "max-conns-per-peer", "max-streams-per-peer", "reducer-secondaries"); err != nil {
				return err
			}
			if err := sec.refuseIgnored(cmd); err != nil {
				return err
			}
			if err := refuseClusterOnly(cmd, &cl); err != nil {
				return err
			}
			if cfg.Reducer.Secondaries == 0 { // reducer.Config reads 0 as 1
				return fmt.Errorf("--reducer-secondaries 0: give -1 for none, or a count")
			}
			if namePattern != store.DefaultNamePattern.String() {
				re, err := regexp.Compile(namePattern)
				if err != nil {
					return fmt.Errorf("--name-pattern: %w", err)
				}
				cfg.Store.NamePattern = re
			}
			rule, err := aggregator.ParseMergeRule(mergeRule)
			if err != nil {
				return fmt.Errorf("--aggregator-merge: %w", err)
			}
			cfg.Aggregator.MergeRule = rule
			cfg.Aggregator.HomogeneousKeys = []string{}
			for _, k := range strings.Split(homogKeys, ",") {
				if k = strings.TrimSpace(k); k != "" {
					cfg.Aggregator.HomogeneousKeys = append(cfg.Aggregator.HomogeneousKeys, k)
				}
			}
			switch role {
			case "all":
				if cfg.Reducer.Primary != "" {
					return fmt.Errorf("--primary needs --role reducer")
				}
			case "reducer":
				if cfg.Reducer.Primary == "" && cl.etcd != "" {
					// The primary of the cluster the secondaries announce
					// themselves in (docs/cluster.md, Deployment).
					cfg.Reducer.Primary = dial.EtcdTarget(cl.etcd, cl.name)
				}
				if cfg.Reducer.Primary == "" {
					return fmt.Errorf("--role reducer needs --primary ADDR (or --etcd and --cluster)")
				}
				cfg.MetricsRole = "reducer (secondary)"
				if !cmd.Flags().Changed("data") {
					// The secondaries keep nothing on disk (the ledger
					// and the optimizer are the primary's), and the
					// default rlhub-data is the directory of a hub
					// started beside it: the process's unused services
					// run in memory.
					cfg.DataDir = ""
				}
			default:
				return fmt.Errorf("--role %q: want all or reducer", role)
			}
			// A test-only hook: SIGKILL the hub at a named point of the ARS
			// state writes (arsrpc.Config.CrashAt).
			cfg.ARS.CrashAt = os.Getenv("RLHUB_TEST_ARS_CRASH")
			cfg.Reducer.Dial = dialConfig(cmd.Context()) // the link to a remote --primary
			if err := sec.apply(g, &cfg); err != nil {
				return err
			}
			cl.insecure = sec.insecure
			if cl.etcd != "" && cl.embedded != "" {
				// The hubs of a cluster share one etcd: the embedded one
				// would be a second, which no other hub would find.
				return fmt.Errorf("--etcd and --embedded-etcd: give one (the hub with --embedded-etcd serves it at --embedded-etcd-url; the others name that with --etcd)")
			}
			if cl.etcd != "" && role == "reducer" {
				// Secondaries do not join the election: they announce
				// themselves for the clients to find.
				return runAnnouncedSecondaries(cmd.Context(), cfg, &cl, g.logger)
			}
			if cl.etcd != "" || cl.embedded != "" {
				if role != "all" {
					return fmt.Errorf("--embedded-etcd needs --role all (secondary reducers do not join the election)")
				}
				if cfg.Auth != nil {
					// A clustered hub is a standby between its terms as
					// primary, and each term starts a new hub: the token
					// file is watched (and SIGHUP handled) for the whole
					// process, not per term, so that a change made while
					// a standby is seen and SIGHUP never ends a standby.
					ctx, cancel := context.WithCancel(cmd.Context())
					defer cancel()
					cfg.AuthFile, cfg.AuthReloadOnSIGHUP = "", false
					watched := make(chan struct{})
					go func() { defer close(watched); _ = sec.watchTokens(ctx, cfg.Auth, g) }()
					defer func() { cancel(); <-watched }()
					return runClustered(ctx, cfg, &cl, g.logger)
				}
				return runClustered(cmd.Context(), cfg, &cl, g.logger)
			}
			h, err := hub.New(cfg)
			if err != nil {
				return err
			}
			return h.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	sec.register(cmd)
	f.StringVar(&cfg.Listen, "listen", hub.DefaultListen, "gRPC listen address (not loopback: needs TLS and --auth-tokens, or --insecure)")
	f.StringVar(&cfg.Advertise, "advertise", "", "the address other machines dial to reach this hub (registered in etcd with --etcd; what a --role reducer hub's secondaries give their --primary), HOST or HOST:PORT (default --listen's host and the bound port); needed when --listen names no machine, e.g. 0.0.0.0 in a Kubernetes pod reached by its DNS name (its TLS certificate must name it)")
	f.StringVar(&cfg.AddrFile, "addr-file", "", "write the bound address here once listening (with --listen 127.0.0.1:0)")
	f.StringVar(&cfg.DataDir, "data", "rlhub-data", "directory for checkpoints (\"\" keeps nothing on disk; with --role reducer \"\" unless given)")
	f.DurationVar(&cfg.StopTimeout, "stop-timeout", 5*time.Second, "graceful stop budget before a hard stop (a second SIGINT/SIGTERM stops at once)")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve Prometheus /metrics and the live dashboard (/) over HTTP on this address, e.g. 127.0.0.1:9470 (default off)")
	f.StringVar(&role, "role", "all", "all: host every service, the reducer primary included; reducer: host secondary reducers of the primary at --primary")
	f.StringVar(&cfg.Reducer.Primary, "primary", "", "address of the hub hosting the reducer primary (with --role reducer)")
	f.IntVar(&cfg.Reducer.Secondaries, "reducer-secondaries", 1, "secondary reducers hosted here (-1: none)")
	f.IntVar(&cfg.Reducer.BatchSize, "reduce-batch-size", 4, "gradients per batch a secondary forwards")
	f.DurationVar(&cfg.Reducer.MaxWait, "max-wait", 5*time.Millisecond, "longest a batch waits to fill before it is forwarded")
	cfg.Reducer.JournalCompactBytes = reducer.DefaultJournalCompactBytes
	f.Var((*byteSize)(&cfg.Reducer.JournalCompactBytes), "reduce-journal-compact", "a model's step journal is rewritten as one snapshot of its exactly-once ledger once it grows past this (bytes, or KiB/MiB/GiB) and past twice that snapshot; with --etcd each step ships only its new record, but a standby copies the journal before appending it, and a full sync and a restart read it whole: this bounds those")
	f.IntVar(&cfg.Reducer.MaxQueue, "max-queue-size", 0, "gradients a secondary holds before refusing pushes (0: 4 × batch size)")
	// Model store limits: each flag is the store.Config field of the same
	// name, with the store's default (docs/store.md, Limits).
	cfg.Store.MaxModelBytes, cfg.Store.MaxHeaderBytes = 1<<30, 16<<20
	f.IntVar(&cfg.Store.Retain, "store-retain", 3, "newest versions of each model the store keeps (in memory and under --data); older ones are dropped")
	f.Var((*byteSize)(&cfg.Store.MaxModelBytes), "max-model-bytes", "largest model blob a push may carry (bytes, or with a KiB/MiB/GiB suffix); a larger push fails with ResourceExhausted")
	cfg.Limits.MaxPushBytesInFlight = storerpc.DefaultMaxPushBytesInFlight
	f.Var((*byteSize)(&cfg.Limits.MaxPushBytesInFlight), "max-push-bytes-in-flight", "bytes the model pushes in progress may hold together, each its announced size from its header on (bytes, or with a KiB/MiB/GiB suffix); a push waits up to 30s for room, then fails with ResourceExhausted")
	f.Var((*byteSize)(&cfg.Store.MaxHeaderBytes), "max-header-bytes", "largest safetensors JSON header a pushed blob may have (bytes, or KiB/MiB/GiB)")
	f.BoolVar(&cfg.StoreNoDataPlane, "no-store-data-plane", false, "serve model pushes, pulls and watches and weight-sync watches over gRPC only, not on the data plane (as a hub before it did)")
	f.IntVar(&cfg.Store.MaxNameBytes, "max-name-bytes", 128, "longest model name, in bytes")
	f.DurationVar(&cfg.Limits.FrameTimeout, "frame-timeout", bulk.DefaultFrameTimeout, "a connection's first bytes and the rest of a started data-plane request must arrive within this; slower connections are closed")
	f.DurationVar(&cfg.Limits.IdleTimeout, "idle-timeout", bulk.DefaultIdleTimeout, "a data-plane connection with no request in progress is closed after this")
	f.DurationVar(&cfg.Limits.BodyTimeout, "body-timeout", bulk.DefaultBodyTimeout, "a pushed body (data plane or gRPC) must arrive whole, and a version sent (a pull, a watch, a weight stream, a policy, an optimizer step) be read whole, within this plus its length at --body-min-rate; a slower push fails with DeadlineExceeded and changes nothing, a slower reader is cut off (Unavailable) and asks again")
	cfg.Limits.BodyMinRate = bulk.DefaultBodyMinRate
	f.Var((*byteSize)(&cfg.Limits.BodyMinRate), "body-min-rate", "the slowest rate (bytes/s, or with a KiB/MiB/GiB suffix) a pushed body's deadline allows for: --body-timeout + length / this")
	f.IntVar(&cfg.Limits.MaxConnsPerPeer, "max-conns-per-peer", bulk.DefaultMaxConnsPerPeer, "open connections one peer IP may hold (gRPC and data plane); more are closed at accept (-1: no cap; 0: the default)")
	f.IntVar(&cfg.Limits.MaxStreamsPerPeer, "max-streams-per-peer", streamcap.DefaultPerPeer, "gRPC streams (watches, weight streams, pushes in flight) one peer IP may hold open at once; more fail ResourceExhausted (-1: no cap; 0: the default)")
	f.Int64Var(&cfg.Limits.MaxPolicyParams, "max-policy-params", arsrpc.DefaultMaxPolicyParams, "largest ARS policy (parameters, every layer's weights and biases) a StartRun may ask for")
	f.IntVar(&cfg.ARS.MaxEndedRuns, "ars-max-ended-runs", arsrpc.DefaultMaxEndedRuns, "ended ARS runs (done, failed or stopped) kept in memory, the newest: their progress, curve and policy answered as a live run's, on the dashboard and in metrics; an older one is answered from --data, or NotFound without it")
	f.StringVar(&mergeRule, "aggregator-merge", "di-engine", "how learners' infos merge: di-engine (DI-engine's merge_info) or strict (same keys everywhere, homogeneous keys equal); a task's Start may choose its own")
	f.StringVar(&homogKeys, "aggregator-homogeneous-keys", strings.Join(aggregator.DefaultHomogeneousKeys, ","), "comma-separated info keys that merge to the first learner's value (\"\": none); a task's Start may choose its own")
	f.StringVar(&namePattern, "name-pattern", store.DefaultNamePattern.String(), "regular expression every model name must match")
	// Cluster membership, replication and failover (docs/cluster.md).
	cl.register(cmd)
	f.StringVar(&cl.acks, "replica-acks", "all", "with --etcd: standbys that must have applied a publish before it is acknowledged: all (every registered standby), 0 (asynchronous: failover may lose recent publishes), or N")
	f.StringVar(&cl.sync, "replica-sync", "write", "with --etcd: when this hub, as a standby, acknowledges a publish: write (its files written, in the page cache: kill -9 of any process loses nothing acknowledged) or fsync (also on its disk: survives a power loss of every standby) — docs/cluster.md")
	f.StringVar(&cl.transport, "replica-transport", "auto", "with --etcd: how this hub, as a standby, follows the primary: auto (the data plane, falling back to the gRPC stream when the primary's data plane lacks it) or grpc — docs/cluster.md")
	f.DurationVar(&cl.ackTimeout, "replica-ack-timeout", 10*time.Second, "with --etcd: how long a publish waits for the standbys' acknowledgements before it fails with Unavailable")
	f.DurationVar(&cl.faultBackoff, "replica-fault-backoff", 30*time.Second, "with --etcd: how long this hub, as a standby that cannot write its copy (disk full, read-only or failing), stays out of the cluster before it joins again (no publish waits for it meanwhile)")
	f.DurationVar(&cl.scrubEvery, "replica-scrub-every", 24*time.Hour, "with --etcd: how often this hub, as a standby, checks its copy's checksums (as it does on start; at most 256 MiB/s) and has the primary send again what is damaged (0: on start only) — docs/durability.md")
	f.DurationVar(&cl.leaseTTL, "lease-ttl", 2*time.Second, "with --etcd: how long this hub's lease outlives its last keep-alive (whole seconds)")
	f.StringVar(&cl.id, "member-id", "", "with --etcd: this hub's member id, or with --role reducer the id its secondaries are announced under (default HOSTNAME-PORT)")
	f.StringVar(&cl.embedded, "embedded-etcd", "", "run a single-node etcd in this process with its data in DIR (a local cluster without an etcd to run)")
	f.StringVar(&cl.embedURL, "embedded-etcd-url", "http://127.0.0.1:2379", "client URL of the embedded etcd")
	return cmd
}

// byteSize is a flag value holding a byte count, written as an integer
// with an optional binary suffix: 1073741824, 1GiB, 512MiB, 64KiB.
type byteSize int64

var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b *byteSize) String() string {
	for _, u := range sizeUnits[:3] {
		if n := int64(*b); n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	num, shift := s, uint(0)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = rest, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return fmt.Errorf("%q is not a byte size (an integer with an optional KiB, MiB or GiB suffix)", s)
	}
	*b = byteSize(n << shift)
	return nil
}

func (*byteSize) Type() string { return "size" }

// clusterOnlyFlags are serve's flags that only a hub in a cluster reads
// (runClustered, runAnnouncedSecondaries). --advertise is not one: a
// --role reducer hub's secondaries give it to their --primary, which
// lists them to clients under it, with or without etcd.
var clusterOnlyFlags = []string{"cluster", "member-id", "lease-ttl", "replica-acks", "replica-sync",
	"replica-transport", "replica-ack-timeout", "replica-fault-backoff", "replica-scrub-every"}

// refuseClusterOnly refuses a cluster flag given to a hub that is in no
// cluster (no --etcd, no --embedded-etcd), and --embedded-etcd-url without
// --embedded-etcd: said so, rather than accepted and ignored (its value
// not even parsed).
func refuseClusterOnly(cmd *cobra.Command, cl *clusterFlags) error {
	if cl.embedded == "" && cmd.Flags().Changed("embedded-etcd-url") {
		return fmt.Errorf("--embedded-etcd-url needs --embedded-etcd DIR: it is the embedded etcd's client URL")
	}
	if cl.etcd != "" || cl.embedded != "" {
		return nil
	}
	for _, name := range clusterOnlyFlags {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s needs --etcd or --embedded-etcd: it is for a hub in a cluster (docs/cluster.md)", name)
		}
	}
	return nil
}

// refuseBelowMinusOne refuses a value below -1 for any of the named int
// flags, whose -1 says "no cap" (or "none") and whose configuration reads
// every negative value so: naming the flag, not taken silently.
func refuseBelowMinusOne(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		fl := cmd.Flags().Lookup(name)
		if n, err := strconv.Atoi(fl.Value.String()); fl.Changed && err == nil && n < -1 {
			return fmt.Errorf("--%s %d: give -1 (its only negative value) or a positive count (default %s)", name, n, fl.DefValue)
		}
	}
	return nil
}

// refuseNonPositive refuses a 0 given explicitly for any of the named
// flags, whose configuration reads 0 as its default (said so, not done
// silently), and a negative value, naming the flag.
func refuseNonPositive(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		fl := cmd.Flags().Lookup(name)
		if v := fl.Value.String(); fl.Changed && (v == "0s" || v == "0" || strings.HasPrefix(v, "-")) {
			return fmt.Errorf("--%s %s: give a positive value (default %s)", name, v, fl.DefValue)
		}
	}
	return nil
}
