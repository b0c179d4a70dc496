// Package cluster is rlhub's membership and primary election, on etcd.
//
// Every hub of a cluster named C joins it by registering
// /rlhub/C/members/ID under a lease (an etcd session whose keep-alives the
// member sends); a hub that dies or stalls past the lease's TTL drops out
// by itself. Hubs campaign in one election (go.etcd.io/etcd/client/v3/
// concurrency); the winner is the primary and the others are standbys.
//
// The epoch of a term is the creation revision of the winner's election
// key. etcd revisions only grow, so every later term has a larger epoch:
// that is the fencing token a primary's writes carry (the store refuses a
// write whose epoch is older than one it has seen). A primary that loses
// its lease — killed, partitioned, or SIGSTOPped past the TTL — sees its
// term's Lost channel close once it runs again, and must stop writing; any
// write it attempts before it notices carries an epoch older than the new
// primary's and is refused by whoever has seen the newer one.
//
// Use:
//  1. Join(ctx, Config) registers the member (and holds its lease).
//  2. Campaign(ctx) blocks until this member is primary and returns its
//     Term; Term.Lost closes when the lease is gone. Standbys stay in
//     Campaign.
//  3. Leader and Status read the current primary and the members; any
//     process with the etcd endpoints can call Read for the same without
//     joining.
//  4. Close resigns (if primary), revokes the lease and closes the client.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc/connectivity"

	"github.com/rlhub/rlhub/internal/errs"
)

// ErrDeposed: this member's term ended (its lease is gone or another
// member holds the election). Matches errs.ErrUnavailable.
var ErrDeposed = fmt.Errorf("%w: no longer the primary", errs.ErrUnavailable)

// ErrNoLeader: the cluster has no primary at the moment.
var ErrNoLeader = fmt.Errorf("%w: the cluster has no primary", errs.ErrUnavailable)

// Config configures a member.
type Config struct {
	// Endpoints are etcd client URLs (http://127.0.0.1:2379, …); required.
	Endpoints []string
	// Cluster names the cluster; its keys live under /rlhub/Cluster/.
	// Required: letters, digits, '.', '_' and '-', at most 64 bytes.
	Cluster string
	// ID names this member; "" means hostname-pid. Same rule as Cluster.
	ID string
	// Addr is the address clients and other hubs reach this member at;
	// required for Join (it is what Leader reports).
	Addr string
	// LeaseTTL is how long the member's lease outlives its last
	// keep-alive; 0 means 2s. etcd counts whole seconds: it is rounded
	// up, at least 1s. A primary that stalls longer is replaced.
	LeaseTTL time.Duration
	// DialTimeout bounds connecting to etcd; 0 means 5s.
	DialTimeout time.Duration
	// Logger receives membership changes; nil means slog.Default().
	Logger *slog.Logger
	// Security is etcd's TLS and user (security.go); the zero value is
	// plaintext, refused off loopback unless Security.Insecure.
	Security EtcdSecurity
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidID reports whether id may be a member's id (or a cluster's name):
// 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'.
func ValidID(id string) bool { return namePattern.MatchString(id) }

