package reducer

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// applyRec is one published step as OnApply saw it.
type applyRec struct {
	version uint64
	members []reduce.ID
	weights []float32
}

// testEnv is a reducer Service behind a real gRPC server on 127.0.0.1:0,
// over an in-memory store holding one model.
type testEnv struct {
	t     *testing.T
	st    store.Store
	svc   *Service
	srv   *grpc.Server
	bulk  *bulk.Server // the data plane on the same port, as a hub serves it
	addr  string
	model string
	// transport is the clients' ClientConfig.Transport.
	transport string

	mu      sync.Mutex
	applied []applyRec
}

// testLayout is the model the tests train: two tensors.
func testLayout(n int) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.NewF32("fc.weight", int64(n), 4), tensor.NewF32("fc.bias", 4))
	return sd
}

// fill sets every element of sd from r (scaled).
func fill(sd *tensor.StateDict, r *rand.Rand, scale float32) *tensor.StateDict {
	for _, t := range sd.Tensors() {
		f, _ := t.Float32s()
		for i := range f {
			f[i] = scale * float32(r.NormFloat64())
		}
	}
	return sd
}

// gradFor is the deterministic gradient client c pushes with seq s.
func gradFor(n int, c string, s uint64) *tensor.StateDict {
	h := fnv.New64a()
	h.Write([]byte(c))
	return fill(testLayout(n), rand.New(rand.NewPCG(h.Sum64(), s)), 0.1)
}

func pushModel(t testing.TB, st store.Store, name string, sd *tensor.StateDict) {
	t.Helper()
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Push(context.Background(), store.PushRequest{Name: name, Version: 1, Expect: 0, Blob: blob}); err != nil {
		t.Fatal(err)
	}
}

// newTestEnv starts a store with model "m" = init, a Service per cfg
// (Store and OnApply filled in) and a gRPC server.
func newTestEnv(t *testing.T, cfg Config, init *tensor.StateDict) *testEnv {
	t.Helper()
	st, err := store.NewMemory(store.Config{Retain: 2})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{t: t, st: st, model: "m"}
	pushModel(t, st, "m", init)
	if cfg.Store == nil {
		cfg.Store = st
	}
	cfg.OnApply = func(model string, v uint64, members []reduce.ID, weights []float32) {
		e.mu.Lock()
		e.applied = append(e.applied, applyRec{v, members, weights})
		e.mu.Unlock()
	}
	e.start(cfg)
	t.Cleanup(e.stop)
	return e
}

func (e *testEnv) start(cfg Config) {
	lis := testkit.Listen(e.t)
	e.addr = lis.Addr().String()
	if cfg.Addr == nil {
		cfg.Addr = func() string { return e.addr }
	}
	svc, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.svc = svc
	e.bulk = bulk.NewServer()
	svc.RegisterBulk(e.bulk)
	testkit.ServeGRPC(e.t, e.bulk.Listen(lis), func(s *grpc.Server) {
		e.srv = s
		svc.Register(s)
	}, grpc.MaxRecvMsgSize(4<<20))
	// The hosted secondaries attach to the primary in the background: a
	// client's first push (a test's with MaxAttempts 1) that lists none
	// fails "no live secondary" (seen once in CI under load).
	if p := svc.Primary(); p != nil && cfg.Primary == "" {
		testkit.Eventually(e.t, 30*time.Second, "the hosted secondaries attached", func() bool {
			return len(p.Secondaries()) >= len(svc.SecondaryNodes())
		})
	}
}

// forTransports runs body once per client transport, as subtests.
func forTransports(t *testing.T, body func(t *testing.T, transport string)) {
	for _, tr := range []string{TransportAuto, TransportGRPC} {
		name := "transport=" + tr
		if tr == TransportAuto {
			name = "transport=bulk"
		}
		t.Run(name, func(t *testing.T) { body(t, tr) })
	}
}

// checkTransport fails the test unless the pushes went where e.transport
// says: some over the data plane for TransportAuto, none for gRPC.
func (e *testEnv) checkTransport() {
	e.t.Helper()
	n := e.bulk.Requests()
	if e.transport == TransportGRPC && n != 0 {
		e.t.Fatalf("%d requests on the data plane with TransportGRPC", n)
	}
	if e.transport == TransportAuto && n == 0 {
		e.t.Fatal("no request went over the data plane")
	}
}

func (e *testEnv) stop() {
	if e.srv == nil {
		return
	}
	e.svc.Drain()
	e.srv.GracefulStop()
	_ = e.bulk.Shutdown(context.Background())
	_ = e.svc.Close()
	e.srv = nil
	_ = e.st.Close()
}

func (e *testEnv) client(id string, attempts int) *Client {
	e.t.Helper()
	c, err := NewClient(ClientConfig{Hub: e.addr, ClientID: id, MaxAttempts: attempts, Rand: rand.New(rand.NewPCG(uint64(len(id)), 7)), Transport: e.transport})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *testEnv) register(mc ModelConfig) {
	e.t.Helper()
	mc.Model = e.model
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := e.svc.RegisterModel(ctx, mc); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) newest() *store.Snapshot {
	e.t.Helper()
	snap, err := e.st.Get(context.Background(), e.model, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return snap
}

// waitSettled waits until nothing is in flight: pushed = applied + dropped.
func (e *testEnv) waitSettled() Stats {
	e.t.Helper()
	var st Stats
	testkit.Eventually(e.t, 20*time.Second, "the counters to settle (pushed = applied + dropped, queue empty)", func() bool {
		st = e.svc.Stats()
		return st.Total.Pushed == st.Total.Applied+st.Total.DroppedTotal() && st.QueueDepth == 0
	})
	return st
}

// waitAttached waits until n secondaries are attached to the primary.
func waitAttached(t *testing.T, p *Primary, n int) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d secondaries attached", n), func() bool { return len(p.Secondaries()) >= n })
}

// waitSecondariesAttached waits until every secondary of e's hub has its
// primary's welcome. The primary lists a session (waitAttached) before
// the secondary has it, and a push in between is refused Unavailable
// ("not attached to a primary"; seen in a loop of the suite).
func (e *testEnv) waitSecondariesAttached() {
	e.t.Helper()
	testkit.Eventually(e.t, 20*time.Second, "the secondaries to be attached", func() bool {
		for _, n := range e.svc.SecondaryNodes() {
			if !n.Attached() {
				return false
			}
		}
		return true
	})
}

func f32(t testing.TB, sd *tensor.StateDict, name string) []float32 {
	t.Helper()
	f, err := sd.Get(name).Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return f
}
