package dial

import (
	"context"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// dialed is a resolver.ClientConn that keeps the address it was last
// given: the one gRPC would dial. An update to slow takes a millisecond
// (gRPC's own work on an update, made long): room for another offer.
type dialed struct {
	resolver.ClientConn
	slow string
	mu   sync.Mutex
	addr string
}

func (d *dialed) UpdateState(s resolver.State) error {
	if s.Addresses[0].Addr == d.slow {
		time.Sleep(time.Millisecond)
	}
	d.mu.Lock()
	d.addr = s.Addresses[0].Addr
	d.mu.Unlock()
	return nil
}

// An offer made while gRPC is being told of an older one (each source
// of offers — the election watch, the loop's lookup, a refusal's hint, a
// data-plane refusal — offers on its own goroutine) ends with gRPC given
// the primary followed: the addresses reach the connection in the order
// the offers were taken. (TestConcurrentOffersEndOnTheNewestPrimary shows
// what a connection left on the older one does.)
func TestConcurrentOffersHandGRPCThePrimaryFollowed(t *testing.T) {
	d := &dialed{slow: "a:1"}
	f := &follower{t: Target{Hubs: []string{"a:1", "b:1"}}, cc: d}
	f.term, f.endTerm = context.WithCancelCause(context.Background())
	for i := uint64(0); i < 50; i++ {
		older, newer := Primary{Addr: "a:1", Epoch: 2*i + 1}, Primary{Addr: "b:1", Epoch: 2*i + 2}
		var wg sync.WaitGroup
		wg.Go(func() { f.offer(older) })
		for f.current() != older { // taken: gRPC is being told of it
			runtime.Gosched()
		}
		f.offer(newer)
		wg.Wait()
		d.mu.Lock()
		got := d.addr
		d.mu.Unlock()
		if cur := f.current(); cur != newer || got != newer.Addr {
			t.Fatalf("iteration %d: following %v, gRPC given %s; want %v for both", i, cur, got, newer)
		}
	}
}

// pushHub names itself primary and takes store pushes (a client stream)
// and store pulls (a server stream).
type pushHub struct {
	rlhubv1.UnimplementedClusterServer
	rlhubv1.UnimplementedModelStoreServer
	self string
}

func (h *pushHub) Primary(context.Context, *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	return &rlhubv1.PrimaryResponse{Address: h.self, Epoch: 1, Self: true}, nil
}

func (h *pushHub) List(context.Context, *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	return &rlhubv1.StoreListResponse{}, nil
}

func (h *pushHub) Push(s grpc.ClientStreamingServer[rlhubv1.StorePushRequest, rlhubv1.StorePushResponse]) error {
	for {
		if _, err := s.Recv(); err == io.EOF {
			return s.SendAndClose(&rlhubv1.StorePushResponse{})
		} else if err != nil {
			return err
		}
	}
}

// Every call and stream holds the followed primary's term (so that a move
// ends it) until it ends, and no longer: a client stream that got its one
// reply (CloseAndRecv, which ends without an error: store pushes, the
// reducer's gradient pushes and forwards, the aggregator's Learn) and a
// stream given up by cancelling its context release theirs. Holds left
// behind would pile up for as long as the primary does not move, each
// keeping its call's context, and the move would then start a goroutine
// for every one.
func TestStreamsReleaseTheirHoldOnTheTerm(t *testing.T) {
	h := &pushHub{}
	lis := testkit.Listen(t)
	h.self = lis.Addr().String()
	testkit.ServeGRPC(t, lis, func(g *grpc.Server) {
		rlhubv1.RegisterClusterServer(g, h)
		rlhubv1.RegisterModelStoreServer(g, h)
	})
	conn, err := Config{}.GRPC(h.self + "," + h.self)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := followerOf(conn)
	store := rlhubv1.NewModelStoreClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 20 {
		if _, err := store.List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.held.Load(); n != 0 {
		t.Fatalf("after 20 unary calls, %d holds on the term", n)
	}
	const pushes = 100
	for range pushes {
		s, err := store.Push(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&rlhubv1.StorePushRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.held.Load(); n != 0 {
		t.Fatalf("after %d pushes, each answered, %d holds on the term; want 0", pushes, n)
	}
	// A stream given up: its context cancelled, nothing received.
	sctx, scancel := context.WithCancel(ctx)
	s, err := store.Push(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&rlhubv1.StorePushRequest{}); err != nil {
		t.Fatal(err)
	}
	scancel()
	testkit.Eventually(t, 5*time.Second, "the abandoned push's hold released", func() bool { return f.held.Load() == 0 })
}
