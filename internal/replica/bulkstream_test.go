package replica

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// The replication stream on the data plane, between a real primary
// (store, Source, the data plane and gRPC on one 127.0.0.1 listener, as
// a hub serves them) and a real Follower; the process-level tests run it
// between `rlhub serve --etcd` hubs (the cluster's default transport).

// dpPrimary is a primary's replication served on one listener.
type dpPrimary struct {
	dir    string
	src    *Source
	fenced *Fenced
	addr   string
	checks atomic.Int64 // data-plane requests the guard saw
	bulk   *bulk.Server // nil: no data plane
}

type dpOptions struct {
	bulkMethod bool        // the data plane answers BulkFollowMethod
	grpc       bool        // gRPC serves the Follow stream
	guard      bulk.Guard  // the data plane's guard (nil: none)
	noBulk     bool        // a gRPC-only server (no data plane at all)
	tls        *tls.Config // the hub's TLS (both planes); nil: plaintext
}

func startDPPrimary(t *testing.T, o dpOptions) *dpPrimary {
	t.Helper()
	p := &dpPrimary{dir: t.TempDir()}
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(p.dir, "store"), Store: store.Config{Retain: 3}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	// acks all of one standby, "s1"; a publish waits long enough for a
	// follower to come back after a cut.
	p.src, err = NewSource(SourceConfig{DataDir: p.dir, Epoch: 5, Acks: AcksAll, AckTimeout: time.Minute, Logger: testkit.Logger(),
		Standbys: func(context.Context) ([]string, error) { return []string{"s1"}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	p.fenced = &Fenced{Store: st, Epoch: 5, Source: p.src}
	lis := testkit.Listen(t)
	p.addr = lis.Addr().String()
	gs := grpc.NewServer()
	if o.grpc {
		p.src.Register(gs)
	}
	var b *bulk.Server
	var g net.Listener = lis
	if !o.noBulk {
		b = bulk.NewServer()
		if o.tls != nil {
			b.TLS = bulk.ServerTLS(o.tls)
		}
		b.Guard = guardFunc(func(ctx context.Context, token, method string, header []byte) (context.Context, error) {
			p.checks.Add(1)
			if o.guard != nil {
				return o.guard.Check(ctx, token, nil, method, header)
			}
			return ctx, nil
		})
		if o.bulkMethod {
			p.src.RegisterBulk(b)
		}
		g = b.Listen(lis)
		p.bulk = b
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(g) })
	t.Cleanup(func() {
		p.src.Stop()
		if b != nil {
			b.Close()
		}
		gs.Stop()
		wg.Wait()
		p.src.Close()
		st.Close()
	})
	return p
}

type guardFunc func(ctx context.Context, token, method string, header []byte) (context.Context, error)

func (f guardFunc) Check(ctx context.Context, token string, _ *tls.ConnectionState, method string, header []byte) (context.Context, error) {
	return f(ctx, token, method, header)
}

// push publishes version v of model m (size bytes) and waits for the
// standby's acknowledgement; it returns the bytes pushed.
func (p *dpPrimary) push(t *testing.T, ctx context.Context, m string, v uint64, size int) []byte {
	t.Helper()
	blob := storetest.Blob(t, v, size/4+int(v)) // with its header: the last data frame is short
	if _, err := p.fenced.Push(ctx, store.PushRequest{Name: m, Version: v, Expect: v - 1, Blob: bytes.Clone(blob)}); err != nil {
		t.Fatalf("push %s v%d: %v", m, v, err)
	}
	return blob
}

// dpFollower runs a Follower toward addr, each Follow in turn, until the
// test ends; errs receives each Follow's end.
type dpFollower struct {
	f    *Follower
	dir  string
	ends chan error
}

func newDPFollower(t *testing.T, token string, transport Transport) *dpFollower {
	return newDPFollowerTLS(t, bulk.ClientConfig{Token: token}, transport)
}

func newDPFollowerTLS(t *testing.T, cfg bulk.ClientConfig, transport Transport) *dpFollower {
	t.Helper()
	d := &dpFollower{dir: t.TempDir(), ends: make(chan error, 16)}
	var err error
	d.f, err = NewFollower(FollowerConfig{DataDir: d.dir, Member: "s1", Logger: testkit.Logger(), Transport: transport,
		Bulk: bulk.NewClientConfig(cfg),
		Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// follow runs one Follow of addr in a goroutine the test waits for.
func (d *dpFollower) follow(t *testing.T, ctx context.Context, addr string) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.ends <- d.f.Follow(ctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5})
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// same fails unless the follower holds version v of m with exactly want.
func (d *dpFollower) same(t *testing.T, m string, v uint64, want []byte) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(d.dir, "store", store.VersionFile(m, v)))
	if err != nil {
		t.Fatalf("the standby's copy of %s v%d: %v", m, v, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the standby's %s v%d: %d bytes, not the %d pushed (or different bytes)", m, v, len(got), len(want))
	}
}

// Over the data plane (the primary serves no gRPC stream at all), every
// version arrives byte for byte, each acknowledged before its push
// returns (acks all), sizes that end on a short frame and span several.
func TestDataPlaneReplicationDeliversByteIdenticalVersions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	d := newDPFollower(t, "", TransportAuto)
	d.follow(t, ctx, p.addr)
	want := map[uint64][]byte{1: p.push(t, ctx, "m", 1, 1<<20)}
	for v := uint64(2); v <= 5; v++ {
		want[v] = p.push(t, ctx, "m", v, int(v)<<20)
		d.same(t, "m", v, want[v]) // acknowledged: installed
	}
	wantOther := p.push(t, ctx, "other", 1, 100)
	d.same(t, "other", 1, wantOther)
	d.same(t, "m", 5, want[5])
	if p.checks.Load() == 0 {
		t.Fatal("the data plane saw no request")
	}
	select {
	case err := <-d.ends:
		t.Fatalf("the stream ended: %v", err)
	default:
	}
}

// cutProxy forwards 127.0.0.1 connections to target; once armed at n,
// the connection carrying the primary's bytes is cut after exactly n of
// them (mid-frame), both ways.
type cutProxy struct {
	*testkit.Proxy
	down  atomic.Int64 // bytes forwarded primary → follower
	cutAt atomic.Int64 // 0: not armed
	cuts  atomic.Int64
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	x := &cutProxy{}
	x.Proxy = testkit.StartProxy(t, target, x.down1)
	return x
}

func (x *cutProxy) down1(c, u net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			b := buf[:n]
			at := x.down.Add(int64(n))
			if cut := x.cutAt.Load(); cut > 0 && at >= cut {
				b = b[:int64(n)-(at-cut)]
				_, _ = c.Write(b)
				x.cutAt.Store(0)
				x.cuts.Add(1)
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A connection cut in the middle of a unit (inside a data frame) fails
// the stream; the standby installs nothing of that unit (no file of it,
// no staging left), then follows again and gets the version whole.
func TestDataPlaneCutMidFrameInstallsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	x := startCutProxy(t, p.addr)
	d := newDPFollower(t, "", TransportAuto)
	d.follow(t, ctx, x.Addr())
	want1 := p.push(t, ctx, "m", 1, 1<<20)
	d.same(t, "m", 1, want1)

	// Cut 2 MiB into the next unit (version 2: 4 MiB in 1 MiB frames).
	x.cutAt.Store(x.down.Load() + 2<<20 + 1234)
	pushed := make(chan []byte, 1)
	go func() {
		blob := storetest.Blob(t, 2, 1<<20)
		_, err := p.fenced.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: bytes.Clone(blob)})
		if err != nil {
			t.Errorf("push v2: %v", err)
		}
		pushed <- blob
	}()
	select {
	case err := <-d.ends:
		if !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("the cut stream ended with %v, want Unavailable", err)
		}
	case <-ctx.Done():
		t.Fatal("the cut stream did not end")
	}
	if x.cuts.Load() != 1 {
		t.Fatalf("%d cuts", x.cuts.Load())
	}
	if _, err := os.Stat(filepath.Join(d.dir, "store", store.VersionFile("m", 2))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("version 2 after the cut: %v, want absent", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.dir, ".replica")); len(ents) > 0 {
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "unit-") {
				continue
			}
			// The staging directory stays (stageName), empty.
			if staged, _ := os.ReadDir(filepath.Join(d.dir, ".replica", e.Name())); e.Name() != stageName || len(staged) > 0 {
				t.Fatalf("a staged unit left after the cut: %s (%d files)", e.Name(), len(staged))
			}
		}
	}
	if _, u := d.f.PositionForTest(); u >= 2 {
		t.Fatalf("position unit %d after the cut", u)
	}
	select {
	case <-pushed:
		t.Fatal("version 2's push returned before any standby held it")
	default:
	}
	// The standby follows again: the version arrives whole, the push is
	// acknowledged.
	d.follow(t, ctx, x.Addr())
	want2 := <-pushed
	d.same(t, "m", 2, want2)
	d.same(t, "m", 1, want1)
}