func (c *Config) validate(join bool) error {
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("%w: cluster: no etcd endpoints", errs.ErrInvalid)
	}
	if !namePattern.MatchString(c.Cluster) {
		return fmt.Errorf("%w: cluster: name must match %s", errs.ErrInvalid, namePattern)
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if !namePattern.MatchString(c.ID) {
		return fmt.Errorf("%w: cluster: member id must match %s", errs.ErrInvalid, namePattern)
	}
	if join && c.Addr == "" {
		return fmt.Errorf("%w: cluster: a member needs the address it serves on", errs.ErrInvalid)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 2 * time.Second
	}
	if c.LeaseTTL < 0 {
		return fmt.Errorf("%w: cluster: negative lease TTL", errs.ErrInvalid)
	}
	if c.LeaseTTL%time.Second != 0 {
		// etcd grants whole seconds: rounding would give a lease other
		// than the one asked for.
		return fmt.Errorf("%w: cluster: lease TTL %v is not a whole number of seconds (etcd's leases are whole seconds)", errs.ErrInvalid, c.LeaseTTL)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func (c *Config) prefix() string { return path.Join("/rlhub", c.Cluster) }

// electionPrefix is the prefix of the election's keys (one per member
// campaigning: the prefix and its lease in hex, concurrency.Election's).
func (c *Config) electionPrefix() string { return path.Join(c.prefix(), "election") + "/" }

// electionLeader is the election's leading key — the one of the lowest
// creation revision, as concurrency.Election.Leader reads it — or nil
// while no member campaigns.
func electionLeader(ctx context.Context, kv clientv3.KV, cfg *Config) (*mvccpb.KeyValue, error) {
	resp, err := kv.Get(ctx, cfg.electionPrefix(), clientv3.WithFirstCreate()...)
	if err != nil {
		return nil, etcdError(nil, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0], nil
}

func (c *Config) ttlSeconds() int {
	return max(1, int((c.LeaseTTL+time.Second-1)/time.Second))
}

// MemberInfo is what a member registers and what Status lists.
type MemberInfo struct {
	ID      string    `json:"id"`
	Addr    string    `json:"addr"`
	Started time.Time `json:"started"`
}

// Leader is the current primary: who, where, and the epoch of its term.
type Leader struct {
	ID    string
	Addr  string
	Epoch uint64
}

// Status is a snapshot of the cluster.
type Status struct {
	Members []MemberInfo // by ID
	Primary *Leader      // nil when there is none
	InSync  *InSync      // nil when none is recorded
}

func dial(cfg *Config) (*clientv3.Client, etcdClient, error) {
	ec, err := cfg.Security.resolve(cfg.Endpoints)
	if err != nil {
		return nil, ec, err
	}
	if err := ec.checkTLS(cfg.DialTimeout); err != nil {
		return nil, ec, err
	}
	cli, err := newClient(cfg, ec, ec.endpoints, nil)
	return cli, ec, err
}

// newClient is a client of endpoints (some of ec's); ctx, if not nil,
// ends its dial and its life.
func newClient(cfg *Config, ec etcdClient, endpoints []string, ctx context.Context) (*clientv3.Client, error) {
	dialTimeout := cfg.DialTimeout
	if ec.user != "" {
		// It bounds the token fetch: etcd checks the password with bcrypt,
		// slow on a loaded server.
		dialTimeout = max(dialTimeout, 10*time.Second)
	}
	keepalive, kaTimeout := cfg.LeaseTTL, cfg.LeaseTTL
	if keepalive <= 0 { // a reader: etcd accepts pings every 5 s (--grpc-keepalive-min-time)
		keepalive, kaTimeout = readerKeepalive, readerKeepaliveTimeout
	}
	cli, err := clientv3.New(clientv3.Config{
		Context:     ctx,
		Endpoints:   endpoints,
		DialTimeout: dialTimeout,
		Logger:      zap.NewNop(),
		TLS:         ec.tls,
		Username:    ec.user,
		Password:    ec.password,
		// Keep-alives on the connection itself, so a dead etcd is noticed
		// even by a member that is only waiting, and by a reader whose
		// watch is all it does: an etcd member whose machine died answers
		// nothing, and the client moves to another endpoint only once the
		// keep-alive fails.
		DialKeepAliveTime:    keepalive,
		DialKeepAliveTimeout: kaTimeout,
	})
	if err != nil {
		return nil, etcdError(endpoints, err)
	}
	return cli, nil
}

// readerKeepalive and readerKeepaliveTimeout are a Reader's keep-alive
// on its etcd connection (a Member's are its lease TTL).
const (
	readerKeepalive        = 5 * time.Second
	readerKeepaliveTimeout = 2 * time.Second
)

// Member is one hub's place in the cluster. Its methods are safe for
// concurrent use.
type Member struct {
	cfg      Config
	cli      *clientv3.Client
	k        *keeper // the lease's renewals and the term's reads (keeper.go)
	sess     *concurrency.Session
	elec     *concurrency.Election // the election as won (Resign's; set by Campaign with term); guarded by mu
	info     MemberInfo
	mu       sync.Mutex
	term     *Term // while primary
	closed   bool
	closeErr error
}

// Join connects to etcd and registers the member under a fresh lease.
// Its calls to etcd end with ctx (give it a deadline: while no etcd
// answers they wait for one); the member outlives ctx.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	cli, ec, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	k, sess, err := lease(ctx, &cfg, cli, ec)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("cluster: lease: %w", err)
	}
	m := &Member{cfg: cfg, cli: cli, k: k, sess: sess,
		info: MemberInfo{ID: cfg.ID, Addr: cfg.Addr, Started: time.Now().UTC()}}
	val, _ := json.Marshal(m.info)
	// A member id is taken while its lease lives: two hubs with one id
	// would each believe the other's registration is theirs.
	key := path.Join(cfg.prefix(), "members", cfg.ID)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(sess.Lease()))).
		Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("%w: member id %q is registered by a live member", errs.ErrExists, cfg.ID)
	}
	if err != nil {
		m.Close()
		if errors.Is(err, errs.ErrExists) {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		return nil, fmt.Errorf("cluster: register: %w", etcdError(ec.endpoints, err))
	}
	cfg.Logger.Info("cluster: joined", "cluster", cfg.Cluster, "id", cfg.ID, "addr", cfg.Addr, "lease_ttl_s", cfg.ttlSeconds())
	return m, nil
}

