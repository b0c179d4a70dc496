package storerpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// serve starts a real gRPC server on 127.0.0.1:0 hosting a store service
// over st, stopped at cleanup. It returns the address.
func serve(t *testing.T, st store.Store, extra ...func(*grpc.Server)) string {
	t.Helper()
	svc, err := storerpc.New(storerpc.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) {
		svc.Register(g)
		for _, f := range extra {
			f(g)
		}
	})
	t.Cleanup(svc.Drain) // runs first: ends the watches so the graceful stop returns
	return addr
}

func newClient(t *testing.T, cfg storerpc.ClientConfig) *storerpc.Client {
	t.Helper()
	c, err := storerpc.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSuiteOverGRPC runs the shared store suite through the client, the
// service and real gRPC against an in-memory store: every rule holds over
// the wire and every error keeps its meaning.
func TestSuiteOverGRPC(t *testing.T) {
	storetest.RunRemote(t, func(t *testing.T, cfg store.Config) store.Store {
		mem, err := store.NewMemory(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		addr := serve(t, mem)
		return newClient(t, storerpc.ClientConfig{Addr: addr, ChunkBytes: 4096})
	})
}

// TestSuiteOverGRPCStockCodec is the same with gRPC's stock proto codec,
// as the Python client talks: the service serves both.
func TestSuiteOverGRPCStockCodec(t *testing.T) {
	storetest.RunRemote(t, func(t *testing.T, cfg store.Config) store.Store {
		mem, err := store.NewMemory(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		addr := serve(t, mem)
		return newClient(t, storerpc.ClientConfig{Addr: addr, ChunkBytes: 4096, StockCodec: true})
	})
}

func TestWatchReportsSkippedVersions(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	// Small flow-control windows and 1 MiB versions: while the watcher
	// blocks, the server's send of the next version stalls after 64 KiB.
	conn, err := grpc.NewClient(serve(t, mem), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := newClient(t, storerpc.ClientConfig{Conn: conn})
	defer c.Close()
	const floats = 256 << 10
	storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, floats)})

	// The watcher takes version 1, then blocks inside its callback while
	// versions 2..10 land. The store and the writer must not wait for it;
	// the stream delivers at most the one version it had begun, then the
	// newest, saying how many it skipped.
	release := make(chan struct{})
	got := make(chan [2]uint64, 16)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	wg.Go(func() {
		err := c.Watch(ctx, "m", 0, func(s *store.Snapshot, skipped uint64) error {
			got <- [2]uint64{s.Version, skipped}
			if s.Version == 1 {
				<-release
			}
			if s.Version == 10 {
				return errors.New("done")
			}
			return nil
		})
		if err == nil || err.Error() != "done" {
			t.Errorf("Watch returned %v, want the callback's error", err)
		}
	})
	if g := recvWithin(t, got); g != [2]uint64{1, 0} {
		t.Fatalf("first delivery %v, want version 1, 0 skipped", g)
	}
	for v := uint64(2); v <= 10; v++ {
		storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, floats)})
	}
	close(release)
	wg.Wait()
	// The server may have started sending version 2 before 3..10 landed;
	// whatever came, versions increase and the skip counts add up.
	var last, total, skipped uint64 = 1, 1, 0
	close(got)
	var deliveries [][2]uint64
	for g := range got {
		deliveries = append(deliveries, g)
		if g[0] <= last {
			t.Fatalf("delivery %v after version %d", g, last)
		}
		total += 1 + g[1]
		skipped += g[1]
		last = g[0]
	}
	if last != 10 || total != 10 || skipped == 0 || len(deliveries) > 2 {
		t.Errorf("deliveries after 1: %v; want at most 2 ending at 10, skips reported, 10 versions accounted for", deliveries)
	}
}

// flaky fails the first n calls of every method with Unavailable.
type flaky struct {
	mu sync.Mutex
	n  int
}

func (f *flaky) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if f.fail() {
		return nil, status.Error(codes.Unavailable, "flaky: try again")
	}
	return h(ctx, req)
}

func (f *flaky) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if f.fail() {
		return status.Error(codes.Unavailable, "flaky: try again")
	}
	return h(srv, ss)
}

