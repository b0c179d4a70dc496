package wsync

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// hubFixture is a real gRPC server on 127.0.0.1:0 serving WeightSync over
// an in-memory store.
type hubFixture struct {
	st   *store.Memory
	svc  *Service
	srv  *grpc.Server
	addr string
}

func startHub(t testing.TB) *hubFixture { return startHubWith(t, ServiceConfig{}) }

// startHubWith is startHub with cfg (its Versions set to the store).
func startHubWith(t testing.TB, cfg ServiceConfig) *hubFixture {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Versions = st
	svc, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &hubFixture{st: st, svc: svc}
	h.addr = testkit.ServeGRPC(t, nil, func(s *grpc.Server) {
		h.srv = s
		svc.Register(s)
	})
	t.Cleanup(h.stop) // before ServeGRPC's: drains the streams first
	return h
}

// stop drains the service, stops the server and closes everything; safe
// to call twice.
func (h *hubFixture) stop() {
	h.svc.Drain()
	h.srv.GracefulStop()
	h.svc.Close()
	h.st.Close()
}

func (h *hubFixture) push(t testing.TB, v uint64, words int) {
	t.Helper()
	snap := wsynctest.Snap(t, "m", v, words)
	if _, err := h.st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
		t.Fatal(err)
	}
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// collector is a Client plus a Receiver following it in a goroutine.
type collector struct {
	client  *Client
	recv    *Receiver
	cancel  context.CancelFunc
	done    chan error
	mu      sync.Mutex
	applied []uint64
}

func startCollector(t testing.TB, addr, id string, start uint64) *collector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := Attach(ctx, ClientConfig{Conn: dial(t, addr), CollectorID: id, Model: "m", Start: start})
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{client: cl, done: make(chan error, 1)}
	c.recv, err = NewReceiver(ReceiverConfig{Source: cl, Start: start,
		Apply: func(s *store.Snapshot) error {
			if err := wsynctest.Check(s); err != nil {
				return err
			}
			c.mu.Lock()
			c.applied = append(c.applied, s.Version)
			c.mu.Unlock()
			return nil
		},
		OnApplied: func(v uint64) { cl.Running(v) },
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	c.cancel = rcancel
	go func() { c.done <- c.recv.Run(rctx) }()
	t.Cleanup(c.stop)
	return c
}

func (c *collector) stop() {
	c.cancel()
	<-c.done
	c.done <- nil // later stops return at once
	c.client.Close()
}

func (c *collector) versions() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.applied)
}

// waitFor polls cond until it holds, for up to 20s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, what, cond)
}

func TestPushFanOutAndLag(t *testing.T) {
	h := startHub(t)
	cs := []*collector{startCollector(t, h.addr, "a", 0), startCollector(t, h.addr, "b", 0), startCollector(t, h.addr, "c", 0)}
	for v := uint64(1); v <= 3; v++ {
		h.push(t, v, 1000)
	}
	for _, c := range cs {
		waitFor(t, "collectors at v3", func() bool { return c.recv.Version() == 3 })
	}
	// Reports travel on the stream; wait until the hub has them all.
	lagOf := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, ms := range h.svc.Lag(context.Background(), "m") {
			for _, c := range ms.Collectors {
				m[c.ID] = c.Lag
			}
		}
		return m
	}
	waitFor(t, "reports of v3", func() bool {
		st := h.svc.Lag(context.Background(), "m")
		for _, c := range st[0].Collectors {
			if c.Version != 3 || !c.Attached {
				return false
			}
		}
		return len(st[0].Collectors) == 3
	})
	// A collector using another transport reports by RPC; it runs v1.
	conn := dial(t, h.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "shm-1", Model: "m", Version: 1, Via: "shm"}); err != nil {
		t.Fatal(err)
	}
	st, err := Status(ctx, conn, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Newest != 3 || len(st[0].Collectors) != 4 {
		t.Fatalf("status = %+v", st)
	}
	if lag := lagOf(); lag["shm-1"] != 2 || lag["a"] != 0 {
		t.Fatalf("lags = %v, want shm-1:2 a:0", lag)
	}
	if got := st[0].Histogram; got[0].Count != 3 || got[2].Count != 1 {
		t.Fatalf("histogram = %+v, want 3 at lag 0 and 1 at lag 2", got)
	}

	// Bad reports change nothing.
	err = Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "ok", Model: "m", Version: 9}, &rlhubv1.CollectorReport{Model: "m"})
	if !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("report without id = %v, want ErrInvalid", err)
	}
	if _, ok := lagOf()["ok"]; ok {
		t.Fatal("a refused report batch was partly recorded")
	}
}

