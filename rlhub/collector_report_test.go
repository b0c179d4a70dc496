package rlhub_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
	"github.com/rlhub/rlhub/rlhub"
)

// A ViaStore collector's version report does not hold up Poll: against a
// hub that serves pulls but stalls Report, Poll applies the version and
// returns within its ctx, and Close ends the stalled report.
func TestCollectorViaStorePollDoesNotWaitForReport(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ss, err := storerpc.New(storerpc.Config{Store: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	stall := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == rlhubv1.WeightSync_Report_FullMethodName {
			<-ctx.Done() // accepted, never answered
			return nil, ctx.Err()
		}
		return h(ctx, req)
	})
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { ss.Register(g); ws.Register(g) }, stall)
	t.Cleanup(func() { ss.Drain(); ws.Drain(); ws.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaStore, Weights: weights(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	start := time.Now()
	ok, err := c.Poll(pctx)
	if took := time.Since(start); !ok || err != nil || took > 3*time.Second {
		t.Fatalf("Poll: (%v, %v) after %v, want v1 applied within its 1 s ctx", ok, err, took.Round(time.Millisecond))
	}
	start = time.Now()
	c.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Close took %v with a report stalled", took.Round(time.Millisecond))
	}
}

// A ViaStore collector's Poll reports the version it applied: the hub's
// status shows the collector at it.
func TestCollectorViaStoreReportsAppliedVersion(t *testing.T) {
	addr := dataPlaneHub(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaStore, CollectorID: "go-pull"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for v := uint64(1); v <= 2; v++ {
		if _, err := s.Push(ctx, "policy", v, v-1, weights(float32(v))); err != nil {
			t.Fatal(err)
		}
		if ok, err := c.Poll(ctx); !ok || err != nil {
			t.Fatalf("Poll at v%d: (%v, %v)", v, ok, err)
		}
		testkit.Eventually(t, 20*time.Second, "the hub to see the collector's report", func() bool {
			ms, err := wsync.Status(ctx, conn, "policy")
			return err == nil && len(ms) == 1 && len(ms[0].Collectors) == 1 &&
				ms[0].Collectors[0].ID == "go-pull" && ms[0].Collectors[0].Version == v
		})
	}
}
