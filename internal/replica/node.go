package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/netsec"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// NodeConfig configures one hub of a cluster (`rlhub serve --etcd`).
type NodeConfig struct {
	// Hub is the hub this node runs while primary; Listen is bound once
	// and kept for every role, DataDir is required (a standby's copy).
	Hub hub.Config
	// Cluster is the membership (Endpoints, Cluster, ID, LeaseTTL,
	// DialTimeout); Addr and Logger are filled by the node.
	Cluster cluster.Config
	// Acks, AckTimeout: SourceConfig's, for every term this node holds.
	Acks       int
	AckTimeout time.Duration
	// Sync is when this node, as a standby, acknowledges a unit
	// (FollowerConfig.Sync; "" means SyncWrite).
	Sync SyncMode
	// CrashAt: FollowerConfig.CrashAt (tests only).
	CrashAt string
	// ScrubEvery is how often a standby checks its copy while it follows
	// (Follower.Scrub; it checks it on start too); 0 means on start only.
	ScrubEvery time.Duration
	// FaultBackoff is how long a standby that cannot write its copy (its
	// disk full, read-only or failing) stays out of the cluster before it
	// joins again; 0 means 30 s. Out of it, no publish waits for it and
	// it is not elected.
	FaultBackoff time.Duration
	// Dial connects to another hub (the primary a standby follows);
	// required.
	Dial func(ctx context.Context, addr string) (*grpc.ClientConn, error)
	// Bulk is the data-plane client a standby follows its primary with
	// (FollowerConfig.Bulk: the dial config's TLS and token); nil follows
	// on gRPC only. Transport: FollowerConfig.Transport.
	Bulk      *bulk.Client
	Transport Transport
	// Extra services are served in every role (the cluster's Primary
	// service); a standby calls only their Register.
	Extra []hub.Service
	// Logger; nil means Hub.Logger, then slog.Default().
	Logger *slog.Logger
}

// Node is one hub's life in a cluster: a standby that follows the primary
// into its data directory and refuses writes, until it is elected; then a
// primary: the hub opened on that directory (issue 14's restart path),
// fenced and replicating; then, when its term ends, a standby again.
type Node struct {
	cfg      NodeConfig
	follower *Follower
	addr     string

	campaigning atomic.Bool // in Campaign: may be elected
	shipped     ShipStats   // what its terms' streams sent (the metrics)

	mu       sync.Mutex
	outside  bool            // not a member: joining, or out after a fault
	faults   uint64          // times it left for a local fault
	src      *Source         // while primary
	leader   *cluster.Leader // newest primary seen (nil: unknown)
	primary  bool
	deposed  bool
	terms    int
	promoted time.Time
}

// NewNode validates cfg.
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.Hub.DataDir == "" {
		return nil, fmt.Errorf("%w: a cluster hub needs --data (a standby keeps the primary's copy there)", errs.ErrInvalid)
	}
	if cfg.Dial == nil {
		return nil, fmt.Errorf("%w: replica: NodeConfig.Dial is required", errs.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = cfg.Hub.Logger
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hub.Logger == nil {
		cfg.Hub.Logger = cfg.Logger
	}
	cfg.Cluster.Logger = cfg.Logger
	if cfg.Hub.Listen == "" {
		cfg.Hub.Listen = hub.DefaultListen
	}
	if cfg.FaultBackoff < 0 {
		return nil, fmt.Errorf("%w: replica: negative fault backoff", errs.ErrInvalid)
	}
	if cfg.FaultBackoff == 0 {
		cfg.FaultBackoff = 30 * time.Second
	}
	return &Node{cfg: cfg, outside: true}, nil
}

// Primary is the newest primary this node knows of and whether it is this
// node: what rlhub.v1.Cluster/Primary answers. ok is false while unknown.
func (n *Node) Primary() (l cluster.Leader, self, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leader == nil {
		return cluster.Leader{}, false, false
	}
	return *n.leader, n.primary && !n.deposed, true
}

// Addr is the address the node serves on (after Run began listening).
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr
}

func (n *Node) setLeader(l *cluster.Leader) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l == nil {
		n.leader = nil
		return
	}
	if n.leader == nil || l.Epoch >= n.leader.Epoch {
		c := *l
		n.leader = &c
	}
}

// refusal is the standby's answer now.
func (n *Node) refusal() *cluster.Refusal {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leader != nil && n.leader.Addr == n.addr {
		return cluster.NewRefusal(nil) // that was us: an election runs
	}
	return cluster.NewRefusal(n.leader)
}