// The gRPC stream is the fallback: when the primary's data plane lacks
// the method (an older primary), when the address does not speak the
// data plane at all, and when the follower is told to use gRPC.
func TestDataPlaneFallsBackToGRPC(t *testing.T) {
	for _, tc := range []struct {
		name      string
		o         dpOptions
		transport Transport
		asked     bool // the data plane was asked (and answered Unimplemented)
	}{
		{"primary without the method", dpOptions{grpc: true}, TransportAuto, true},
		{"no data plane", dpOptions{grpc: true, noBulk: true}, TransportAuto, false},
		{"told to use gRPC", dpOptions{grpc: true, bulkMethod: true}, TransportGRPC, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := startDPPrimary(t, tc.o)
			d := newDPFollower(t, "", tc.transport)
			d.follow(t, ctx, p.addr)
			for v := uint64(1); v <= 2; v++ {
				want := p.push(t, ctx, "m", v, 2<<20)
				d.same(t, "m", v, want)
			}
			if n := p.checks.Load(); n != 0 {
				t.Fatalf("the data plane admitted %d requests", n)
			}
			if p.bulk != nil {
				if got := p.bulk.Requests() > 0; got != tc.asked {
					t.Fatalf("data-plane requests answered: %d, want some: %v", p.bulk.Requests(), tc.asked)
				}
			}
		})
	}
}

