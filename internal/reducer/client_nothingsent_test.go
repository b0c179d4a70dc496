package reducer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/bulk/bulktest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// movingCluster is two hubs. The primary is hub 0 (epoch 1), which lists
// one secondary at bad, until hub 0 is asked for the secondaries again:
// it then refuses as a standby naming hub 1 (epoch 2), which lists its
// own secondary and takes pushes.
type movingCluster struct {
	addrs  [2]string
	bad    string
	moved  atomic.Bool
	lists  atomic.Int64 // hub 0's listings
	pushes [2]atomic.Int64
}

type movingHub struct {
	rlhubv1.UnimplementedReducerServer
	rlhubv1.UnimplementedClusterServer
	m *movingCluster
	i int
}

func (h *movingHub) Primary(context.Context, *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	if h.m.moved.Load() {
		return &rlhubv1.PrimaryResponse{Address: h.m.addrs[1], Epoch: 2}, nil
	}
	return &rlhubv1.PrimaryResponse{Address: h.m.addrs[0], Epoch: 1}, nil
}

func (h *movingHub) Secondaries(ctx context.Context, _ *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	if h.i == 1 {
		return &rlhubv1.ReducerSecondariesResponse{Secondaries: []*rlhubv1.ReducerSecondary{{Addr: "", Id: "s1"}}}, nil
	}
	if h.m.lists.Add(1) == 1 {
		return &rlhubv1.ReducerSecondariesResponse{Secondaries: []*rlhubv1.ReducerSecondary{{Addr: h.m.bad, Id: "s0"}}}, nil
	}
	h.m.moved.Store(true)
	return nil, cluster.Refuse(ctx, &cluster.Refusal{Primary: h.m.addrs[1], Epoch: 2})
}

func (h *movingHub) Push(s grpc.ClientStreamingServer[rlhubv1.ReducerPushRequest, rlhubv1.ReducerPushResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	h.m.pushes[h.i].Add(1)
	return s.SendAndClose(&rlhubv1.ReducerPushResponse{Version: 1, Weight: 1})
}

// A push whose attempt failed before any of it was sent — the secondary's
// address refused the connect, or read the data-plane hello and reset or
// closed the connection (closed: the data plane says "not supported" and
// the gRPC stream then does not open) — was not applied: when the primary
// changes before the next attempt, the push goes on to the new primary's
// secondary instead of failing ErrOutcomeUnknown and being counted lost
// (only a connect or handshake with no answer counted as unsent before).
func TestNothingSentAttemptIsNotOutcomeUnknown(t *testing.T) {
	refused := testkit.Listen(t)
	refusedAddr := refused.Addr().String()
	refused.Close()
	for _, sec := range []struct{ name, addr string }{
		{"connect refused", refusedAddr},
		{"hello reset", bulktest.HangUp(t, false, true)},
		{"hello closed", bulktest.HangUp(t, false, false)},
	} {
		t.Run(sec.name, func(t *testing.T) {
			m := &movingCluster{bad: sec.addr}
			for i := range 2 {
				lis := testkit.Listen(t)
				m.addrs[i] = lis.Addr().String()
				h := &movingHub{m: m, i: i}
				testkit.ServeGRPC(t, lis, func(g *grpc.Server) {
					rlhubv1.RegisterReducerServer(g, h)
					rlhubv1.RegisterClusterServer(g, h)
				})
			}
			c, err := NewClient(ClientConfig{Hub: m.addrs[0] + "," + m.addrs[1], RefreshEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := c.PushGrad(ctx, "m", 1, testLayout(4))
			if err != nil || c.Unknown() != 0 || r.Addr != m.addrs[1] {
				t.Fatalf("push: %v to %s (Unknown=%d), want it taken by hub 1 %s", err, r.Addr, c.Unknown(), m.addrs[1])
			}
			if m.lists.Load() < 2 || m.pushes[0].Load() != 0 || m.pushes[1].Load() != 1 {
				t.Fatalf("hub 0 listed %d times and took %d pushes, hub 1 took %d: the push did not go through the primary change",
					m.lists.Load(), m.pushes[0].Load(), m.pushes[1].Load())
			}
		})
	}
}

// secondariesHub is a primary hub that lists what list returns.
type secondariesHub struct {
	rlhubv1.UnimplementedReducerServer
	list func() []*rlhubv1.ReducerSecondary
}

func (h *secondariesHub) Secondaries(context.Context, *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	return &rlhubv1.ReducerSecondariesResponse{Secondaries: h.list()}, nil
}

// takingHub takes every push (its own secondary, over gRPC).
type takingHub struct {
	rlhubv1.UnimplementedReducerServer
	pushes atomic.Int64
}

func (h *takingHub) Push(s grpc.ClientStreamingServer[rlhubv1.ReducerPushRequest, rlhubv1.ReducerPushResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	h.pushes.Add(1)
	return s.SendAndClose(&rlhubv1.ReducerPushResponse{Version: 1, Weight: 1})
}

// A secondary silent in the data-plane handshake twice in one push is not
// chosen again in that push, but the push goes on with another listed
// secondary (as the Python client's): it lands there, having dialled the
// silent one exactly twice, rather than ending Unavailable "not tried
// again" while a secondary that answers is listed. With only the silent
// one listed it ends so (TestSilentSecondaryIsTriedTwicePerPush).
func TestSilentSecondaryIsSkippedForAnotherListed(t *testing.T) {
	sec, accepted := testkit.SilentHubCounting(t, testkit.Silent)
	taker := &takingHub{}
	other := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterReducerServer(g, taker) })
	// The other secondary is listed once the silent one got its second
	// connection (before, a push would go there after the first no-answer,
	// the silent one being marked dead).
	primary := testkit.ServeGRPC(t, nil, func(g *grpc.Server) {
		rlhubv1.RegisterReducerServer(g, &secondariesHub{list: func() []*rlhubv1.ReducerSecondary {
			l := []*rlhubv1.ReducerSecondary{{Addr: sec, Id: "s0"}}
			if accepted() >= 2 {
				l = append(l, &rlhubv1.ReducerSecondary{Addr: other, Id: "s1"})
			}
			return l
		}})
	})
	c, err := NewClient(ClientConfig{Hub: primary, CallTimeout: 10 * time.Second, RefreshEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.bulk.Close()
	c.bulk = bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 300 * time.Millisecond})
	r, err := c.PushGrad(context.Background(), "m", 1, testLayout(4))
	if err != nil || r.Addr != other || taker.pushes.Load() != 1 {
		t.Fatalf("push with a silent and an answering secondary listed: %v to %s (%d taken), want it taken by %s",
			err, r.Addr, taker.pushes.Load(), other)
	}
	if n := accepted(); n != 2 {
		t.Errorf("the silent secondary was connected to %d times, want 2", n)
	}
}
