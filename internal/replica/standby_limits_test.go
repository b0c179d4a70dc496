package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// pendingCall opens a call of method on cc and never sends its request
// message; the channel gets the call's end (cancelled with ctx when the
// server never ends it).
func pendingCall(t *testing.T, ctx context.Context, cc *grpc.ClientConn, method string) <-chan error {
	t.Helper()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cs.RecvMsg(&wrapperspb.BytesValue{}) }()
	return done
}

// A standby answers callers without a token (health, Cluster/Primary,
// the refusals naming the primary), so nothing bounded them: a peer held
// a server goroutine per unary call whose request message it never sent,
// as many calls as it liked, for as long as its connection lived, and
// each could buffer up to gRPC's default 4 MiB. Now, as on the primary,
// a call's message is due soon after its headers (DeadlineExceeded), a
// peer's calls in progress are capped at twice --max-streams-per-peer
// (ResourceExhausted) and a request is at most standbyMaxMsgBytes; a
// caller without a token is still answered.
func TestStandbyBoundsCallsOnTheirHeaders(t *testing.T) {
	const admin, primary = "rlh_admin-token", "127.0.0.1:9"
	v := auth.NewVerifier(map[string]auth.Principal{auth.Hash(admin): {Name: "replica", Role: auth.Admin, Scopes: []string{""}}})
	const capStreams = 3
	lis := testkit.Listen(t)
	stop, held, err := replica.StartCappedStandbyForTest(lis, v, capStreams, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// Cancelled (not timed out) when the standby never answers, so that
	// only the standby's own deadline makes DeadlineExceeded.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	giveUp := time.AfterFunc(30*time.Second, cancel)
	defer giveUp.Stop()

	// A call whose message never comes: ended by the standby.
	if err := <-pendingCall(t, ctx, cc, healthpb.Health_Check_FullMethodName); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a health check whose message never came: %v, want DeadlineExceeded from the standby", err)
	}
	testkit.Eventually(t, 10*time.Second, "the call's place to come back", func() bool { return held("127.0.0.1") == 0 })

	// More calls than the cap: the rest refused on their headers.
	const calls = 2*capStreams + 10
	var ends []<-chan error
	for range calls {
		ends = append(ends, pendingCall(t, ctx, cc, rlhubv1.Cluster_Primary_FullMethodName))
	}
	got := map[codes.Code]int{}
	for _, end := range ends {
		got[status.Code(<-end)]++
	}
	if got[codes.ResourceExhausted] != calls-2*capStreams || got[codes.DeadlineExceeded] != 2*capStreams {
		t.Errorf("%d calls without a message from one peer, cap %d: ended %v; want %d ResourceExhausted and %d DeadlineExceeded",
			calls, 2*capStreams, got, calls-2*capStreams, 2*capStreams)
	}
	testkit.Eventually(t, 10*time.Second, "the calls' places to come back", func() bool { return held("127.0.0.1") == 0 })

	// An oversized request is not read.
	big := &wrapperspb.BytesValue{Value: bytes.Repeat([]byte{1}, 1<<20)}
	if err := cc.Invoke(ctx, rlhubv1.Cluster_Primary_FullMethodName, big, &rlhubv1.PrimaryResponse{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Cluster/Primary with a 1 MiB request: %v, want ResourceExhausted", err)
	}
	// A call the standby refuses is refused whatever its message's size
	// (a client's push learns where the primary is).
	var tr metadata.MD
	err = cc.Invoke(ctx, rlhubv1.ModelStore_List_FullMethodName, big, &rlhubv1.StoreListResponse{}, grpc.Trailer(&tr))
	if r, ok := cluster.AsRefusal(err, tr); !ok || r.Primary != primary {
		t.Errorf("ModelStore/List with a 1 MiB request: %v, want the refusal naming %s", err, primary)
	}

	// Callers without a token are answered as before.
	p, err := rlhubv1.NewClusterClient(cc).Primary(ctx, &rlhubv1.PrimaryRequest{})
	if err != nil || p.GetAddress() != primary {
		t.Errorf("Cluster/Primary without a token: %v, err %v; want %s", p, err, primary)
	}
	hc, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check without a token: %v, err %v; want SERVING", hc, err)
	}
	_, err = rlhubv1.NewModelStoreClient(cc).List(ctx, &rlhubv1.StoreListRequest{}, grpc.Trailer(&tr))
	if r, ok := cluster.AsRefusal(err, tr); !ok || r.Primary != primary {
		t.Errorf("ModelStore/List without a token: %v, want the refusal naming %s", err, primary)
	}
}

// A standby serves the hub's address between terms, both planes on one
// listener, and holds a peer to the hub's own --max-conns-per-peer there,
// as the primary does: a peer (127.0.0.2) opening three times the cap
// keeps the cap open, the rest closed at accept. Before, the standby's
// listener ran on the data-plane package's defaults (256 connections per
// peer, its frame, idle and body timeouts) whatever the flags said.
// --frame-timeout is long, so a connection that sent nothing is closed
// only by the cap within the test (before, the data plane's default 10 s
// closed them all).
func TestStandbyHoldsAPeerToTheConnectionCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and two hub processes")
	}
	const capConns = 8
	c := newCluster(t, startEtcd(t), 2, "--max-conns-per-peer", strconv.Itoa(capConns), "--frame-timeout", "5m")
	l, p := c.leader(0)
	sb := c.standbys(p)[0]
	c.synced(sb, l) // a member following the primary: its standby server has the address

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 10 * time.Second}
	const n = 3 * capConns
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		conn, err := d.Dial("tcp", sb.addr)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, conn)
	}
	closed := make([]bool, n)
	count := func() int {
		k := 0
		for i, conn := range conns {
			if !closed[i] {
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
				var b [1]byte
				if _, err := conn.Read(b[:]); err != nil {
					if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
						closed[i] = true
					}
				}
			}
			if closed[i] {
				k++
			}
		}
		return k
	}
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("the standby closing %d of %d connections from one peer over its cap of %d", n-capConns, n, capConns),
		func() bool { return count() >= n-capConns })
	if k := count(); k != n-capConns {
		t.Errorf("the standby closed %d of %d connections from one peer, want %d: its cap is %d, and --frame-timeout keeps the rest open", k, n, n-capConns, capConns)
	}
}
