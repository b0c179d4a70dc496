package reducer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawPushStream opens a raw Reducer/Push stream at secondary "s0" and
// sends its header; the caller sends the body (or not).
func rawPushStream(ctx context.Context, t *testing.T, conn *grpc.ClientConn, client string, seq uint64, blob []byte) rlhubv1.Reducer_PushClient {
	t.Helper()
	st, err := rlhubv1.NewReducerClient(conn).Push(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr := &rlhubv1.ReducerPushHeader{Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: uint64(len(blob))},
		ClientId: client, Seq: seq, Secondary: "s0"}
	if err := st.Send(&rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Header{Header: hdr}}); err != nil {
		t.Fatal(err)
	}
	return st
}

// rawPush pushes a whole gradient over raw gRPC to secondary "s0".
func rawPush(t *testing.T, conn *grpc.ClientConn, client string, seq uint64, sd *tensor.StateDict) error {
	t.Helper()
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := rawPushStream(ctx, t, conn, client, seq, blob)
	if err := st.Send(&rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: blob}}}); err != nil {
		t.Fatal(err)
	}
	_, err = st.CloseAndRecv()
	return grpcerr.FromStatus(err)
}

// servedPrimary serves a Primary built with pcfg (servePrimary) and a
// remote secondary hub (one secondary "s0", batch size 1) attached to it.
// It returns the primary and the secondary hub's address.
func servedPrimary(t *testing.T, pcfg PrimaryConfig, n int) (*Primary, string) {
	t.Helper()
	p, st, paddr := servePrimary(t, pcfg, n)
	sec := &testEnv{t: t, st: st, model: "m"}
	sec.start(Config{Primary: paddr, ForwardTransport: TransportGRPC, Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond, Logger: testkit.Logger()})
	t.Cleanup(sec.stop)
	waitAttached(t, p, 1)
	sec.waitSecondariesAttached()
	return p, sec.addr
}

// servePrimary serves a Primary built with pcfg (Store filled in with a
// memory store holding model "m" = testLayout(n) at version 1, registered
// with SGD) over ReducerPrimary on a real gRPC server. It returns the
// primary, its store and the server's address.
func servePrimary(t *testing.T, pcfg PrimaryConfig, n int) (*Primary, *store.Memory, string) {
	t.Helper()
	st, err := store.NewMemory(store.Config{Retain: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pushModel(t, st, "m", testLayout(n))
	pcfg.Store, pcfg.Logger = st, testkit.Logger()
	p, err := NewPrimary(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Register(context.Background(), ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	paddr := testkit.ServeGRPC(t, nil, func(s *grpc.Server) {
		rlhubv1.RegisterReducerPrimaryServer(s, &primaryServer{p: p, drained: drained})
	})
	t.Cleanup(func() { close(drained); p.Close() })
	return p, st, paddr
}

// pendingClaims counts the claims pending in model's ledger.
func (p *Primary) pendingClaims(model string) int {
	m, _ := p.model(model)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ledger.Pending()
}

// A push admitted (its claim pending) while the same client's later pushes
// are applied and compacted away, whose stream then breaks mid-body, is
// released; its retry must be applied, not answered ALREADY_EXISTS (which
// the client takes as applied): real gRPC, a remote secondary hub.
func TestReleasedClaimUnderCompactionIsAppliedOnRetry(t *testing.T) {
	const n = 3
	var mu sync.Mutex
	var applied []reduce.ID
	appliedc := make(chan struct{}, 100)
	p, secAddr := servedPrimary(t, PrimaryConfig{LedgerWindow: 2, OnApply: func(_ string, _ uint64, members []reduce.ID, _ []float32) {
		mu.Lock()
		applied = append(applied, members...)
		mu.Unlock()
		appliedc <- struct{}{}
	}}, n)
	conn := rawConn(t, secAddr)

	// seq 1: header only, the body does not come yet (admitted, pending).
	blob1, _ := safetensors.Encode(gradFor(n, "c", 1), nil)
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	_ = rawPushStream(ctx1, t, conn, "c", 1, blob1)
	testkit.Eventually(t, 10*time.Second, "seq 1 admitted", func() bool { return p.pendingClaims("m") == 1 })

	// seqs 2..5 applied: the ledger (window 2) compacts.
	for s := uint64(2); s <= 5; s++ {
		if err := rawPush(t, conn, "c", s, gradFor(n, "c", s)); err != nil {
			t.Fatalf("push seq %d: %v", s, err)
		}
		<-appliedc
	}
	// The client's stream for seq 1 dies mid-body: the secondary releases it.
	cancel1()
	testkit.Eventually(t, 10*time.Second, "seq 1 released", func() bool { return p.pendingClaims("m") == 0 })

	// The client retries seq 1 (same client id and seq).
	mu.Lock()
	before := slices.Clone(applied)
	mu.Unlock()
	err := rawPush(t, conn, "c", 1, gradFor(n, "c", 1))
	for _, id := range before {
		if id.Seq == 1 {
			t.Fatalf("seq 1 was applied: %v", before)
		}
	}
	if errors.Is(err, errs.ErrExists) {
		t.Fatalf("retry of seq 1, never applied, answered %v (ALREADY_EXISTS: the client takes it as applied); applied: %v; primary counters %+v",
			err, before, p.Stats().Counters)
	}
	if err != nil {
		t.Fatalf("retry of seq 1: %v", err)
	}
}

// A forward naming one admitted gradient twice is refused: it would be
// counted applied twice and weigh twice in the step's mean.
func TestForwardNamingAGradientTwiceIsRefused(t *testing.T) {
	e := newTestEnv(t, Config{Secondaries: -1, Logger: testkit.Logger()}, testLayout(3))
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}})
	id := &rlhubv1.ReducerGradientID{ClientId: "c", Seq: 1}
	ferr := rawForward(t, e, []*rlhubv1.ReducerGradientID{id, id}, 0)
	c := e.svc.Primary().Stats().Counters
	if !errors.Is(grpcerr.FromStatus(ferr), errs.ErrInvalid) || c.Applied != 0 || c.Steps != 0 {
		t.Fatalf("forward of one admitted gradient named twice: %v; applied %d, steps %d (want InvalidArgument, nothing applied)", ferr, c.Applied, c.Steps)
	}
}

// A remote forward's first-admitted stamp more than an hour off the
// primary's clock (a skewed or forged one: 1970 here) is not counted in
// the publish latency, which it would skew (and whose sum it could
// overflow); the batch itself is applied.
func TestForwardWithAStampFarOffIsAppliedButNotTimed(t *testing.T) {
	e := newTestEnv(t, Config{Secondaries: -1, Logger: testkit.Logger()}, testLayout(3))
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}})
	if err := rawForward(t, e, []*rlhubv1.ReducerGradientID{{ClientId: "c", Seq: 1}}, 1); err != nil {
		t.Fatal(err)
	}
	if c := e.svc.Primary().Stats().Counters; c.Applied != 1 {
		t.Fatalf("applied %d, want 1", c.Applied)
	}
	if h := e.svc.PublishLatency(); h.Count != 0 {
		t.Fatalf("a stamp from 1970 was timed: %d latencies, sum %v", h.Count, h.Sum)
	}
}