// The data plane's stream needs the admin token, as the gRPC stream does:
// no token, an unknown one or a trainer's is refused, and the follower
// does not fall back to gRPC for it (gRPC here has no token check, so a
// fallback would follow). A standby's data plane refuses the stream with
// the standby refusal.
func TestDataPlaneReplicationRefusesWithoutTheAdminToken(t *testing.T) {
	const admin, trainer = "rlh_admin-token", "rlh_trainer-token"
	v := auth.NewVerifier(map[string]auth.Principal{
		auth.Hash(admin):   {Name: "replica", Role: auth.Admin, Scopes: []string{""}},
		auth.Hash(trainer): {Name: "learner", Role: auth.Trainer, Scopes: []string{""}},
	})
	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"no token", "", errs.ErrUnauthenticated},
		{"unknown token", "rlh_nobody", errs.ErrUnauthenticated},
		{"trainer", trainer, errs.ErrPermission},
		{"admin", admin, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := startDPPrimary(t, dpOptions{bulkMethod: true, grpc: true, guard: v})
			d := newDPFollower(t, tc.token, TransportAuto)
			if tc.want == nil {
				d.follow(t, ctx, p.addr)
				want := p.push(t, ctx, "m", 1, 1<<20)
				d.same(t, "m", 1, want)
				return
			}
			fctx, fcancel := context.WithTimeout(ctx, 20*time.Second)
			defer fcancel()
			err := d.f.Follow(fctx, cluster.Leader{ID: "p", Addr: p.addr, Epoch: 5})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Follow with %s: %v, want %v", tc.name, err, tc.want)
			}
			if acked, _ := p.src.Followers(); len(acked) != 0 {
				t.Fatalf("a refused caller is a follower: %v", acked)
			}
		})
	}
	t.Run("standby", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		lis := testkit.Listen(t)
		s := startStandby(lis, nil, v, hub.Limits{}, testkit.Logger(), func() *cluster.Refusal {
			return cluster.NewRefusal(&cluster.Leader{ID: "h9", Addr: "127.0.0.1:9", Epoch: 8})
		}, func() position { return position{Epoch: 8, Unit: 3} }, nil)
		defer func() {
			if err := s.stop(); err != nil {
				t.Error(err)
			}
		}()
		d := newDPFollower(t, admin, TransportAuto)
		err := d.f.Follow(ctx, cluster.Leader{ID: "x", Addr: lis.Addr().String(), Epoch: 8})
		r, ok := cluster.AsRefusal(err, nil)
		if !ok || r.Primary != "127.0.0.1:9" || r.Epoch != 8 {
			t.Fatalf("Follow of a standby: %v, want its refusal naming 127.0.0.1:9 (epoch 8)", err)
		}
	})
}

