package dial_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's client keeps a resolver goroutine per process.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"))
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7470":                 "127.0.0.1:7470",
		"a:1, b:2,":                      "a:1,b:2",
		"etcd://127.0.0.1:2379/demo":     "etcd://127.0.0.1:2379/demo",
		"etcd://e1:1,http://e2:2/c.1":    "etcd://e1:1,e2:2/c.1",
		"etcd://127.0.0.1:2379":          "etcd://127.0.0.1:2379/rlhub",
		dial.EtcdTarget("e:1, e:2", "x"): "etcd://e:1,e:2/x",
	} {
		got, err := dial.ParseTarget(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	if tg, _ := dial.ParseTarget("a:1"); tg.Clustered() {
		t.Error("one address is not a cluster target")
	}
	for _, bad := range []string{"", ",", "a:1,nocolon", "etcd:///c", "etcd://e:1/bad name", strings.Repeat("a:1,", 2000)} {
		_, err := dial.ParseTarget(bad)
		if !errors.Is(err, errs.ErrInvalid) || len(err.Error()) > 400 {
			t.Errorf("ParseTarget(%.40q): %v, want a short ErrInvalid", bad, err)
		}
		if _, err := (dial.Config{}).GRPC(bad); bad != "" && err == nil {
			t.Errorf("GRPC(%.40q) dialed", bad)
		}
	}
}

// standby is a scripted hub speaking the standby contract (HELPERS,
// internal/cluster refusal): it names a primary on Cluster/Primary and
// refuses every other call with Unavailable and the rlhub-primary /
// rlhub-epoch trailer. The client side is what is under test here; real
// standbys are in the cluster tests.
type standby struct {
	rlhubv1.UnimplementedClusterServer
	self    string
	primary atomic.Pointer[string]
	epoch   atomic.Uint64
	calls   atomic.Int64 // refused calls
	// die, when set, stops the server while a Register is in flight (its
	// outcome is then unknown to the client).
	die func()
}

func (s *standby) Primary(context.Context, *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	p := *s.primary.Load()
	return &rlhubv1.PrimaryResponse{Address: p, Epoch: s.epoch.Load(), Self: p == s.self}, nil
}

func (s *standby) refuse(ctx context.Context) error {
	s.calls.Add(1)
	p, ep := *s.primary.Load(), s.epoch.Load()
	grpc.SetTrailer(ctx, metadata.Pairs(dial.PrimaryTrailer, p, dial.EpochTrailer, fmt.Sprint(ep)))
	return status.Errorf(codes.Unavailable, "rlhub: this hub is a standby; the primary is %s (epoch %d)", p, ep)
}

type standbyStore struct {
	rlhubv1.UnimplementedModelStoreServer
	*standby
}

type standbyReducer struct {
	rlhubv1.UnimplementedReducerServer
	*standby
}

func (s standbyStore) List(ctx context.Context, _ *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	return nil, s.refuse(ctx)
}

func (s standbyReducer) Register(ctx context.Context, _ *rlhubv1.ReducerRegisterRequest) (*rlhubv1.ReducerRegisterResponse, error) {
	if s.die != nil {
		s.calls.Add(1)
		go s.die()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, s.refuse(ctx)
}

func startStandby(t *testing.T, primary string, epoch uint64) *standby {
	t.Helper()
	lis := testkit.Listen(t)
	s := &standby{self: lis.Addr().String()}
	s.primary.Store(&primary)
	s.epoch.Store(epoch)
	testkit.ServeGRPC(t, lis, func(g *grpc.Server) {
		rlhubv1.RegisterClusterServer(g, s)
		rlhubv1.RegisterModelStoreServer(g, standbyStore{standby: s})
		rlhubv1.RegisterReducerServer(g, standbyReducer{standby: s})
	})
	return s
}

// clustered makes h answer Cluster/Primary as the primary of epoch ep.
func clustered(h *hub.Hub, ep uint64) {
	addr := h.Addr().String()
	h.Cluster().SetSource(func(context.Context) (clusterrpc.Info, error) {
		return clusterrpc.Info{Addr: addr, Epoch: ep, Self: true, Cluster: "c"}, nil
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// A write refused by a standby was not applied: the connection moves to
// the primary the refusal names and sends it there, once.
func TestRefusedCallIsSentToThePrimaryNamed(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	clustered(h, 8)
	// The standby claims to be primary at epoch 7 (what a deposed primary
	// believes), so the client starts there, then refuses naming h at 8.
	sb := startStandby(t, "", 7)
	*sb.primary.Load() = sb.self
	conn, err := dial.Config{}.GRPC(sb.self + "," + sb.self)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p, ok := dial.CurrentPrimary(conn); ok {
		t.Logf("before any call the primary is already %v", p)
	}
	testkit.Eventually(t, 10*time.Second, "the first lookup", func() bool {
		p, ok := dial.CurrentPrimary(conn)
		return ok && p.Addr == sb.self
	})
	hubAddr := h.Addr().String()
	sb.primary.Store(&hubAddr)
	sb.epoch.Store(8)
	red := rlhubv1.NewReducerClient(conn)
	// The registration has no learning rate: the primary's reducer's own
	// answer (InvalidArgument) shows the call reached it.
	_, err = red.Register(ctx(t), &rlhubv1.ReducerRegisterRequest{Model: "m"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "lr 0") {
		t.Fatalf("Register through a standby: %v, want the primary reducer's InvalidArgument", err)
	}
	if n := sb.calls.Load(); n != 1 {
		t.Fatalf("the standby saw %d calls, want the 1 it refused", n)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != hubAddr || p.Epoch != 8 {
		t.Fatalf("following %v, want %s epoch 8", p, hubAddr)
	}
	// An answer from an older epoch is not followed back.
	old := sb.self
	sb.primary.Store(&old)
	sb.epoch.Store(7)
	if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx(t), &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatal(err)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != hubAddr {
		t.Fatalf("followed an older epoch to %v", p)
	}
}

// A write whose connection died after it was sent has an unknown outcome:
// it comes back to the caller, never sent again; a read is sent again and
// lands on the new primary.
func TestUnknownOutcomeIsNotResent(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	lis := testkit.Listen(t)
	self := lis.Addr().String()
	sb := &standby{self: self}
	sb.primary.Store(&self)
	sb.epoch.Store(3)
	srv := grpc.NewServer()
	rlhubv1.RegisterClusterServer(srv, sb)
	rlhubv1.RegisterReducerServer(srv, standbyReducer{standby: sb})
	rlhubv1.RegisterModelStoreServer(srv, standbyStore{standby: sb})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer srv.Stop()
	sb.die = func() {
		// The primary dies with the call in flight; h is elected.
		clustered(h, 4)
		srv.Stop()
	}
	conn, err := dial.Config{}.GRPC(self + "," + h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = rlhubv1.NewReducerClient(conn).Register(ctx(t), &rlhubv1.ReducerRegisterRequest{Model: "m"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Register whose server died: %v, want Unavailable", err)
	}
	if n := sb.calls.Load(); n != 1 {
		t.Fatalf("the dead primary saw %d Registers, want 1 (never resent)", n)
	}
	testkit.Recv(t, served, 10*time.Second, "the dead primary's Serve")
	// The next call finds the new primary.
	if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx(t), &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("List after failover: %v", err)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != h.Addr().String() || p.Epoch != 4 {
		t.Fatalf("following %v, want %s epoch 4", p, h.Addr())
	}
}

// With no hub answering, a call waits within its deadline and fails with
// an error that says what was tried — Unavailable and "not sent", since no
// connection ever took it: safe to send again, unlike a call that ran out
// its deadline on a primary (DeadlineExceeded: it may have been applied).
// The same for a stream, and for a cluster found through etcd with no
// primary elected. The Python client answers the same.
func TestNoPrimaryIsAClearError(t *testing.T) {
	dead := [2]string{}
	for i := range dead {
		l := testkit.Listen(t)
		dead[i] = l.Addr().String()
		l.Close()
	}
	e := clustertest.Start(t)
	for _, target := range []string{dead[0] + "," + dead[1], dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), "nobody")} {
		conn, err := dial.Config{}.GRPC(target)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		want := func(what string, err error) {
			t.Helper()
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rlhub: cluster ") || !strings.Contains(err.Error(), "not sent") {
				t.Fatalf("%s on %s with no primary: %v; want Unavailable naming the cluster, not sent", what, target, err)
			}
		}
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = rlhubv1.NewModelStoreClient(conn).List(c, &rlhubv1.StoreListRequest{})
		cancel()
		want("List", err)
		c, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		w, err := rlhubv1.NewModelStoreClient(conn).Watch(c, &rlhubv1.StoreWatchRequest{Model: "m"})
		if err == nil {
			_, err = w.Recv()
		}
		cancel()
		want("Watch", err)
	}
}

// TestCallOnAClosedClusterConnectionEnds: a cluster connection's calls
// wait for a ready primary (waitReady, the unary calls too); one made
// after Close must end at once as Canceled, not wait its whole deadline
// for a connection that can never become ready.
func TestCallOnAClosedClusterConnectionEnds(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	clustered(h, 8)
	sb := startStandby(t, h.Addr().String(), 8)
	conn, err := dial.Config{}.GRPC(sb.self + "," + sb.self)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = rlhubv1.NewModelStoreClient(conn).List(ctx, &rlhubv1.StoreListRequest{})
	if status.Code(err) != codes.Canceled || ctx.Err() != nil {
		t.Fatalf("List on a closed cluster connection: %v (context: %v); want Canceled at once", err, ctx.Err())
	}
	w, err := rlhubv1.NewModelStoreClient(conn).Watch(ctx, &rlhubv1.StoreWatchRequest{Model: "m"})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Canceled || ctx.Err() != nil {
		t.Fatalf("Watch on a closed cluster connection: %v (context: %v); want Canceled at once", err, ctx.Err())
	}
}

func TestRefusalParsesTheContract(t *testing.T) {
	st := status.Error(codes.Unavailable, "rlhub: this hub is a standby; the primary is 10.0.0.1:7470 (epoch 42)")
	if p, ok := dial.Refusal(st, nil); !ok || p.Addr != "10.0.0.1:7470" || p.Epoch != 42 {
		t.Fatalf("from the text: %v %v", p, ok)
	}
	st = status.Error(codes.Unavailable, "rlhub: this hub is a standby; the primary is unknown")
	if p, ok := dial.Refusal(st, nil); !ok || p.Addr != "" {
		t.Fatalf("unknown primary: %v %v", p, ok)
	}
	if _, ok := dial.Refusal(status.Error(codes.Unavailable, "connection refused"), nil); ok {
		t.Fatal("a dead connection is not a refusal")
	}
	md := metadata.Pairs(dial.PrimaryTrailer, "h:1", dial.EpochTrailer, "9")
	if p, ok := dial.Refusal(status.Error(codes.Unavailable, "x"), md); !ok || p != (dial.Primary{Addr: "h:1", Epoch: 9}) {
		t.Fatalf("from the trailer: %v %v", p, ok)
	}
	// What a client would dial is bounded: an address over 300 bytes or
	// with white space, or an epoch that is not a number, names no primary
	// (the client resolves again), in the trailer and in the text alike.
	long := strings.Repeat("h", 1<<20) + ":1"
	for _, pair := range [][2]string{{long, "9"}, {"h :1", "9"}, {"h:1", "x"}} {
		md := metadata.Pairs(dial.PrimaryTrailer, pair[0], dial.EpochTrailer, pair[1])
		if p, ok := dial.Refusal(status.Error(codes.Unavailable, "x"), md); !ok || p.Addr != "" {
			t.Fatalf("trailer %.40q epoch %q: %.60v %v, want a refusal naming no primary", pair[0], pair[1], p, ok)
		}
	}
	if p, ok := dial.RefusalText("rlhub: this hub is a standby; the primary is " + long + " (epoch 9)"); !ok || p.Addr != "" {
		t.Fatalf("a 1 MiB address in the text: %.60v %v", p, ok)
	}
}

// electTwo joins two members of cluster "c" on e at addrs and elects the
// first (its term t0); the second campaigns in the background, and its
// term arrives on won once the first's ends. conn follows the cluster
// through etcd; it and the members are closed at cleanup.
func electTwo(t *testing.T, c context.Context, e *clustertest.Etcd, addrs [2]string) (members [2]*cluster.Member, t0 *cluster.Term, won <-chan *cluster.Term, conn *grpc.ClientConn) {
	t.Helper()
	for i, addr := range addrs {
		m, err := cluster.Join(c, cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: "c", ID: fmt.Sprint("m", i),
			Addr: addr, LeaseTTL: time.Second, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		members[i] = m
	}
	t0, err := members[0].Campaign(c)
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan *cluster.Term, 1)
	go func() { // ends when the member wins or is closed (cleanup)
		t1, _ := members[1].Campaign(c)
		next <- t1
	}()
	conn, err = dial.Config{}.GRPC(dial.EtcdTarget(strings.TrimPrefix(e.Endpoint, "http://"), "c"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return members, t0, next, conn
}

// With etcd as the target, the client reads the election: after the
// primary dies and a standby is elected, its next call lands on the new
// primary at the new epoch.
func TestEtcdTargetFollowsTheElection(t *testing.T) {
	e := clustertest.Start(t)
	c := ctx(t)
	hubs := [2]*hub.Hub{hubtest.Start(t, hub.Config{Logger: testkit.Logger()}), hubtest.Start(t, hub.Config{Logger: testkit.Logger()})}
	members, t0, won, conn := electTwo(t, c, e, [2]string{hubs[0].Addr().String(), hubs[1].Addr().String()})
	store := rlhubv1.NewModelStoreClient(conn)
	if _, err := store.List(c, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatal(err)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != hubs[0].Addr().String() || p.Epoch != t0.Epoch {
		t.Fatalf("following %v, want hub 0 at epoch %d", p, t0.Epoch)
	}
	hubs[0].Close()
	members[0].Close()
	t1 := testkit.Recv(t, won, 20*time.Second, "the standby's election")
	if t1 == nil {
		t.Fatal("the standby was not elected")
	}
	if _, err := store.List(c, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("List after the failover: %v", err)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != hubs[1].Addr().String() || p.Epoch != t1.Epoch || t1.Epoch <= t0.Epoch {
		t.Fatalf("following %v, want hub 1 at epoch %d (> %d)", p, t1.Epoch, t0.Epoch)
	}
}

// stalledStore is a primary whose connection stalls, as one cut off by a
// partition does: it answers Cluster/Primary, but a List never returns
// (until its caller gives up). With hubFirst the call's deadline ends on
// the hub before it does on the client: the List is answered
// DeadlineExceeded at once.
type stalledStore struct {
	rlhubv1.UnimplementedModelStoreServer
	calls    atomic.Int64
	hubFirst bool
}

func (s *stalledStore) List(ctx context.Context, _ *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	s.calls.Add(1)
	if s.hubFirst {
		return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A call that runs out its deadline on the primary makes the connection
// look the primary up again, and the next call waits for that lookup: a
// primary cut off by a partition keeps its connection READY (nothing
// resets it, and the keepalive takes tens of seconds), so without the
// lookup every call would go to it until then. The deadline may end on
// the hub first (hubFirst: its handler answers DeadlineExceeded before
// the caller's context ends); that call ran out its deadline too.
func TestTimedOutCallLooksThePrimaryUpAgain(t *testing.T) {
	for _, hubFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("hubFirst=%v", hubFirst), func(t *testing.T) { timedOutCallLooksThePrimaryUpAgain(t, hubFirst) })
	}
}

func timedOutCallLooksThePrimaryUpAgain(t *testing.T, hubFirst bool) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	lis := testkit.Listen(t)
	self := lis.Addr().String()
	sb := &standby{self: self}
	sb.primary.Store(&self)
	sb.epoch.Store(3)
	stalled := &stalledStore{hubFirst: hubFirst}
	testkit.ServeGRPC(t, lis, func(g *grpc.Server) {
		rlhubv1.RegisterClusterServer(g, sb)
		rlhubv1.RegisterModelStoreServer(g, stalled)
	})
	conn, err := dial.Config{}.GRPC(self + "," + h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testkit.Eventually(t, 10*time.Second, "the first lookup", func() bool {
		p, ok := dial.CurrentPrimary(conn)
		return ok && p.Addr == self
	})
	clustered(h, 4) // elected while the old primary's connection stalls
	cctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err = rlhubv1.NewModelStoreClient(conn).List(cctx, &rlhubv1.StoreListRequest{})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded || stalled.calls.Load() != 1 {
		t.Fatalf("List on the stalled primary: %v (%d calls), want DeadlineExceeded there", err, stalled.calls.Load())
	}
	// The next call, made at once, waits for that lookup and goes to the
	// new primary (before the lookup on timeouts it went to the stalled
	// one until gRPC's keepalive broke the connection; before the wait,
	// to the stalled one once more).
	if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx(t), &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("List after the timed-out one: %v", err)
	}
	if n := stalled.calls.Load(); n != 1 {
		t.Fatalf("the stalled primary saw %d Lists, want 1", n)
	}
	if p, _ := dial.CurrentPrimary(conn); p.Addr != h.Addr().String() || p.Epoch != 4 {
		t.Fatalf("following %v, want %s epoch 4", p, h.Addr())
	}
}

// A hub's Cluster/Primary answer is held to the bound a refusal's primary
// is (300 bytes, no white space): an address no refusal could name names
// no primary, however high its epoch, and the client goes to the one
// another hub names. The answer used to win on its epoch, and every call
// was dialled at it.
func TestAnAbsurdPrimaryAddressNamesNoPrimary(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	clustered(h, 3)
	for _, absurd := range []string{strings.Repeat("h", 1<<20) + ":1", "bad host:1"} {
		sb := startStandby(t, absurd, 9)
		conn, err := dial.Config{}.GRPC(sb.self + "," + h.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx(t), &rlhubv1.StoreListRequest{}); err != nil {
			t.Errorf("List with one hub naming %.20q at epoch 9: %.300v", absurd, err)
		}
		if p, _ := dial.CurrentPrimary(conn); p.Addr != h.Addr().String() || p.Epoch != 3 {
			t.Errorf("following %.40v, want %s epoch 3", p, h.Addr())
		}
		conn.Close()
	}
}