// rawForward attaches a secondary over raw gRPC, admits ids' distinct
// gradients and forwards one batch naming ids, stamped first (Unix ns, 0:
// none); it returns the forward's error.
func rawForward(t *testing.T, e *testEnv, ids []*rlhubv1.ReducerGradientID, first int64) error {
	t.Helper()
	pc := rlhubv1.NewReducerPrimaryClient(rawConn(t, e.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	att, err := pc.Attach(ctx, &rlhubv1.ReducerAttachRequest{Id: "raw", Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := att.Recv()
	if err != nil {
		t.Fatal(err)
	}
	sess := ev.GetSession()
	admitted := map[string]bool{}
	for _, id := range ids {
		if k := fmt.Sprint(id.ClientId, id.Seq); !admitted[k] {
			admitted[k] = true
			if _, err := pc.Admit(ctx, &rlhubv1.ReducerAdmitRequest{Session: sess, Model: "m", ClientId: id.ClientId, Seq: id.Seq, BaseVersion: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	blob, _ := safetensors.Encode(gradFor(3, "c", 1), nil)
	fw, err := pc.Forward(ctx)
	if err != nil {
		t.Fatal(err)
	}
	weights := make([]float32, len(ids))
	for i := range weights {
		weights[i] = 1
	}
	hdr := &rlhubv1.ReducerForwardHeader{Session: sess, Ids: ids, Weights: weights, FirstAdmittedUnixNano: first,
		Blob: &rlhubv1.BlobInfo{Model: "m", TotalBytes: uint64(len(blob))}}
	if err := fw.Send(&rlhubv1.ReducerForwardRequest{Body: &rlhubv1.ReducerForwardRequest_Header{Header: hdr}}); err != nil {
		t.Fatal(err)
	}
	if err := fw.Send(&rlhubv1.ReducerForwardRequest{Body: &rlhubv1.ReducerForwardRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: blob}}}); err != nil {
		t.Fatal(err)
	}
	_, err = fw.CloseAndRecv()
	return err
}

// ClusterStats closes its connections to hubs no longer attached: twenty
// secondaries attached and gone, at twenty addresses, leave none.
func TestClusterStatsForgetsDetachedHubs(t *testing.T) {
	const n, fakes = 3, 20
	e := newTestEnv(t, Config{Secondaries: -1, Logger: testkit.Logger()}, testLayout(n))
	conn := rawConn(t, e.addr)
	pc := rlhubv1.NewReducerPrimaryClient(conn)
	var addrs []string
	for range fakes { // addresses nobody listens at: refused at once
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	for i, a := range addrs {
		ctx, cancel := context.WithCancel(context.Background())
		att, err := pc.Attach(ctx, &rlhubv1.ReducerAttachRequest{Id: fmt.Sprintf("s%d", i), Addr: a})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := att.Recv(); err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		st := e.svc.ClusterStats(sctx)
		scancel()
		if len(st.Unreachable) != 1 {
			t.Fatalf("unreachable %v, want the one attached", st.Unreachable)
		}
		cancel() // the secondary goes away
		testkit.Eventually(t, 10*time.Second, "detached", func() bool { return len(e.svc.Primary().Secondaries()) == 0 })
	}
	e.svc.ClusterStats(context.Background()) // nothing attached now
	e.svc.peersMu.Lock()
	peers := len(e.svc.peers)
	e.svc.peersMu.Unlock()
	if peers != 0 {
		t.Fatalf("no secondary attached, yet the service keeps %d peer connections (one per address ever attached)", peers)
	}
}

// Session ids are neither reused by a restarted primary (a secondary that
// has not yet noticed its session ended would claim under another's) nor
// guessable from one another (Admit, Release and Forward name only the
// session).
func TestSessionIDsAreNotReusedAcrossRestarts(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	seen := map[uint64]bool{}
	for restart := range 3 {
		p, err := NewPrimary(PrimaryConfig{Store: st, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			s, _, err := p.Attach(context.Background(), Secondary{ID: fmt.Sprint(i)})
			if err != nil {
				t.Fatal(err)
			}
			if s == 0 || seen[s] {
				t.Fatalf("primary %d handed out session %d, seen before or zero (all: %v)", restart, s, seen)
			}
			seen[s] = true
		}
		p.Close()
	}
}

// flakyRelease is an Upstream whose first Release fails (a network blip
// between a secondary and its primary).
type flakyRelease struct {
	Upstream
	failed atomic.Bool
}

func (f *flakyRelease) Release(ctx context.Context, session uint64, model string, ids []reduce.ID) (int, error) {
	if f.failed.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("%w: injected: connection reset", errs.ErrUnavailable)
	}
	return f.Upstream.Release(ctx, session, model, ids)
}

// A push refused after its admission (a NaN in its body) gives its claim
// back even when the first Release fails: it is tried again, and the
// gradient is counted (invalid) and its corrected retry applied. Left
// pending under the live session, it was counted nowhere and every retry
// was refused Aborted.
func TestFailedReleaseIsTriedAgain(t *testing.T) {
	const n = 3
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pushModel(t, st, "m", testLayout(n))
	p, err := NewPrimary(PrimaryConfig{Store: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := p.Register(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	up := &flakyRelease{Upstream: p}
	s, err := NewSecondary(SecondaryConfig{ID: "s", Upstream: up, BatchSize: 1, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testkit.Eventually(t, 10*time.Second, "the secondary attached", s.Attached)
	push := func(g *tensor.StateDict) error {
		blob, _ := safetensors.Encode(g, nil)
		sent := false
		_, err := s.Push(ctx, PushHeader{Model: "m", BaseVersion: 1, ID: reduce.ID{Client: "c", Seq: 1}, TotalBytes: uint64(len(blob))},
			chunks(func(write func([]byte) error) error {
				if sent {
					return io.EOF
				}
				sent = true
				return write(blob)
			}))
		return err
	}
	bad := gradFor(n, "c", 1)
	f, _ := bad.Get("fc.bias").Float32s()
	f[0] = float32(math.NaN())
	if err := push(bad); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("a NaN gradient: %v, want InvalidArgument", err)
	}
	if !up.failed.Load() {
		t.Fatal("the injected Release failure was never hit")
	}
	if n := p.pendingClaims("m"); n != 0 {
		t.Fatalf("%d claims pending after the refused push", n)
	}
	if err := push(gradFor(n, "c", 1)); err != nil {
		t.Fatalf("the corrected retry of the same seq: %v", err)
	}
}
