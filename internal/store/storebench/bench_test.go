package storebench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storeclient"
	"github.com/rlhub/rlhub/internal/tensor"
)

// model returns a safetensors blob of about size bytes (one F32 tensor).
func model(b testing.TB, size int) []byte {
	t := tensor.NewF32("w", int64(size/4))
	f, _ := t.Float32s()
	for i := range f {
		f[i] = float32(i)
	}
	sd, _ := tensor.NewStateDict(t)
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		b.Fatal(err)
	}
	return blob
}

// tcpSource serves blob to every connection, as fast as the kernel takes it.
type tcpSource struct {
	lis net.Listener
	wg  sync.WaitGroup
}

func newTCPSource(b testing.TB, blob []byte) *tcpSource {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &tcpSource{lis: lis}
	s.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer c.Close()
				c.Write(blob)
			})
		}
	})
	return s
}

func (s *tcpSource) close() { s.lis.Close(); s.wg.Wait() }

// tcpCopy has readers connections each read the whole blob into its own
// preallocated buffer; it returns each reader's duration.
func tcpCopy(b testing.TB, addr string, bufs [][]byte) []time.Duration {
	out := make([]time.Duration, len(bufs))
	var wg sync.WaitGroup
	for i := range bufs {
		wg.Go(func() {
			start := time.Now()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			if _, err := io.ReadFull(c, bufs[i]); err != nil {
				b.Error(err)
			}
			out[i] = time.Since(start)
		})
	}
	wg.Wait()
	return out
}

// pullAll has every client pull the newest "m" concurrently; it returns
// each reader's duration.
func pullAll(b testing.TB, clients []*storeclient.Client, size int) []time.Duration {
	out := make([]time.Duration, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			snap, err := c.Get(ctx, "m", 0)
			if err != nil {
				b.Error(err)
				return
			}
			out[i] = time.Since(start)
			if len(snap.Blob) != size {
				b.Errorf("pulled %d bytes, want %d", len(snap.Blob), size)
			}
		})
	}
	wg.Wait()
	return out
}

// cpuTime is the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxDur(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// BenchmarkPull pulls a model through the real hub to 1 and 4 concurrent
// readers, each with its own connection, and in every iteration first
// copies the same bytes over plain TCP to the same number of readers (timer
// stopped). Reported: MB/s (aggregate, from SetBytes), tcp_MB/s,
// ratio_vs_tcp (aggregate gRPC rate / aggregate TCP rate),
// slowest_reader_MB/s, cpu-s/GB and tcp_cpu-s/GB (process CPU per GB
// moved, both ends included), and for 4 readers slowest_vs_single (the slowest
// reader's rate over a lone reader's rate measured in the same iteration).
// "codec=stock" runs one reader with gRPC's stock proto codec (as the
// Python client does) to show what chunkcodec saves.
func BenchmarkPull(b *testing.B) {
	for _, size := range []int{16 << 20, 256 << 20} {
		blob := model(b, size)
		for _, tc := range []struct {
			readers int
			stock   bool
		}{{1, false}, {4, false}, {1, true}} {
			codec := "blob"
			if tc.stock {
				codec = "stock"
			}
			b.Run(fmt.Sprintf("size=%dMiB/readers=%d/codec=%s", size>>20, tc.readers, codec), func(b *testing.B) {
				benchPull(b, blob, tc.readers, tc.stock)
			})
		}
	}
}

func benchPull(b *testing.B, blob []byte, readers int, stock bool) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: blob}); err != nil {
		b.Fatal(err)
	}
	var clients []*storeclient.Client
	for range readers + 1 { // the extra one measures a lone reader
		c, err := storeclient.New(storeclient.Config{Addr: h.Addr().String(), StockCodec: stock})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	lone, clients := clients[:1], clients[1:]
	src := newTCPSource(b, blob)
	defer src.close()
	bufs := make([][]byte, readers)
	for i := range bufs {
		bufs[i] = make([]byte, len(blob))
	}
	pullAll(b, clients, len(blob)) // warm connections and windows
	pullAll(b, lone, len(blob))
	tcpCopy(b, src.lis.Addr().String(), bufs)

	var tcpTotal, slowest, loneTotal, tcpCPU, grpcCPU time.Duration
	b.SetBytes(int64(len(blob) * readers))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		c0 := cpuTime()
		tcpTotal += maxDur(tcpCopy(b, src.lis.Addr().String(), bufs))
		tcpCPU += cpuTime() - c0
		if readers > 1 {
			loneTotal += pullAll(b, lone, len(blob))[0]
		}
		b.StartTimer()
		c0 = cpuTime()
		slowest += maxDur(pullAll(b, clients, len(blob)))
		grpcCPU += cpuTime() - c0
	}
	b.StopTimer()
	mb := float64(len(blob)) * float64(b.N) / 1e6
	gb := mb * float64(readers) / 1e3
	// CPU per GB moved (both ends are in this process) is the figure least
	// disturbed by other load on the shared machine.
	b.ReportMetric(grpcCPU.Seconds()/gb, "cpu-s/GB")
	b.ReportMetric(tcpCPU.Seconds()/gb, "tcp_cpu-s/GB")
	b.ReportMetric(mb*float64(readers)/tcpTotal.Seconds(), "tcp_MB/s")
	b.ReportMetric(tcpTotal.Seconds()/slowest.Seconds(), "ratio_vs_tcp")
	b.ReportMetric(mb/slowest.Seconds(), "slowest_reader_MB/s")
	if readers > 1 {
		b.ReportMetric(loneTotal.Seconds()/slowest.Seconds(), "slowest_vs_single")
	}
}
