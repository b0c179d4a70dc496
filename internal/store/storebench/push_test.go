package storebench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkPush pushes consecutive versions of a model through the real
// hub over loopback, on the data plane (the client's default) and over
// gRPC (ClientConfig.Transport "grpc"), into the in-memory store and into
// the file-backed one (each version fsynced and committed before the push
// returns). Baselines in the same iterations (timer stopped): a plain TCP
// copy of the same bytes (tcp_MB/s, ratio_vs_tcp) and, for the file store,
// writing the bytes to a file with fsync (fsync_MB/s, ratio_vs_fsync).
func BenchmarkPush(b *testing.B) {
	for _, size := range []int{16 << 20, 256 << 20} {
		blob := model(b, size)
		for _, kind := range []string{"memory", "file"} {
			for _, transport := range []string{"dataplane", "grpc"} {
				b.Run(fmt.Sprintf("size=%dMiB/store=%s/transport=%s", size>>20, kind, transport), func(b *testing.B) {
					benchPush(b, blob, kind == "file", transport)
				})
			}
		}
	}
}

func benchPush(b *testing.B, blob []byte, file bool, transport string) {
	cfg := hub.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Store: store.Config{Retain: 1}}
	dir := b.TempDir()
	if file {
		cfg.DataDir = dir
	}
	h, err := hub.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(); err != nil {
		b.Fatal(err)
	}
	ccfg := storerpc.ClientConfig{Addr: h.Addr().String()}
	if transport == "grpc" {
		ccfg.Transport = "grpc"
	}
	c, err := storerpc.NewClient(ccfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	src := newTCPSource(b, blob)
	defer src.close()
	bufs := [][]byte{make([]byte, len(blob))}
	ctx := context.Background()
	push := func(v uint64) time.Duration {
		start := time.Now()
		if _, err := c.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	push(1) // warm up
	var tcpTotal, fsyncTotal, pushTotal time.Duration
	b.SetBytes(int64(len(blob)))
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		tcpTotal += tcpCopy(b, src.lis.Addr().String(), len(blob), bufs)[0]
		if file {
			fsyncTotal += writeSync(b, filepath.Join(dir, "baseline"), blob)
		}
		b.StartTimer()
		pushTotal += push(uint64(i) + 2)
	}
	b.StopTimer()
	mb := float64(len(blob)) * float64(b.N) / 1e6
	b.ReportMetric(mb/tcpTotal.Seconds(), "tcp_MB/s")
	b.ReportMetric(tcpTotal.Seconds()/pushTotal.Seconds(), "ratio_vs_tcp")
	if file {
		b.ReportMetric(mb/fsyncTotal.Seconds(), "fsync_MB/s")
		b.ReportMetric(fsyncTotal.Seconds()/pushTotal.Seconds(), "ratio_vs_fsync")
	}
}

// writeSync writes blob to path and fsyncs it, returning the time taken.
func writeSync(b *testing.B, path string, blob []byte) time.Duration {
	start := time.Now()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.Write(blob); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	return time.Since(start)
}