var errMemberLost = errors.New("replica: this hub's membership lease is gone")

// errLocalFault wraps the error of a standby that cannot write the
// primary's units into its data directory, or of a primary that cannot
// write its store (localFault): it leaves the cluster for FaultBackoff.
var errLocalFault = errors.New("replica: this hub cannot write its data")

// localFault reports whether a standby's stream ended on its own storage:
// no space or quota left, a read-only file system, an I/O error. Following
// again cannot mend it, and while it stays a member every acks-all publish
// waits for it until --replica-ack-timeout.
func localFault(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EIO)
}

// joinTimeout bounds one attempt to join the cluster (its lease's grant
// and its registration): while no etcd answers, the hub says so and dials
// again every joinTimeout, and stops when asked to (SIGTERM) at once.
// Long enough for etcd to elect a leader of its own.
const joinTimeout = 10 * time.Second

// Run serves until ctx ends: it binds the address, joins the cluster and
// cycles through the roles, rejoining whenever its lease is lost.
func (n *Node) Run(ctx context.Context) error {
	if f := n.cfg.Hub.AddrFile; f != "" {
		// An earlier run's address must not be read as this one's when
		// this one fails to listen; nor this one's once it stopped.
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("hub: address file: %w", err)
		}
		defer os.Remove(f)
	}
	lis, err := net.Listen("tcp", n.cfg.Hub.Listen)
	if err != nil {
		return fmt.Errorf("hub: listen: %w", err)
	}
	// What the cluster is told: the name --listen gave, with the bound
	// port (netsec.Advertised): clients on other machines dial it and
	// check the hub's certificate against it.
	addr, err := netsec.Advertised(n.cfg.Hub.Listen, n.cfg.Hub.Advertise, lis.Addr())
	if err != nil {
		lis.Close()
		return fmt.Errorf("%w: hub: %v", errs.ErrInvalid, err)
	}
	n.mu.Lock()
	n.addr = addr
	n.mu.Unlock()
	n.cfg.Hub.Listen = addr     // every role binds the same address (and advertises its name)
	if n.cfg.Cluster.ID == "" { // unique per listening hub: hostname and port
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(addr)
		n.cfg.Cluster.ID = host + "-" + port
	}
	if n.cfg.Hub.AddrFile != "" {
		if err := hub.WriteAddrFile(n.cfg.Hub.AddrFile, addr); err != nil {
			lis.Close()
			return err
		}
	}
	// The line `rlhub serve` has always logged once it listens (tests and
	// scripts read the address from it); the hub logs it again when
	// this node becomes the primary.
	n.cfg.Logger.Info("hub serving", "addr", addr, "role", "cluster member", "data", n.cfg.Hub.DataDir)
	n.follower, err = NewFollower(FollowerConfig{DataDir: n.cfg.Hub.DataDir, Dial: n.cfg.Dial, Bulk: n.cfg.Bulk, Transport: n.cfg.Transport, Sync: n.cfg.Sync, CrashAt: n.cfg.CrashAt, Logger: n.cfg.Logger})
	if err != nil {
		lis.Close()
		return err
	}
	sock := newHandoff(lis)
	defer sock.wait()
	defer sock.close()
	// Between memberships — before the first join, and while a hub whose
	// lease is gone rejoins (etcd unreachable: its machine cut off) — the
	// node serves as a standby: a client on its side of a partition is
	// refused at once, naming the newest primary the node knows (none,
	// "unknown", when that was itself), instead of holding a connection
	// no role serves until its deadline.
	var between *standbyServer
	var betweenMetrics *metrics.Server // --metrics-listen meanwhile: the probes say "not a member"
	stopBetween := func() {
		if betweenMetrics != nil {
			_ = betweenMetrics.Close()
			betweenMetrics = nil
		}
		if between == nil {
			return
		}
		if err := between.stop(); err != nil {
			n.cfg.Logger.Warn("cluster: standby server stop", "err", err)
		}
		between = nil
	}
	defer stopBetween() // before the socket closes (deferred above)
	joined := false
	startBetween := func() {
		if between != nil {
			return
		}
		extra := make([]Registrar, len(n.cfg.Extra))
		for i, s := range n.cfg.Extra {
			extra[i] = s
		}
		between = startStandby(sock.role(), n.cfg.Hub.TLS, n.cfg.Hub.Auth, n.cfg.Hub.Limits, n.cfg.Logger, n.refusal, n.position, extra)
		betweenMetrics = n.standbyMetrics()
	}
	for ctx.Err() == nil {
		startBetween()
		ccfg := n.cfg.Cluster
		ccfg.Addr = addr
		jctx, cancel := context.WithTimeout(ctx, joinTimeout)
		m, err := cluster.Join(jctx, ccfg)
		cancel()
		if err != nil {
			if !joined && misconfigured(err) {
				// Nothing a retry could mend: the operator has to.
				return fmt.Errorf("cluster: join: %w", err)
			}
			n.cfg.Logger.Warn("cluster: join failed; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		joined = true
		stopBetween() // the member's roles serve the socket from here
		n.setOutside(false)
		n.follower.cfg.Member = m.ID()
		err = n.member(ctx, m, sock)
		n.setOutside(true)
		cerr := m.Close()
		if errors.Is(err, errLocalFault) && ctx.Err() == nil {
			n.mu.Lock()
			n.faults++
			n.mu.Unlock()
			// Out of the membership (its lease revoked by Close), so no
			// publish waits for this standby; it tries again later.
			n.cfg.Logger.Error("cluster: left the cluster: this hub cannot write its data; joining again later", "err", err, "retry_in", n.cfg.FaultBackoff)
			startBetween() // meanwhile: refusals naming the primary, and the probes
			select {
			case <-ctx.Done():
			case <-time.After(n.cfg.FaultBackoff):
			}
			continue
		}
		if err != nil && !errors.Is(err, errMemberLost) && ctx.Err() == nil {
			n.cfg.Logger.Error("cluster: leaving after an error", "err", err)
			return errors.Join(err, cerr)
		}
		if ctx.Err() == nil {
			n.cfg.Logger.Warn("cluster: membership lost; rejoining")
		}
	}
	return nil
}

// member cycles standby → primary → standby while m's lease lives, each
// role serving sock.
func (n *Node) member(ctx context.Context, m *cluster.Member, sock *handoff) error {
	for {
		extra := make([]Registrar, len(n.cfg.Extra))
		for i, s := range n.cfg.Extra {
			extra[i] = s
		}
		csvc, err := clusterrpc.New(clusterrpc.Config{Self: n.Addr})
		if err != nil {
			return err
		}
		csvc.SetSource(clusterrpc.FromMember(m, n.cfg.Cluster.Cluster))
		csvc.SetReplication(func() clusterrpc.Replication { return n.replication(m.ID()) })
		sb := startStandby(sock.role(), n.cfg.Hub.TLS, n.cfg.Hub.Auth, n.cfg.Hub.Limits, n.cfg.Logger, n.refusal, n.position, append(extra, csvc))
		ms := n.standbyMetrics()
		term, err := n.standby(ctx, m)
		if ms != nil {
			_ = ms.Close() // the hub binds --metrics-listen when it takes over
		}
		sberr := sb.stop() // ends only its own use of the socket
		if sberr != nil {
			n.cfg.Logger.Warn("cluster: standby server stop", "err", sberr)
		}
		if err != nil {
			return err
		}
		if err := n.primaryTerm(ctx, m, term, sock); err != nil {
			return err
		}
	}
}

// standby follows the primary and campaigns (once a full sync from it
// completed, or at once when there is no primary) until elected.
func (n *Node) standby(ctx context.Context, m *cluster.Member) (*cluster.Term, error) {
	n.mu.Lock()
	n.primary, n.deposed = false, false
	n.mu.Unlock()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A stream that ended on this node's own storage ends the standby role
	// (fault, then the cancellation): it leaves the election too, since a
	// primary on a copy it cannot write would fail every write.
	var faultMu sync.Mutex
	var fault error
	leave := func(err error) {
		faultMu.Lock()
		fault = fmt.Errorf("%w: %w", errLocalFault, err)
		faultMu.Unlock()
		cancel()
	}
	ended := func() error {
		faultMu.Lock()
		defer faultMu.Unlock()
		if fault != nil {
			return fault
		}
		return ctx.Err()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { n.followLoop(sctx, m, leave) })
	if n.cfg.ScrubEvery > 0 {
		wg.Go(func() { n.scrubLoop(sctx) })
	}
	for {
		l, err := m.Leader(sctx)
		if errors.Is(err, cluster.ErrNoLeader) || err == nil && (l.ID == m.ID() || n.follower.Synced()) {
			break
		}
		select {
		case <-sctx.Done():
			return nil, ended()
		case <-m.Lost():
			return nil, errMemberLost
		case <-time.After(100 * time.Millisecond):
		}
	}
	yielded := 0
	for {
		// Only a member the in-sync record lists may serve (acks all): one
		// it does not list waits, following, until a primary lists it (or
		// an operator forgets the record).
		if err := n.awaitInSync(sctx, m); err != nil {
			if errors.Is(err, errMemberLost) {
				return nil, err
			}
			return nil, ended()
		}
		n.campaigning.Store(true)
		term, err := m.Campaign(sctx)
		n.campaigning.Store(false)
		if err == nil {
			// Elected: until this hub serves (or yields), its refusals say
			// an election runs — a client looks the primary up in etcd —
			// instead of naming the primary it followed, likely dead.
			n.setLeader(&cluster.Leader{ID: m.ID(), Addr: n.addr, Epoch: term.Epoch})
			// The record may have changed since awaitInSync read it (the
			// primary this hub queued behind wrote it until it died).
			if rec, err := m.InSync(sctx); err != nil || rec != nil && !rec.Has(m.ID()) {
				n.cfg.Logger.Warn("cluster: elected, but this copy is not in sync; resigning", "in_sync", inSyncString(rec), "err", err)
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				rerr := m.Resign(rctx)
				rcancel()
				if rerr != nil {
					n.cfg.Logger.Warn("cluster: cannot resign; the election waits for this lease to end", "err", rerr)
				}
				continue
			}
			// With --replica-acks below the standbys, the acknowledging
			// standby may not be the one elected: a standby whose copy is
			// ahead of this one gets the term (bounded: after maxYields the
			// term is served as it is).
			id, ahead := n.behind(sctx, m)
			if !ahead || yielded == maxYields {
				if ahead {
					n.cfg.Logger.Warn("cluster: elected with a copy older than a standby's; serving anyway (publishes it lacks are lost)", "standby", id)
				}
				return term, nil
			}
			yielded++
			n.cfg.Logger.Info("cluster: elected, but a standby holds a newer copy; resigning for it", "standby", id, "epoch", term.Epoch)
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			rerr := m.Resign(rctx)
			rcancel()
			if rerr != nil { // still elected: serve the term
				n.cfg.Logger.Warn("cluster: cannot resign for the standby ahead; serving", "err", rerr)
				return term, nil
			}
			continue
		}
		if errors.Is(err, cluster.ErrDeposed) {
			return nil, errMemberLost
		}
		if sctx.Err() != nil {
			return nil, ended()
		}
		n.cfg.Logger.Warn("cluster: campaign failed; retrying", "err", err)
		select {
		case <-sctx.Done():
			return nil, ended()
		case <-m.Lost():
			return nil, errMemberLost
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// scrubLoop checks the standby's copy every ScrubEvery (the first a whole
// interval after it became a standby: NewFollower checked it on start)
// until ctx ends, at scrubPace.
func (n *Node) scrubLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.ScrubEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		damaged, err := n.follower.Scrub(ctx, scrubPace) // logs each damaged file
		switch {
		case ctx.Err() != nil:
		case err != nil:
			n.cfg.Logger.Warn("replica: checking this hub's copy failed", "err", err)
		default:
			n.cfg.Logger.Info("replica: this hub's copy checked", "damaged", len(damaged), "took", time.Since(start).Round(time.Millisecond))
		}
	}
}

// scrubPace bounds the rate a running scrub reads the copy at (bytes/s):
// a 10 GiB copy takes 40 s, leaving the disk to the units it applies.
const scrubPace = 256 << 20

// awaitInSync returns once the in-sync record lists this member or there
// is none (ctx's error when it ends, errMemberLost when the lease is), and
// logs, at most every inSyncLogEvery, who it waits for.
func (n *Node) awaitInSync(ctx context.Context, m *cluster.Member) error {
	var logged time.Time
	for {
		rec, err := m.InSync(ctx)
		if err == nil && (rec == nil || rec.Has(m.ID())) {
			if !logged.IsZero() {
				n.cfg.Logger.Info("cluster: this copy may take over again", "in_sync", inSyncString(rec))
			}
			return nil
		}
		if time.Since(logged) >= inSyncLogEvery {
			logged = time.Now()
			if err != nil {
				n.cfg.Logger.Warn("cluster: cannot read the in-sync record; not campaigning", "err", err)
			} else {
				n.cfg.Logger.Warn("cluster: this copy may lack acknowledged publishes: only an in-sync member may take over; waiting for one (or `rlhub cluster forget-in-sync` once they are lost for good)",
					"in_sync", inSyncString(rec), "epoch", rec.Epoch)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.Lost():
			return errMemberLost
		case <-time.After(inSyncPoll):
		}
	}
}

// inSyncPoll is how often a member the in-sync record does not list reads
// it again; inSyncLogEvery, how often it says so.
const (
	inSyncPoll     = 500 * time.Millisecond
	inSyncLogEvery = 30 * time.Second
)

func inSyncString(r *cluster.InSync) string {
	if r == nil {
		return "(none recorded)"
	}
	return strings.Join(r.Members, ",")
}

// maxYields bounds how often one election round is resigned for a
// standby that is ahead.
const maxYields = 3

// position is this node's copy's position for a position query.
func (n *Node) position() position {
	p := n.follower.position()
	p.Campaigning = n.campaigning.Load()
	return p
}

// behind asks every other member for its position and reports one that
// is campaigning with a copy ahead of this node's. A member that does not
// answer within a second counts as not ahead.
func (n *Node) behind(ctx context.Context, m *cluster.Member) (string, bool) {
	st, err := m.Status(ctx)
	if err != nil {
		return "", false
	}
	mine := n.follower.position()
	for _, mi := range st.Members {
		if mi.ID == m.ID() {
			continue
		}
		p, err := n.queryPosition(ctx, mi.Addr)
		if err == nil && p.Campaigning && p.ahead(mine) {
			return mi.ID, true
		}
	}
	return "", false
}

func (n *Node) queryPosition(ctx context.Context, addr string) (position, error) {
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cc, err := n.cfg.Dial(qctx, addr)
	if err != nil {
		return position{}, err
	}
	defer cc.Close()
	return queryPosition(qctx, cc, n.follower.cfg.Member)
}

// queryPosition asks the standby at cc for its position on the
// replication stream (a hello with Query set).
func queryPosition(ctx context.Context, cc *grpc.ClientConn, member string) (position, error) {
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod)
	if err != nil {
		return position{}, err
	}
	// io.EOF: the standby ended the stream already (a refusal: no token,
	// the wrong role); RecvMsg returns its status.
	if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: member, Query: true})); err != nil && !errors.Is(err, io.EOF) {
		return position{}, err
	}
	var msg wrapperspb.BytesValue
	if err := cs.RecvMsg(&msg); err != nil {
		return position{}, err
	}
	var p position
	b := msg.GetValue()
	if len(b) == 0 || b[0] != kindPos {
		return position{}, errFrame
	}
	if err := parseJSON(b[1:], &p); err != nil {
		return position{}, err
	}
	return p, nil
}