func TestAttachRejectsBadHello(t *testing.T) {
	h := startHub(t)
	conn := dial(t, h.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, first := range []*rlhubv1.SyncClientMessage{
		{Body: &rlhubv1.SyncClientMessage_Running{Running: &rlhubv1.SyncRunning{Version: 1}}},
		{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{Model: "m"}}},
		{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{CollectorId: "x", Model: "m", ChunkBytes: 10}}},
	} {
		stream, err := rlhubv1.NewWeightSyncClient(conn).Attach(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(first)
		if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("first message %v: %v, want InvalidArgument", first, err)
		}
	}
	if st := h.svc.Lag(ctx, ""); len(st) != 0 {
		t.Fatalf("bad hellos left collectors: %+v", st)
	}
}

// A collector that does not read its stream blocks only itself: the others
// get every version meanwhile, and when it reads again it skips to the
// newest.
func TestSlowCollectorDoesNotBlockOthers(t *testing.T) {
	h := startHub(t)
	const versions, words = 12, 256 << 10 // 1 MiB each, far over the slow stream's window
	fast := []*collector{startCollector(t, h.addr, "fast-1", 0), startCollector(t, h.addr, "fast-2", 0)}

	// The slow collector: its own connection with small fixed windows, a
	// hello, then no reads until the others are done.
	slowConn := dial(t, h.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slow, err := rlhubv1.NewWeightSyncClient(slowConn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{CollectorId: "slow", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "slow collector attached", func() bool {
		st := h.svc.Lag(ctx, "m")
		return len(st) == 1 && len(st[0].Collectors) == 3
	})

	for v := uint64(1); v <= versions; v++ {
		h.push(t, v, words)
		for _, c := range fast {
			waitFor(t, "fast collectors to get each version while the slow one is stalled", func() bool { return c.recv.Version() == v })
		}
	}

	// Now the slow collector reads: it must end at the newest and have
	// skipped what it was too slow for.
	var seen []uint64
	for len(seen) == 0 || seen[len(seen)-1] != versions {
		m, err := slow.Recv()
		if err != nil {
			t.Fatalf("slow collector: %v after versions %v", err, seen)
		}
		if info := m.GetInfo(); info != nil {
			seen = append(seen, info.Version)
		}
	}
	if len(seen) >= versions {
		t.Fatalf("slow collector was sent every version %v; want it to skip to the newest", seen)
	}
	t.Logf("slow collector was sent versions %v", seen)
	for _, c := range fast {
		if got := c.versions(); len(got) != versions {
			t.Errorf("fast collector applied %v, want all %d versions", got, versions)
		}
	}
	cancel()
}

// A collector that restarts (same id, the version it ran) resumes at the
// newest version, not at the ones it missed.
func TestCollectorRestartResumesAtNewest(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	c := startCollector(t, h.addr, "c1", 0)
	waitFor(t, "v1", func() bool { return c.recv.Version() == 1 })
	// The collector reports what it runs after applying it: stopped before
	// the hub has that report, it counts as running nothing (lag 5).
	waitFor(t, "the hub to see c1 on v1", func() bool {
		st := h.svc.Lag(context.Background(), "m")
		return len(st) == 1 && len(st[0].Collectors) == 1 && st[0].Collectors[0].Version == 1
	})
	c.stop()
	waitFor(t, "detach seen", func() bool {
		st := h.svc.Lag(context.Background(), "m")
		return len(st) == 1 && len(st[0].Collectors) == 1 && !st[0].Collectors[0].Attached
	})
	for v := uint64(2); v <= 5; v++ {
		h.push(t, v, 100)
	}
	if st := h.svc.Lag(context.Background(), "m"); st[0].Collectors[0].Lag != 4 {
		t.Fatalf("while down: lag %d, want 4", st[0].Collectors[0].Lag)
	}
	for _, start := range []uint64{1, 0} { // kept its weights, lost them
		c2 := startCollector(t, h.addr, "c1", start)
		waitFor(t, "v5 after restart", func() bool { return c2.recv.Version() == 5 })
		if got := c2.versions(); !slices.Equal(got, []uint64{5}) {
			t.Fatalf("restart from v%d applied %v, want [5]", start, got)
		}
		c2.stop()
	}
}

func TestDrainEndsStreamsUnavailable(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 10)
	c := startCollector(t, h.addr, "c", 0)
	waitFor(t, "v1", func() bool { return c.recv.Version() == 1 })
	h.svc.Drain()
	select {
	case err := <-c.done:
		c.done <- err
		if !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("Run after drain = %v, want ErrUnavailable", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("drain did not end the stream")
	}
	h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Attach(ctx, ClientConfig{Conn: dial(t, h.addr), CollectorID: "x", Model: "m"}); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("attach to a stopped hub = %v, want ErrUnavailable", err)
	}
}