// lease opens a session on a fresh lease of cfg's TTL whose keep-alive
// and revocation go through a keeper (keeper.go), which passes over an
// etcd member that does not answer. cli (from dial, with ec) is the
// caller's to close, after the keeper.
func lease(ctx context.Context, cfg *Config, cli *clientv3.Client, ec etcdClient) (*keeper, *concurrency.Session, error) {
	k := newKeeper(cfg, cli, ec)
	cli.Lease = &keptLease{Lease: cli.Lease, k: k}
	// The grant is ours, within ctx: NewSession would grant with the
	// session's context, which must not end with ctx (it runs the
	// keep-alive) and so has no end at all, and etcd's client waits for
	// a ready connection — a join while no etcd answers waited for etcd
	// for ever, deaf to the hub's shutdown (TestJoinWithoutEtcdEnds).
	grant, err := cli.Grant(ctx, int64(cfg.ttlSeconds()))
	if err != nil {
		k.close()
		return nil, nil, etcdError(ec.endpoints, err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(cfg.ttlSeconds()), concurrency.WithLease(grant.ID),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		// No keep-alive started: the lease expires within its TTL.
		k.close()
		return nil, nil, etcdError(ec.endpoints, err)
	}
	return k, sess, nil
}

// ID is the member's id.
func (m *Member) ID() string { return m.cfg.ID }

// Lost closes when the member's lease is gone: it is no longer a member
// and must rejoin (Join) to take part again.
func (m *Member) Lost() <-chan struct{} { return m.sess.Done() }

// Term is one member's time as primary.
type Term struct {
	// Epoch is the term's fencing token: larger than every earlier term's.
	Epoch uint64
	m     *Member
	key   string

	mu         sync.Mutex
	validUntil time.Time // the proof's end (monotonic reading); zero: none
	proofErr   error     // why there is no proof (nil: never renewed yet)
	// ended is closed when a renewal fails and replaced by an open one at
	// the next that succeeds (ProofEnded); nil until the first failure.
	ended chan struct{}
	// resigns counts Resign's starts and ends: odd while Resign deletes
	// the key. A renewal that overlapped a Resign may have checked the key
	// before it was deleted, and so proves nothing: it is not applied.
	resigns uint64
}

// The term proof. A primary may write without asking etcd while it holds
// a proof: a keep-alive of its lease, sent at monotonic time s and
// answered with TTL t, followed by a Check that found its election key
// leading, proves the term until s + t − margin. etcd can only expire the
// lease — and so delete the key and let a standby win the election — t
// after it processed that keep-alive, which was after s; a primary that
// is stopped (SIGSTOP) and resumed finds its proof expired, because
// CLOCK_MONOTONIC (Go's monotonic reading) runs on through the stop. The
// assumption is a bounded clock drift rate between this host and etcd's
// leader (margin / t: a fifth of the lease), not synchronised clocks.
// Any failure to renew ends the proof at once, as does the etcd
// connection leaving READY: a write then fails with Unavailable naming
// etcd instead of running out the proof.

// proofMargin is the part of the lease a proof does not use.
func proofMargin(ttl time.Duration) time.Duration { return ttl / 5 }

// Renew renews the term proof: one keep-alive of the lease, then Check.
// ErrDeposed when the term is gone; Unavailable when etcd cannot answer
// (the proof ends either way).
func (t *Term) Renew(ctx context.Context) error {
	sent := time.Now()
	t.mu.Lock()
	resigns := t.resigns
	t.mu.Unlock()
	err := t.renew(ctx, sent, resigns)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.resigns != resigns || resigns%2 == 1 {
			return err // Resign ended the proof meanwhile, and said why
		}
		t.validUntil, t.proofErr = time.Time{}, err
		if errors.Is(ctx.Err(), context.Canceled) {
			return err // the caller gave up (a client gone, Hold ending), not etcd
		}
		if t.closeEnded() {
			t.m.cfg.Logger.Warn("cluster: the term proof ended: etcd did not renew this hub's lease; writes are refused until it does", "epoch", t.Epoch, "err", err)
		}
		return err
	}
	return nil
}

