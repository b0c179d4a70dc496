package storebench

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
)

// transportVariant is one set of gRPC transport options tried on both ends
// of a pull, with the chunk size the service sends.
type transportVariant struct {
	name   string
	server []grpc.ServerOption
	dial   []grpc.DialOption
	chunk  int // 0: wire.DefaultChunkBytes
}

var transportVariants = []transportVariant{
	{name: "defaults"},
	{name: "buf256k",
		server: []grpc.ServerOption{grpc.WriteBufferSize(256 << 10), grpc.ReadBufferSize(256 << 10)},
		dial:   []grpc.DialOption{grpc.WithWriteBufferSize(256 << 10), grpc.WithReadBufferSize(256 << 10)}},
	{name: "buf1m",
		server: []grpc.ServerOption{grpc.WriteBufferSize(1 << 20), grpc.ReadBufferSize(1 << 20)},
		dial:   []grpc.DialOption{grpc.WithWriteBufferSize(1 << 20), grpc.WithReadBufferSize(1 << 20)}},
	{name: "unbufread",
		server: []grpc.ServerOption{grpc.ReadBufferSize(0)},
		dial:   []grpc.DialOption{grpc.WithReadBufferSize(0)}},
	{name: "sharedwrite",
		server: []grpc.ServerOption{grpc.SharedWriteBuffer(true)},
		dial:   []grpc.DialOption{grpc.WithSharedWriteBuffer(true)}},
	{name: "win16m",
		server: []grpc.ServerOption{grpc.InitialWindowSize(16 << 20), grpc.InitialConnWindowSize(16 << 20)},
		dial:   []grpc.DialOption{grpc.WithInitialWindowSize(16 << 20), grpc.WithInitialConnWindowSize(16 << 20)}},
	{name: "chunk4m", chunk: 4 << 20},
	{name: "dirtypool", server: chunkcodec.ServerOptions(), dial: chunkcodec.DialOptions()},
}

// BenchmarkPullOptions pulls a 64 MiB model with each transportVariant, one
// server and client per variant, all in one process; every iteration pulls
// once through each variant, in an order that rotates between iterations,
// so all variants see the same load. Reported per variant: the median
// over iterations of process CPU per GB (<variant>_cpu-s/GB, both ends;
// the figure to decide on when the machine is shared) and of the pull's
// rate (<variant>_MB/s). ns/op covers all variants. The hub uses the
// defaults (docs/benchlog/2026-11-30-sessions-1-4.md, model store, has the figures).
//
//	GOEXPERIMENT=simd go test -run '^$' -bench PullOptions -benchtime 30x ./internal/store/storebench/
func BenchmarkPullOptions(b *testing.B) {
	blob := model(b, 64<<20)
	quiet := testkit.Logger()
	limit := 64 << 20
	pulls := make([]func() error, len(transportVariants))
	for i, v := range transportVariants {
		st, err := store.NewMemory(store.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
			b.Fatal(err)
		}
		svc, err := storerpc.New(storerpc.Config{Store: st, ChunkBytes: v.chunk, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		// Stopped at b's cleanup.
		addr := testkit.ServeGRPC(b, nil, svc.Register, append([]grpc.ServerOption{grpc.MaxRecvMsgSize(limit), grpc.MaxSendMsgSize(limit)}, v.server...)...)
		cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit), grpc.MaxCallSendMsgSize(limit)),
		}, v.dial...)...)
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		c, err := storerpc.NewClient(storerpc.ClientConfig{Conn: cc, ChunkBytes: v.chunk})
		if err != nil {
			b.Fatal(err)
		}
		pulls[i] = func() error {
			snap, err := c.Get(context.Background(), "m", 0)
			if err == nil && len(snap.Blob) != len(blob) {
				b.Fatalf("%s: pulled %d bytes, want %d", v.name, len(snap.Blob), len(blob))
			}
			return err
		}
	}
	for i, pull := range pulls { // warm connections, windows and pools
		if err := pull(); err != nil {
			b.Fatalf("%s: %v", transportVariants[i].name, err)
		}
	}
	cpu := make([][]float64, len(pulls))
	wall := make([][]float64, len(pulls))
	b.ResetTimer()
	for it := range b.N {
		for k := range pulls {
			i := (it + k) % len(pulls)
			c0, t0 := cpuTime(), time.Now()
			if err := pulls[i](); err != nil {
				b.Fatalf("%s: %v", transportVariants[i].name, err)
			}
			wall[i] = append(wall[i], time.Since(t0).Seconds())
			cpu[i] = append(cpu[i], (cpuTime() - c0).Seconds())
		}
	}
	b.StopTimer()
	gb := float64(len(blob)) / 1e9
	for i, v := range transportVariants {
		name := strings.ReplaceAll(v.name, " ", "_")
		b.ReportMetric(median(cpu[i])/gb, name+"_cpu-s/GB")
		b.ReportMetric(gb*1e3/median(wall[i]), name+"_MB/s")
	}
}