func (f *flaky) fail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n > 0 {
		f.n--
		return true
	}
	return false
}

func TestRetriesUnavailable(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	f := &flaky{}
	svc, err := storerpc.New(storerpc.Config{Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, svc.Register, grpc.UnaryInterceptor(f.intercept), grpc.StreamInterceptor(f.stream))

	c := newClient(t, storerpc.ClientConfig{Addr: addr, MaxAttempts: 3, BaseBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
	defer c.Close()
	f.n = 2 // two failures, third attempt succeeds
	if _, err := c.Push(ctxT(t), store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)}); err != nil {
		t.Fatalf("Push after 2 Unavailable: %v", err)
	}
	f.n = 2
	if _, err := c.List(ctxT(t)); err != nil {
		t.Fatalf("List after 2 Unavailable: %v", err)
	}
	f.n = 2
	if s, err := c.Get(ctxT(t), "m", 0); err != nil || s.Version != 1 {
		t.Fatalf("Get after 2 Unavailable: %v, %v", s, err)
	}
	f.n = 3 // one more than attempts: the error surfaces, as a sentinel
	if _, err := c.List(ctxT(t)); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("List after 3 Unavailable = %v, want ErrUnavailable", err)
	}
	f.n = 1
	// A non-retryable error is not retried: one failure is consumed, the
	// stale push fails once with the current version.
	var se *errs.StaleError
	_, err = c.Push(ctxT(t), store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	if !errors.As(err, &se) || se.CurrentVersion != 1 {
		t.Fatalf("stale Push = %v, want *errs.StaleError at version 1", err)
	}
}

func TestDeadlineApplied(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	c := newClient(t, storerpc.ClientConfig{Addr: serve(t, mem), CallTimeout: 50 * time.Millisecond})
	defer c.Close()
	// WaitNewer on a model that never appears ends only by deadline: the
	// caller's here, since WaitNewer is a watch (no default deadline).
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.WaitNewer(ctx, "never", 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer past its deadline = %v, want DeadlineExceeded", err)
	}
}

func TestWatchResumesAfterDrain(t *testing.T) {
	// A hub stopping (Drain) ends watches with Unavailable; the client
	// reconnects to the replacement server at the same address and resumes
	// after the last delivered version.
	mem, _ := store.NewMemory(store.Config{})
	t.Cleanup(func() { mem.Close() }) // after the servers have stopped
	svc1, _ := storerpc.New(storerpc.Config{Store: mem})
	var g1 *grpc.Server
	addr := testkit.ServeGRPC(t, nil, func(s *grpc.Server) { g1 = s; svc1.Register(s) })

	// Retries enough to outlast a slow restart on a loaded machine (about
	// 20 s at the 20 ms cap): a watcher that gives up would end the test.
	c := newClient(t, storerpc.ClientConfig{Addr: addr, BaseBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxAttempts: 1000})
	defer c.Close()
	storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	got := make(chan uint64, 8)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var ww sync.WaitGroup
	ww.Go(func() {
		_ = c.Watch(ctx, "m", 0, func(s *store.Snapshot, _ uint64) error {
			got <- s.Version
			if s.Version == 2 {
				return errors.New("done")
			}
			return nil
		})
	})
	if v := recvWithin(t, got); v != 1 {
		t.Fatalf("first version %d", v)
	}
	svc1.Drain()
	g1.GracefulStop() // returns because Drain ended the watch

	svc2, _ := storerpc.New(storerpc.Config{Store: mem})
	testkit.ServeGRPC(t, testkit.ListenAt(t, addr), svc2.Register)
	t.Cleanup(svc2.Drain) // before ServeGRPC's stop: ends open watches
	storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 4)})
	if v := recvWithin(t, got); v != 2 {
		t.Fatalf("after reconnect got version %d, want 2 (and not 1 again)", v)
	}
	ww.Wait()
}

// recvWithin returns the next value from ch, failing the test rather than
// hanging it until the binary's timeout when none arrives within 30 s (a
// watcher that gave up sends nothing more).
func recvWithin[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	return testkit.Recv(t, ch, 30*time.Second, "the next value")
}
