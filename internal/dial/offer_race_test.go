package dial_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// answeringStore is a primary's store: it answers every List.
type answeringStore struct {
	rlhubv1.UnimplementedModelStoreServer
	calls atomic.Int64
}

func (s *answeringStore) List(context.Context, *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	s.calls.Add(1)
	return &rlhubv1.StoreListResponse{}, nil
}

// Two primaries offered at once — the election watch, the loop's lookup, a
// refusal's hint and a data-plane refusal each offer on their own
// goroutine — end on the newer one, both as the primary followed
// (CurrentPrimary) and as the address gRPC dials. Were the two set apart,
// the older offer's address could reach gRPC last: the connection would
// dial the deposed primary, whose refusals name the one already followed
// and so change nothing, and every call would be refused until another
// election.
func TestConcurrentOffersEndOnTheNewestPrimary(t *testing.T) {
	b := &answeringStore{}
	bAddr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterModelStoreServer(g, b) })
	a := startStandby(t, bAddr, 0) // the deposed primary: refuses, naming b
	conn, err := dial.Config{}.GRPC(a.self + "," + bAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	store := rlhubv1.NewModelStoreClient(conn)
	for i := uint64(0); i < 3000; i++ {
		older := dial.Primary{Addr: a.self, Epoch: 2*i + 1}
		newer := dial.Primary{Addr: bAddr, Epoch: 2*i + 2}
		a.epoch.Store(newer.Epoch)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; dial.Offer(conn, older) })
		wg.Go(func() { <-start; dial.Offer(conn, newer) })
		close(start)
		wg.Wait()
		if p, _ := dial.CurrentPrimary(conn); p != newer {
			t.Fatalf("iteration %d: following %v, want the newest %v", i, p, newer)
		}
		before := a.calls.Load()
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := store.List(c, &rlhubv1.StoreListRequest{})
		cancel()
		if err != nil {
			t.Fatalf("iteration %d: following %v, yet List went to the deposed %s (%d refusals) and failed: %v",
				i, newer, a.self, a.calls.Load()-before, err)
		}
	}
}