// followLoop follows whichever hub leads, until ctx ends or a stream ends
// on this node's own storage (localFault), which it hands to leave.
func (n *Node) followLoop(ctx context.Context, m *cluster.Member, leave func(error)) {
	for ctx.Err() == nil {
		// Bounded: an etcd read that hangs must not keep this standby
		// from following (it would hold every publish's acknowledgement).
		lctx, lcancel := context.WithTimeout(ctx, leaderReadTimeout)
		l, err := m.Leader(lctx)
		lcancel()
		switch {
		case errors.Is(err, cluster.ErrNoLeader):
			n.setLeader(nil)
		case err != nil:
			if ctx.Err() == nil {
				n.cfg.Logger.Warn("replica: cannot read the primary from etcd; retrying", "err", err)
			}
		case l.ID != m.ID():
			n.setLeader(&l)
			err = n.followWhileLeading(ctx, m, l)
			if ctx.Err() == nil && localFault(err) {
				leave(err)
				return
			}
			if ctx.Err() == nil {
				n.cfg.Logger.Info("replica: stream from the primary ended", "primary", l.String(), "err", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// leaderReadTimeout bounds a standby's read of who the primary is.
const leaderReadTimeout = 3 * time.Second

// followWhileLeading follows l until its stream ends or etcd names
// another primary (a stream from a primary that is stopped, not dead,
// would otherwise hang until TCP gives up).
func (n *Node) followWhileLeading(ctx context.Context, m *cluster.Member, l cluster.Leader) error {
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the Wait: the watcher ends on it
	wg.Go(func() {
		for {
			select {
			case <-fctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			lctx, lcancel := context.WithTimeout(fctx, leaderReadTimeout)
			cur, err := m.Leader(lctx)
			lcancel()
			if errors.Is(err, cluster.ErrNoLeader) || err == nil && (cur.ID != l.ID || cur.Epoch != l.Epoch) {
				cancel()
				return
			}
		}
	})
	return n.follower.Follow(fctx, l)
}

// stepDownGrace bounds the graceful part of a stepping-down primary's
// hub stop (Hub.CloseWithin): calls in progress get this long to finish.
const stepDownGrace = time.Second

// primaryTerm serves as primary for term: the hub opened on the data
// directory the follower kept, with the store fenced and replicating,
// until the term is lost (or found deposed) or ctx ends. The hub is closed
// and the election resigned before it returns.
func (n *Node) primaryTerm(ctx context.Context, m *cluster.Member, term *cluster.Term, sock *handoff) error {
	if err := n.follower.ObserveEpoch(term.Epoch); err != nil {
		n.cfg.Logger.Error("cluster: cannot record the term", "err", err)
	}
	// Recorded before anything is written in the term: this copy descends
	// from it from now on, whatever the position says (Source.cut).
	lineage, lerr := n.follower.Lead(term.Epoch)
	if lerr != nil {
		n.cfg.Logger.Error("cluster: cannot record the term as led; full syncs to standbys new to it send every file", "err", lerr)
		lineage = math.MaxUint64 // no follower's
	}
	// Who may take over (acks all): this primary and the members the
	// record lists already — nothing is acknowledged in this term yet, so
	// each holds everything acknowledged — until a publish one of them
	// lacks (Source's InSync drops it then, and adds standbys as they
	// catch up). With fewer acks no record is kept.
	var inSync, inSyncStandbys []string
	var err error
	ictx, icancel := context.WithTimeout(ctx, n.cfg.Cluster.DialTimeout+5*time.Second)
	if n.cfg.Acks == AcksAll {
		var old *cluster.InSync
		if old, err = m.InSync(ictx); err == nil && old != nil {
			for _, id := range old.Members {
				if id != m.ID() && !slices.Contains(inSyncStandbys, id) {
					inSyncStandbys = append(inSyncStandbys, id)
				}
			}
		}
		slices.Sort(inSyncStandbys)
		inSync = append([]string{m.ID()}, inSyncStandbys...)
	}
	if err == nil {
		err = term.RecordInSync(ictx, inSync)
	}
	icancel()
	if err != nil {
		n.cfg.Logger.Warn("cluster: elected, but the in-sync record cannot be written; resigning", "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = m.Resign(rctx)
		return nil
	}
	deposed := make(chan struct{})
	faulted := make(chan error, 1)                               // a write failed on this hub's storage
	over, overCancel := context.WithCancel(context.Background()) // Fenced.Over
	defer overCancel()
	var once sync.Once
	var src *Source
	depose := func() {
		once.Do(func() {
			n.mu.Lock()
			n.deposed = true
			n.mu.Unlock()
			if src != nil {
				src.Stop() // publishes waiting for acks fail now
			}
			overCancel() // and those renewing the proof themselves
			close(deposed)
		})
	}
	n.mu.Lock()
	n.primary, n.deposed, n.leader = true, false, &cluster.Leader{ID: m.ID(), Addr: n.addr, Epoch: term.Epoch}
	n.terms++
	n.promoted = time.Now()
	n.mu.Unlock()
	gate := func() *cluster.Refusal {
		n.mu.Lock()
		d := n.deposed
		n.mu.Unlock()
		if d {
			return n.refusal()
		}
		return nil
	}
	src, err = NewSource(SourceConfig{DataDir: n.cfg.Hub.DataDir, Epoch: term.Epoch, Lineage: lineage, Acks: n.cfg.Acks, AckTimeout: n.cfg.AckTimeout, Shipped: &n.shipped,
		InSync: func(ctx context.Context, standbys []string) error {
			return term.RecordInSync(ctx, append([]string{m.ID()}, standbys...))
		},
		InSyncStandbys: inSyncStandbys,
		Logger:         n.cfg.Logger, Standbys: func(ctx context.Context) ([]string, error) {
			st, err := m.Status(ctx)
			if err != nil {
				return nil, err
			}
			if st.Primary == nil || st.Primary.ID != m.ID() || st.Primary.Epoch != term.Epoch {
				return nil, cluster.ErrDeposed
			}
			var out []string
			for _, mi := range st.Members {
				if mi.ID != m.ID() {
					out = append(out, mi.ID)
				}
			}
			return out, nil
		}})
	if err != nil {
		return err
	}
	// The term proof and the standbys, read before the hub serves and
	// renewed off the publish path (Term.Hold, refreshStandbys).
	pctx, pcancel := context.WithTimeout(ctx, n.cfg.Cluster.DialTimeout+5*time.Second)
	err = errors.Join(term.Renew(pctx), src.RefreshStandbys(pctx))
	pcancel()
	if err != nil {
		n.cfg.Logger.Warn("cluster: elected, but the term proof or the standbys could not be read yet; publishes wait for them", "err", err)
	}
	hcfg := n.cfg.Hub
	hcfg.Listener = sock.role()
	hcfg.AddrFile = "" // Run wrote the advertised address; the role's listener would say [::]:PORT
	// A primary that cannot write its store steps down when a standby
	// can take its place (one follows this term); alone, it serves on,
	// refusing the writes (the reducer's fail-stop, docs/reducer.md).
	fault := func(err error) bool {
		if !src.Followed() {
			return false
		}
		select {
		case faulted <- err:
		default:
		}
		return true
	}
	hcfg.WrapStore = func(s store.Store) store.Store {
		return &Fenced{Store: s, Epoch: term.Epoch, Source: src, Proof: term.Valid, Renew: term.Renew, Refusal: gate, Deposed: depose,
			ProofEnded: term.ProofEnded, Over: over, Fault: fault}
	}
	hcfg.Gate = gate
	hcfg.Replication = src
	hcfg.StateChanged, hcfg.StateAppended = src.Changed, src.Appended
	hcfg.MetricsCluster = n.stats
	n.mu.Lock()
	n.src = src
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.src = nil
		n.mu.Unlock()
	}()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	h, err := hub.New(hcfg, n.cfg.Extra...)
	if err != nil {
		n.cfg.Logger.Error("cluster: elected, but the hub cannot open its data; resigning", "err", err)
		_ = m.Resign(rctx)
		return nil
	}
	h.Cluster().SetSource(clusterrpc.FromMember(m, n.cfg.Cluster.Cluster))
	h.Cluster().SetReplication(func() clusterrpc.Replication { return n.replication(m.ID()) })
	if startErr := h.Start(); startErr != nil {
		h.Close()
		_ = m.Resign(rctx)
		return startErr
	}
	n.cfg.Logger.Info("cluster: serving as primary", "epoch", term.Epoch, "addr", n.addr)
	// Hold the term proof (it also notices a term that ended while
	// nothing publishes) and keep the standbys a publish waits for.
	var wg sync.WaitGroup
	wctx, wcancel := context.WithCancel(ctx)
	wg.Go(func() {
		if errors.Is(term.Hold(wctx), cluster.ErrDeposed) {
			depose()
		}
	})
	wg.Go(func() {
		every := max(n.cfg.Cluster.LeaseTTL/4, 100*time.Millisecond)
		if n.cfg.Cluster.LeaseTTL == 0 {
			every = 500 * time.Millisecond
		}
		lastInSyncErr := ""
		for {
			select {
			case <-wctx.Done():
				return
			case <-time.After(every):
			}
			rctx, rcancel := context.WithTimeout(wctx, max(every, time.Second))
			err := src.RefreshStandbys(rctx)
			if err == nil {
				// Standbys that caught up may take over from now on,
				// publish or not.
				if err = src.UpdateInSync(rctx); err != nil && err.Error() != lastInSyncErr {
					n.cfg.Logger.Warn("replica: cannot record the standbys that caught up as in sync; they cannot take over yet", "err", err)
				}
				lastInSyncErr = ""
				if err != nil {
					lastInSyncErr = err.Error()
				}
			}
			rcancel()
			if errors.Is(err, cluster.ErrDeposed) {
				depose()
				return
			}
		}
	})
	var out error
	select {
	case <-ctx.Done():
	case <-term.Lost():
		out = errMemberLost
	case <-deposed:
	case err := <-faulted:
		n.cfg.Logger.Error("cluster: this primary cannot write its store; stepping down for a standby", "err", err, "epoch", term.Epoch)
		out = fmt.Errorf("%w: %w", errLocalFault, err)
	}
	depose() // from here on every call is refused
	wcancel()
	wg.Wait()
	if ctx.Err() == nil {
		n.cfg.Logger.Error("cluster: this hub is no longer the primary; stepping down", "epoch", term.Epoch)
		if l, err := m.Leader(rctx); err == nil && l.Epoch > term.Epoch {
			n.setLeader(&l)
		}
	}
	var herr error
	if ctx.Err() == nil {
		// Stepping down: every call is refused already and publishes
		// waiting for acks have failed (depose); what is left to drain may
		// be peers that cannot answer (this machine cut off, a standby
		// stopped), which gRPC's graceful stop would wait for up to
		// --stop-timeout. Meanwhile the socket is not handed on, and a
		// client here waits for an answer instead of hearing "standby"
		// (TestStepDownDoesNotWaitForAStoppedStandby).
		herr = h.CloseWithin(stepDownGrace)
	} else {
		herr = h.Close()
	}
	_ = m.Resign(rctx)
	if herr != nil {
		n.cfg.Logger.Warn("cluster: hub close", "err", herr)
	}
	select {
	case <-m.Lost():
		out = errMemberLost
	default:
	}
	return out
}

// Terms counts the terms this node has served as primary.
func (n *Node) Terms() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.terms
}

// stats is the node's role and replication for the metrics endpoint.
func (n *Node) stats() metrics.ClusterStats {
	n.mu.Lock()
	src, primary := n.src, n.primary && !n.deposed
	st := metrics.ClusterStats{Outside: n.outside, Faults: n.faults}
	if n.leader != nil {
		st.Epoch = n.leader.Epoch
	}
	n.mu.Unlock()
	st.Primary = primary && !st.Outside
	st.ShippedWhole, st.ShippedAppended, st.ShippedCut = n.shipped.Whole.Load(), n.shipped.Appended.Load(), n.shipped.Cut.Load()
	st.Cuts = n.shipped.Cuts.Load()
	if f := n.follower; f != nil {
		st.Applied = f.Units()
		st.Scrubs, st.DamagedFiles = f.Scrubs()
		if !primary {
			st.Unit, st.Synced = f.LastUnit(), f.Synced() && !st.Outside
		}
	}
	if primary && src != nil {
		acked, unit := src.Followers()
		st.Unit, st.Lag = unit, map[string]uint64{}
		for m, a := range acked {
			st.Lag[m] = unit - min(a, unit)
		}
		st.InSync, st.KeepsInSync = src.InSyncMembers()
	}
	return st
}

// setOutside records whether this node is outside the cluster (not a
// member: joining, or out after a fault).
func (n *Node) setOutside(out bool) {
	n.mu.Lock()
	n.outside = out
	n.mu.Unlock()
}

// replication is the node's stats for Cluster/Replication (`rlhub
// cluster status`), as member id.
func (n *Node) replication(id string) clusterrpc.Replication {
	st := n.stats()
	return clusterrpc.Replication{MemberID: id, Primary: st.Primary, Epoch: st.Epoch, Unit: st.Unit, Synced: st.Synced, Lag: st.Lag}
}

// standbyMetrics serves --metrics-listen while this node is a standby
// (the cluster families only); nil without the flag, or when the address
// cannot be bound (logged: the standby serves on without metrics).
func (n *Node) standbyMetrics() *metrics.Server {
	h := n.cfg.Hub
	if h.MetricsListen == "" {
		return nil
	}
	role := h.MetricsRole
	if role == "" {
		role = "hub"
	}
	mcfg := metrics.Config{Listen: h.MetricsListen, Sources: metrics.Sources{Cluster: n.stats}, Role: role + " (standby)",
		Logger: n.cfg.Logger, TLS: h.TLS, Insecure: h.MetricsInsecure}
	if h.Auth != nil {
		mcfg.Auth = h.Auth
	}
	var ms *metrics.Server
	var err error
	for range 20 { // the hub that stepped down may still be letting go of it
		if ms, err = metrics.New(mcfg); err == nil {
			ms.Start()
			return ms
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.cfg.Logger.Warn("cluster: the standby serves no metrics", "err", err)
	return nil
}

// misconfigured reports whether a join failed on the hub's own settings —
// plaintext to an etcd off loopback, a wrong etcd password, a role without
// the cluster's prefix — rather than on etcd's state (down, electing, or
// still holding this id's last lease). The first join fails on these, so
// `rlhub serve` exits naming them instead of retrying for ever; a hub that
// has joined once keeps retrying, since its credentials may be mended
// under it.
func misconfigured(err error) bool {
	return errors.Is(err, errs.ErrInvalid) || errors.Is(err, errs.ErrUnauthenticated) || errors.Is(err, errs.ErrPermission)
}