// FuzzDataPlaneFrames feeds the standby's frame readers (a control frame,
// then a data frame into a file) bytes from the network: they return a
// frame within its bounds or an error, never more than they were allowed.
func FuzzDataPlaneFrames(f *testing.F) {
	f.Add(append(frameHead(2), 'A', 7))
	f.Add(append(append(frameHead(1), kindPing), append(frameHead(3), 1, 2, 3)...))
	f.Add([]byte{frameTag, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{3, 0, 0, 0, 0})
	f.Add([]byte{frameTag, 4, 0, 0, 0, 1})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		none := func(time.Time) error { return nil }
		if body, err := readFrame(br, none, 64, nil); err == nil && (len(body) == 0 || len(body) > 64) {
			t.Fatalf("a frame of %d bytes read with a limit of 64", len(body))
		}
		out, err := os.CreateTemp(dir, "f")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(out.Name())
		defer out.Close()
		var buf []byte
		n, err := readData(br, none, out, 16, &buf)
		fi, _ := out.Stat()
		if err == nil && (n <= 0 || n > 16 || fi.Size() != n) || err != nil && fi.Size() != 0 {
			t.Fatalf("data frame: n %d, err %v, %d bytes written (limit 16)", n, err, fi.Size())
		}
	})
}

// A follower that opens the stream and then neither reads nor answers
// (a stopped standby) is dropped by the primary once it has sent nothing
// for streamIdle: the primary's pings, which its socket's buffers still
// take, do not count as the follower's progress.
func TestDataPlaneSilentFollowerIsDropped(t *testing.T) {
	oldPing, oldIdle := pingEvery, streamIdle
	pingEvery, streamIdle = 50*time.Millisecond, 500*time.Millisecond
	// Restored last: after the primary's cleanup has ended its goroutines.
	t.Cleanup(func() { pingEvery, streamIdle = oldPing, oldIdle })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	c := bulk.NewClient()
	defer c.Close()
	u, err := openBulk(ctx, c, p.addr, hello{Member: "s1", Epoch: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer u.close()
	testkit.Eventually(t, 30*time.Second, "the silent follower connected", func() bool {
		acked, _ := p.src.Followers()
		_, ok := acked["s1"]
		return ok
	})
	testkit.Eventually(t, 30*time.Second, "the silent follower dropped", func() bool {
		acked, _ := p.src.Followers()
		return len(acked) == 0
	})
}

// With TLS on the hub the stream runs over TLS (ALPN rlhub-dp/2), from
// the follower's data-plane client configuration; the primary here serves
// no gRPC stream, so the versions can only come that way.
func TestDataPlaneReplicationOverTLS(t *testing.T) {
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("hub", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true, tls: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	d := newDPFollowerTLS(t, bulk.ClientConfig{TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}, TransportAuto)
	d.follow(t, ctx, p.addr)
	for v := uint64(1); v <= 2; v++ {
		want := p.push(t, ctx, "m", v, 3<<20)
		d.same(t, "m", v, want)
	}
	if p.checks.Load() == 0 {
		t.Fatal("the data plane saw no request")
	}
}