// closeEnded closes ended (ProofEnded's channel), reporting whether it
// was open; t.mu held.
func (t *Term) closeEnded() bool {
	if t.ended == nil {
		t.ended = make(chan struct{})
	}
	select {
	case <-t.ended:
		return false
	default:
		close(t.ended)
		return true
	}
}

// resigning ends the proof as Resign begins to give up the election,
// before the key is deleted: Valid says ErrDeposed and ProofEnded closes.
// No renewal overlapping the deletion is applied (resigned marks its
// end); one begun after it proves the term again if the key still leads
// (a resignation that failed: the member still holds the election).
func (t *Term) resigning() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resigns++
	t.validUntil, t.proofErr = time.Time{}, ErrDeposed
	t.closeEnded()
}

// resigned marks the end of Resign's deletion of the key (see resigning).
func (t *Term) resigned() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resigns++
}

// ProofEnded returns a channel that is closed once a renewal of the term
// proof has failed or Resign began — the proof ended then, and stays ended
// until a renewal succeeds (Valid says why) — and open while the last
// renewal succeeded. A renewal that succeeds later makes later calls
// return a new, open channel. A writer waiting for something other than
// etcd (a primary's publish waiting for its standbys' acknowledgements)
// selects on it: with every etcd member silent (this machine cut off) a
// renewal fails within a quarter lease or so, long before the lease is
// given up (Lost).
func (t *Term) ProofEnded() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended == nil {
		t.ended = make(chan struct{})
	}
	return t.ended
}

// renew is Renew's work; resigns is t.resigns when it began.
func (t *Term) renew(ctx context.Context, sent time.Time, resigns uint64) error {
	select {
	case <-t.m.sess.Done():
		return ErrDeposed
	default:
	}
	// The keep-alive and the check through one etcd member; one that does
	// not answer within the keeper's attempt is passed over for the next.
	var ttl time.Duration
	err := t.m.k.do(ctx, func(ctx context.Context, c conn) error {
		resp, err := c.lease.KeepAliveOnce(ctx, t.m.sess.Lease())
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return ErrDeposed
		}
		if err != nil {
			return fmt.Errorf("%w: cluster: etcd: lease keep-alive: %v", errs.ErrUnavailable, err)
		}
		if resp.TTL <= 0 {
			return ErrDeposed
		}
		ttl = time.Duration(resp.TTL) * time.Second
		return t.check(ctx, c.kv)
	})
	if err != nil {
		return err
	}
	t.m.k.renewed(sent)
	until := sent.Add(ttl - proofMargin(ttl))
	t.mu.Lock()
	if t.resigns != resigns || resigns%2 == 1 {
		// It overlapped a Resign: it may have checked the key before the
		// deletion, which proves nothing now.
		t.mu.Unlock()
		return ErrDeposed
	}
	if until.After(t.validUntil) {
		t.validUntil = until
	}
	t.proofErr = nil
	again := false
	select {
	case <-t.ended: // nil blocks: never failed
		t.ended, again = make(chan struct{}), true
	default:
	}
	t.mu.Unlock()
	if again {
		t.m.cfg.Logger.Info("cluster: the term proof is renewed again", "epoch", t.Epoch)
	}
	return nil
}

