package dial

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// tokenRecorder is a gRPC server on loopback that records the
// authorization header of every call it receives.
type tokenRecorder struct {
	addr string
	mu   sync.Mutex
	got  []string
}

func startTokenRecorder(t *testing.T) *tokenRecorder {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tokenRecorder{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		r.mu.Lock()
		r.got = append(r.got, md.Get(TokenHeader)...)
		r.mu.Unlock()
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
}

func (r *tokenRecorder) tokens() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// peerAs is a connection whose peer address reads as addr.
type peerAs struct {
	net.Conn
	addr net.Addr
}

func (c peerAs) RemoteAddr() net.Addr { return c.addr }

func wantPlaintextRefusal(t *testing.T, what string, err error, addr string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "plaintext") ||
		!strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("%s: %v, want a refusal naming %s and --tls-ca", what, err, addr)
	}
}

// A Config with a token and no TLS refuses an address off loopback at
// GRPC, before anything is dialled (the dialer, which would connect
// nowhere off this machine, is never called). A hub list is checked the
// same way, hub by hub (Config.checkToken), but its seed connections do
// not take the test's dialer: before the check they would dial off this
// machine, so no list is tried here.
func TestTokenNotSentInPlaintextOffLoopback(t *testing.T) {
	var mu sync.Mutex
	var dialled []string
	nowhere := grpc.WithContextDialer(func(_ context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		return nil, errors.New("test: no connection leaves this machine")
	})
	cfg := Config{Token: "rlh_secret"}
	for target, addr := range map[string]string{
		"192.0.2.1:7470":     "192.0.2.1:7470",
		"10.255.255.1:7470":  "10.255.255.1:7470",
		"[2001:db8::1]:7470": "[2001:db8::1]:7470",
	} {
		conn, err := cfg.GRPC(target, nowhere)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			conn.Close()
			t.Errorf("GRPC(%s) with a token and no TLS: a connection (its call: %v), want a refusal", target, err)
			continue
		}
		if !errors.Is(err, errs.ErrUnauthenticated) {
			t.Errorf("GRPC(%s): %v, want ErrUnauthenticated", target, err)
		}
		wantPlaintextRefusal(t, "GRPC("+target+")", err, addr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialled) != 0 {
		t.Errorf("dialled %v before refusing", dialled)
	}
}

// The token rides on each call's connection only when that connection's
// peer is loopback, whatever the target said: a connection whose peer
// turns out off loopback (an etcd:// primary learned at run time, a name
// that resolved elsewhere; here a loopback connection that reports its
// peer as 192.0.2.1:7470) has its calls fail Unauthenticated naming the
// peer, and the server receives no call and no token. The same server,
// its peer read as it is (127.0.0.1), gets the token.
func TestTokenRidesOnlyOnALoopbackConnection(t *testing.T) {
	rec := startTokenRecorder(t)
	cfg := Config{Token: "rlh_secret"}
	call := func(peer net.Addr) error {
		conn, err := cfg.GRPC("localhost:7470", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", rec.addr)
			if err != nil || peer == nil {
				return c, err
			}
			return peerAs{Conn: c, addr: peer}, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	off := &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 7470}
	err := call(off)
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a call on a connection to %s: %v, want Unauthenticated", off, err)
	}
	wantPlaintextRefusal(t, "a call on a connection to "+off.String(), err, off.String())
	if got := rec.tokens(); len(got) != 0 {
		t.Fatalf("the server off loopback received %q", got)
	}

	if err := call(nil); err != nil {
		t.Fatalf("a call to loopback with the token: %v", err)
	}
	if got := rec.tokens(); len(got) != 1 || got[0] != "Bearer rlh_secret" {
		t.Fatalf("the loopback server received %q, want the token once", got)
	}
}

// loopbackHostname is this machine's hostname with a port, when the name
// resolves to a loopback address only (Debian's /etc/hosts maps it to
// 127.0.1.1); the test is skipped otherwise, saying why.
func loopbackHostname(t *testing.T, port string) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Skipf("no hostname to dial: %v", err)
	}
	ips, err := net.LookupHost(host)
	if err != nil || len(ips) == 0 {
		t.Skipf("this machine's hostname %q does not resolve (%v): /etc/hosts has no mapping of it to compare with loopback", host, err)
	}
	for _, ip := range ips {
		if p := net.ParseIP(ip); p == nil || !p.IsLoopback() {
			t.Skipf("this machine's hostname %q resolves to %v, not to loopback only (/etc/hosts has no loopback mapping of it)", host, ips)
		}
	}
	return net.JoinHostPort(host, port)
}

// namesPrimary is a Cluster service naming one primary.
type namesPrimary struct {
	rlhubv1.UnimplementedClusterServer
	addr string
}

func (n namesPrimary) Primary(context.Context, *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	return &rlhubv1.PrimaryResponse{Address: n.addr, Epoch: 1}, nil
}

// The rule is the address as named, not what it resolves to
// (docs/security.md: names are not resolved): this machine's hostname,
// which /etc/hosts maps to loopback, is refused a plaintext token at
// GRPC, by the data plane, and as a cluster's primary learned at run
// time, whose connection's peer is loopback (127.0.1.1): its calls fail
// Unauthenticated naming it, and the server receives no token. Before,
// the per-call check looked at the peer alone and let the token go to
// the named primary that GRPC and the data plane refused.
func TestTokenRefusedToTheHostnameEverywhere(t *testing.T) {
	rec := startTokenRecorder(t)
	_, port, _ := net.SplitHostPort(rec.addr)
	named := loopbackHostname(t, port)
	cfg := Config{Token: "rlh_secret"}

	if conn, err := cfg.GRPC(named); err == nil {
		conn.Close()
		t.Errorf("GRPC(%s) with a token and no TLS: a connection, want a refusal", named)
	} else {
		wantPlaintextRefusal(t, "GRPC("+named+")", err, named)
	}

	bc := cfg.Bulk()
	defer bc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp wrapperspb.UInt64Value
	if err := bc.Call(ctx, named, "sum", wrapperspb.UInt64(1), net.Buffers{{7}}, &resp); !errors.Is(err, errs.ErrUnauthenticated) {
		t.Errorf("the data plane to %s: %v, want ErrUnauthenticated", named, err)
	} else {
		wantPlaintextRefusal(t, "the data plane to "+named, err, named)
	}

	lis := testkit.Listen(t)
	seed := testkit.ServeGRPC(t, lis, func(g *grpc.Server) { rlhubv1.RegisterClusterServer(g, namesPrimary{addr: named}) })
	conn, err := cfg.GRPC(seed + "," + seed)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a call to the primary %s named by the cluster: %v, want Unauthenticated", named, err)
	}
	wantPlaintextRefusal(t, "a call to the primary "+named, err, named)
	if got := rec.tokens(); len(got) != 0 {
		t.Fatalf("the primary named %s received %q", named, got)
	}
}
