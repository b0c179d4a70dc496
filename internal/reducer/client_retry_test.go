package reducer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// unavailableHub lists its own secondary and answers every push with
// UNAVAILABLE at once ("secondary is not attached to a primary").
type unavailableHub struct {
	rlhubv1.UnimplementedReducerServer
	pushes, lists atomic.Int64
}

func (h *unavailableHub) Secondaries(context.Context, *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	h.lists.Add(1)
	return &rlhubv1.ReducerSecondariesResponse{Secondaries: []*rlhubv1.ReducerSecondary{{Addr: "", Id: "s0"}}}, nil
}

func (h *unavailableHub) Push(s grpc.ClientStreamingServer[rlhubv1.ReducerPushRequest, rlhubv1.ReducerPushResponse]) error {
	h.pushes.Add(1)
	return status.Error(codes.Unavailable, "secondary \"s0\" is not attached to a primary")
}

// A push whose every secondary answers UNAVAILABLE at once (its secondary
// not attached to a primary, a primary restarting) retries with its
// backoff until its context ends, instead of spinning against the hub
// (about 3000 pushes and 6000 listings in half a second before).
func TestPushBacksOffWhenEverySecondaryIsUnavailable(t *testing.T) {
	h := &unavailableHub{}
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterReducerServer(g, h) })

	c, err := NewClient(ClientConfig{Hub: addr, Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.PushGrad(ctx, "m", 1, testLayout(4)); err == nil {
		t.Fatal("a push to a secondary that is never available succeeded")
	}
	// Backoff defaults to 1ms doubling to 100ms: over 500ms a backed-off
	// client tries some ten times.
	if p, l := h.pushes.Load(), h.lists.Load(); p > 50 {
		t.Fatalf("%d pushes and %d listings in 500ms against a secondary answering UNAVAILABLE: no backoff", p, l)
	}
}

// clusterHub is a primary hub of a two-hub cluster (epoch 7, never
// changing) hosting its own secondary; its first push ends UNAVAILABLE
// after the gradient was received (outcome unknown), later ones succeed.
type clusterHub struct {
	rlhubv1.UnimplementedReducerServer
	rlhubv1.UnimplementedClusterServer
	addr   string
	pushes atomic.Int64
}

func (h *clusterHub) Primary(context.Context, *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	return &rlhubv1.PrimaryResponse{Address: h.addr, Epoch: 7}, nil
}

func (h *clusterHub) Secondaries(context.Context, *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	return &rlhubv1.ReducerSecondariesResponse{Secondaries: []*rlhubv1.ReducerSecondary{{Addr: "", Id: "s0"}}}, nil
}

func (h *clusterHub) Push(s grpc.ClientStreamingServer[rlhubv1.ReducerPushRequest, rlhubv1.ReducerPushResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	if h.pushes.Add(1) == 1 {
		return status.Error(codes.Unavailable, "connection reset (simulated)")
	}
	return s.SendAndClose(&rlhubv1.ReducerPushResponse{Version: 1, Weight: 1})
}

// A fresh client on a cluster target whose first attempt ends UNAVAILABLE
// after sending retries on the same primary (epoch 7 throughout), which
// deduplicates by (client, seq): it is not declared ErrOutcomeUnknown and
// counted lost because the epoch was read before the client knew the
// primary.
func TestUnavailableAttemptOnTheSamePrimaryIsRetried(t *testing.T) {
	var hubs []*clusterHub
	var addrs []string
	for range 2 {
		lis := testkit.Listen(t)
		addrs = append(addrs, lis.Addr().String())
		h := &clusterHub{}
		testkit.ServeGRPC(t, lis, func(g *grpc.Server) {
			rlhubv1.RegisterReducerServer(g, h)
			rlhubv1.RegisterClusterServer(g, h)
		})
		hubs = append(hubs, h)
	}
	for _, h := range hubs {
		h.addr = addrs[0]
	}
	c, err := NewClient(ClientConfig{Hub: addrs[0] + "," + addrs[1], Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.PushGrad(ctx, "m", 1, testLayout(4)); err != nil || c.Unknown() != 0 {
		t.Fatalf("push: %v (Unknown=%d, primary epoch 7 throughout)", err, c.Unknown())
	}
}