// Valid reports, without asking etcd, whether the term proof holds now:
// nil if so; ErrDeposed once the lease is known gone; Unavailable naming
// etcd when the etcd connection is not READY; ErrProofExpired when the
// proof ran out (a slow or failed renewal).
func (t *Term) Valid() error {
	select {
	case <-t.m.sess.Done():
		return ErrDeposed
	default:
	}
	t.mu.Lock()
	until, perr := t.validUntil, t.proofErr
	t.mu.Unlock()
	if errors.Is(perr, ErrDeposed) {
		return ErrDeposed
	}
	if st := t.m.cli.ActiveConnection().GetState(); st != connectivity.Ready {
		return fmt.Errorf("%w: cluster: etcd connection %s", errs.ErrUnavailable, st)
	}
	if until.IsZero() || !time.Now().Before(until) {
		if perr != nil {
			return fmt.Errorf("%w (the last renewal: %v)", ErrProofExpired, perr)
		}
		return ErrProofExpired
	}
	return nil
}

// ErrProofExpired (from Term.Valid): the term proof ran out with the etcd
// connection READY — a renewal was slow or failed. Renew (one etcd round
// trip) may restore it; a writer that cannot wait fails with it.
var ErrProofExpired = fmt.Errorf("%w: cluster: etcd has not renewed this hub's lease within the term proof's lifetime", errs.ErrUnavailable)

// Hold renews the term proof every quarter lease (at least every 100ms)
// until ctx ends or the term is found deposed (ErrDeposed is returned).
// A failed renewal is retried at the same pace; the proof has ended
// meanwhile. The first renewal is made before Hold's first wait.
func (t *Term) Hold(ctx context.Context) error {
	every := max(t.m.cfg.LeaseTTL/4, 100*time.Millisecond)
	for {
		// Room for an etcd member that does not answer and the next one.
		rctx, cancel := context.WithTimeout(ctx, max(every, time.Second, 2*t.m.k.attempt+250*time.Millisecond))
		err := t.Renew(rctx)
		cancel()
		if errors.Is(err, ErrDeposed) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.m.sess.Done():
			return ErrDeposed
		case <-time.After(every):
		}
	}
}

// Lost closes when the term may have ended (the lease is gone).
func (t *Term) Lost() <-chan struct{} { return t.m.sess.Done() }

// Check asks etcd whether this term still holds the election: nil if so,
// ErrDeposed if another key leads or this one is gone, ErrUnavailable if
// etcd cannot answer (treat that as "do not write").
func (t *Term) Check(ctx context.Context) error {
	select {
	case <-t.m.sess.Done():
		return ErrDeposed
	default:
	}
	return t.m.k.do(ctx, func(ctx context.Context, c conn) error { return t.check(ctx, c.kv) })
}

// check is Check through kv.
func (t *Term) check(ctx context.Context, kv clientv3.KV) error {
	resp, err := kv.Get(ctx, t.key)
	if err != nil {
		return fmt.Errorf("%w: cluster: etcd: %v", errs.ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != t.Epoch {
		return ErrDeposed
	}
	l, err := electionLeader(ctx, kv, &t.m.cfg)
	if err != nil {
		return err
	}
	if l == nil || string(l.Key) != t.key {
		return ErrDeposed
	}
	return nil
}

// Campaign blocks until this member is the primary (or ctx ends, or the
// lease is lost) and returns its term.
func (m *Member) Campaign(ctx context.Context) (*Term, error) {
	val, _ := json.Marshal(m.info)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // a lost lease ends the wait too
		select {
		case <-m.sess.Done():
			cancel()
		case <-ctx.Done():
		}
	})
	key, rev, err := m.campaign(ctx, string(val))
	if err != nil {
		select {
		case <-m.sess.Done():
			return nil, fmt.Errorf("cluster: campaign: %w", ErrDeposed)
		default:
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("cluster: campaign: %w", ctx.Err())
		}
		return nil, fmt.Errorf("%w: cluster: campaign: %v", errs.ErrUnavailable, err)
	}
	t := &Term{Epoch: uint64(rev), m: m, key: key}
	m.mu.Lock()
	m.elec = concurrency.ResumeElection(m.sess, m.cfg.electionPrefix(), key, rev) // Resign's
	m.term = t
	m.mu.Unlock()
	m.cfg.Logger.Info("cluster: elected primary", "cluster", m.cfg.Cluster, "id", m.cfg.ID, "epoch", t.Epoch)
	return t, nil
}

