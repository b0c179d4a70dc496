package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// The two costs metrics add, measured apart from any load on the machine:
// one scrape of a busy hub's /metrics (paid once per scrape interval), and
// the gRPC interceptors on one RPC and one stream message (paid per call).
// docs/benchlog/2026-12-01-obs.md turns them into a fraction of the work.

// BenchmarkScrape: GET /metrics over HTTP with 4 models, 50 collectors, 50
// learners and the Go runtime's families.
func BenchmarkScrape(b *testing.B) {
	ms := wsync.ModelStatus{Model: "m", Newest: 100, Histogram: make([]wsync.LagBucket, len(wsync.LagBuckets))}
	var ls []aggregator.LearnerStats
	for i := range 50 {
		ms.Collectors = append(ms.Collectors, wsync.CollectorLag{ID: fmt.Sprintf("c%02d", i), Model: "m", Version: uint64(50 + i), Lag: uint64(49 - i)})
		ls = append(ls, aggregator.LearnerStats{ID: fmt.Sprintf("l%02d", i), TasksDone: 3})
	}
	var models []store.ModelStats
	for i := range 4 {
		models = append(models, store.ModelStats{Name: fmt.Sprintf("model%d", i), Version: 9, Bytes: 1 << 20})
	}
	src := Sources{
		Reducer:        func() reducer.Stats { return reducer.Stats{} },
		ReducerLatency: func() reducer.LatencyHistogram { return reducer.LatencyHistogram{} },
		Store:          func() store.Stats { return store.Stats{Models: models} },
		Sync:           func(context.Context) wsync.Stats { return wsync.Stats{Models: []wsync.ModelStatus{ms}} },
		Aggregator:     func() aggregator.Stats { return aggregator.Stats{Learners: ls} },
	}
	s, err := New(Config{Listen: "127.0.0.1:0", Sources: src, GRPC: NewGRPCServerMetrics(), Logger: testkit.Logger()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	url := "http://" + s.Addr() + "/metrics"
	var bytes int64
	for b.Loop() {
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		bytes = n
	}
	b.ReportMetric(float64(bytes), "body-bytes")
}

type nopStream struct{ ctx context.Context }

func (s nopStream) SetHeader(metadata.MD) error  { return nil }
func (s nopStream) SendHeader(metadata.MD) error { return nil }
func (s nopStream) SetTrailer(metadata.MD)       {}
func (s nopStream) Context() context.Context     { return s.ctx }
func (s nopStream) SendMsg(any) error            { return nil }
func (s nopStream) RecvMsg(any) error            { return nil }

// BenchmarkGRPCInterceptor: the server metrics' cost per unary RPC and per
// message of a server stream (a handler doing nothing else).
func BenchmarkGRPCInterceptor(b *testing.B) {
	g := NewGRPCServerMetrics()
	ctx := context.Background()
	b.Run("unary", func(b *testing.B) {
		in := g.m.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/rlhub.v1.ModelStore/List"}
		h := func(context.Context, any) (any, error) { return nil, nil }
		for b.Loop() {
			in(ctx, nil, info, h)
		}
	})
	b.Run("stream-msg", func(b *testing.B) {
		in := g.m.StreamServerInterceptor()
		info := &grpc.StreamServerInfo{FullMethod: "/rlhub.v1.ModelStore/Pull", IsServerStream: true}
		in(nil, nopStream{ctx}, info, func(_ any, ss grpc.ServerStream) error {
			for b.Loop() {
				ss.SendMsg(nil)
			}
			return nil
		})
	})
}