// campaign is concurrency.Election.Campaign (the same keys: the
// election's prefix and the lease in hex, the winner the key of the
// lowest creation revision) with its waits made through the keeper: the
// key is put, and the keys created before it are read again, through
// whichever etcd member answers (keeper.do). etcd's own Campaign waits in a
// watch on one member's connection: with that member silent (its machine
// cut off, the primary's with it) the standby next in line heard of the
// old primary's key's deletion only when gRPC's connection keepalive gave
// up, ~12 s, while its lease lived on through the others. A watch on the
// member's client still wakes the wait at once when it is heard; the reads
// every quarter lease (at least every 100ms) decide. On ctx's end the key
// is deleted, as etcd's Campaign does. It returns the key and its creation
// revision (the term's epoch).
func (m *Member) campaign(ctx context.Context, val string) (string, int64, error) {
	pfx := m.cfg.electionPrefix()
	lease := m.sess.Lease()
	key := fmt.Sprintf("%s%x", pfx, lease)
	every := max(time.Duration(m.cfg.ttlSeconds())*time.Second/4, 100*time.Millisecond)
	// Each etcd call is bounded: the keeper falls back to the member's
	// client, without a deadline of its own, while no endpoint's client
	// is connected yet.
	callTimeout := max(4*every, 2*time.Second)
	var rev int64
	tctx, tcancel := context.WithTimeout(ctx, callTimeout)
	err := m.k.do(tctx, func(ctx context.Context, c conn) error {
		resp, err := c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return err
		}
		rev = resp.Header.Revision
		if !resp.Succeeded { // put before (an attempt that timed out and landed; a resign that failed)
			kv := resp.Responses[0].GetResponseRange().Kvs[0]
			rev = kv.CreateRevision
			if string(kv.Value) != val {
				_, err = c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
					Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
			}
		}
		return err
	})
	tcancel()
	if err != nil {
		// etcd may have applied the put and answered late (or the answer
		// was lost): the key would then lead the election for a member
		// with no term — clients would see it primary, and no other
		// member could be elected while its lease lives. It is deleted,
		// best effort (a key left is found again by the next campaign:
		// Else), unless this member holds a term: the key is that term's
		// (Campaign called again while primary).
		m.mu.Lock()
		held := m.term != nil
		m.mu.Unlock()
		if !held {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.DialTimeout)
			_ = m.k.do(dctx, func(ctx context.Context, c conn) error {
				_, err := c.kv.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).Then(clientv3.OpDelete(key)).Commit()
				return err
			})
			cancel()
		}
		return "", 0, err
	}
	withdraw := func() { // the key, unless it is another term's
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.DialTimeout)
		defer cancel()
		_ = m.k.do(dctx, func(ctx context.Context, c conn) error {
			_, err := c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
			return err
		})
	}
	// The watch in its own goroutine: etcd's Watch returns only once its
	// member confirmed the watch, which a silent member never does.
	changed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		for range m.cli.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	})
	for {
		// (Not WithCountOnly: etcd counts before it filters by revision.)
		before := -1
		rctx, rcancel := context.WithTimeout(ctx, callTimeout)
		err := m.k.do(rctx, func(ctx context.Context, c conn) error {
			resp, err := c.kv.Get(ctx, pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
			if err == nil {
				before = len(resp.Kvs)
			}
			return err
		})
		rcancel()
		switch {
		case ctx.Err() != nil:
			withdraw()
			return "", 0, ctx.Err()
		case err == nil && before == 0:
			return key, rev, nil
		}
		// Keys before ours (or etcd did not answer): wait for a change
		// the watch hears, or the next read.
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-changed:
		}
		t.Stop()
	}
}

// Resign gives up the election if this member holds it. The term's proof
// ends first (Valid says ErrDeposed, ProofEnded closes): once the key is
// deleted a standby may be elected at once, and two terms must never pass
// Valid together.
func (m *Member) Resign(ctx context.Context) error {
	m.mu.Lock()
	t, elec := m.term, m.elec
	m.term = nil
	m.mu.Unlock()
	if t == nil {
		return nil
	}
	t.resigning()
	err := elec.Resign(ctx)
	t.resigned()
	if err != nil {
		return fmt.Errorf("%w: cluster: resign: %v", errs.ErrUnavailable, err)
	}
	return nil
}

// Close resigns, revokes the lease (so the others need not wait out the
// TTL) and closes the etcd client. Safe to call more than once.
func (m *Member) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return m.closeErr
	}
	m.closed = true
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DialTimeout)
	defer cancel()
	err := m.Resign(ctx)
	if m.sess != nil {
		// Close revokes the lease; a lease that is already gone is fine.
		if cerr := m.sess.Close(); cerr != nil {
			select {
			case <-m.sess.Done():
			default:
				err = errors.Join(err, cerr)
			}
		}
	}
	m.k.close()
	err = errors.Join(err, m.cli.Close())
	m.mu.Lock()
	m.closeErr = err
	m.mu.Unlock()
	return err
}

// Status reads the members and the primary.
// Through the keeper: an etcd member that does not answer is passed over.
func (m *Member) Status(ctx context.Context) (Status, error) {
	var st Status
	err := m.k.do(ctx, func(ctx context.Context, c conn) error {
		var err error
		st, err = status(ctx, c.kv, &m.cfg)
		return err
	})
	return st, err
}

// Read connects to etcd with cfg (Addr and ID unused), reads the status
// and disconnects: for `rlhub cluster status` and clients that only need
// to find the primary.
func Read(ctx context.Context, cfg Config) (Status, error) {
	if err := cfg.validate(false); err != nil {
		return Status{}, err
	}
	cli, _, err := dial(&cfg)
	if err != nil {
		return Status{}, err
	}
	defer cli.Close()
	return status(ctx, cli, &cfg)
}

func status(ctx context.Context, cli clientv3.KV, cfg *Config) (Status, error) {
	var st Status
	resp, err := cli.Get(ctx, path.Join(cfg.prefix(), "members")+"/", clientv3.WithPrefix())
	if err != nil {
		return st, etcdError(nil, err)
	}
	for _, kv := range resp.Kvs {
		var mi MemberInfo
		if json.Unmarshal(kv.Value, &mi) == nil {
			st.Members = append(st.Members, mi)
		}
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	l, err := electionLeader(ctx, cli, cfg)
	if err != nil {
		return st, err
	}
	if l != nil {
		// A record that is not a member's, or whose address no hub could
		// name (NamesPrimary, the bound a refusal's address is held to),
		// names no primary: a client would dial it and quote it.
		var mi MemberInfo
		if err := json.Unmarshal(l.Value, &mi); err == nil && NamesPrimary(mi.Addr) {
			st.Primary = &Leader{ID: mi.ID, Addr: mi.Addr, Epoch: uint64(l.CreateRevision)}
		}
	}
	// A record that does not parse is left to the election's own read
	// (Member.InSync), which fails on it: the status shows none.
	if st.InSync, err = readInSync(ctx, cli, cfg); errors.Is(err, errs.ErrInvalid) {
		st.InSync, err = nil, nil
	}
	return st, err
}

// Leader is the current primary, or ErrNoLeader.
func (m *Member) Leader(ctx context.Context) (Leader, error) {
	st, err := m.Status(ctx)
	if err != nil {
		return Leader{}, err
	}
	if st.Primary == nil {
		return Leader{}, ErrNoLeader
	}
	return *st.Primary, nil
}

// String renders a leader for logs and the CLI.
func (l Leader) String() string {
	return l.ID + "@" + l.Addr + " epoch " + strconv.FormatUint(l.Epoch, 10)
}
