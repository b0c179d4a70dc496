package storebench

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
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

// sockBuf is the socket buffer the TCP baseline asks for on both ends
// (the kernel caps it at net.core.[rw]mem_max): a large buffer is what a
// well-written bulk copy uses.
const sockBuf = 4 << 20

// tcpSource serves blob to every connection, as fast as the kernel takes it.
type tcpSource struct {
	lis net.Listener
	wg  sync.WaitGroup
}

func newTCPSource(b testing.TB, blob []byte) *tcpSource {
	lis := testkit.Listen(b)
	s := &tcpSource{lis: lis}
	s.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer c.Close()
				c.(*net.TCPConn).SetWriteBuffer(sockBuf)
				c.Write(blob)
			})
		}
	})
	return s
}

func (s *tcpSource) close() { s.lis.Close(); s.wg.Wait() }

// tcpCopy has len(bufs) connections each read the whole blob (size bytes)
// into a buffer; it returns each reader's duration. A nil bufs[i] means
// reader i allocates a fresh 8-byte-aligned buffer (tensor.AlignedBytes,
// as wire.Assembler does for a pull) inside its timed span; otherwise it
// reads into bufs[i], which must be size bytes.
func tcpCopy(b testing.TB, addr string, size int, bufs [][]byte) []time.Duration {
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
			c.(*net.TCPConn).SetReadBuffer(sockBuf)
			dst := bufs[i]
			if dst == nil {
				dst = tensor.AlignedBytes(size)
			}
			if _, err := io.ReadFull(c, dst); err != nil {
				b.Error(err)
			}
			out[i] = time.Since(start)
		})
	}
	wg.Wait()
	return out
}

// pullAll has every client pull the newest "m" concurrently; it returns
// each reader's duration. With bufs nil each pull returns a fresh blob
// (Get); otherwise client i pulls into bufs[i] (GetInto) and bufs[i]
// becomes the blob it pulled, so from the second pull on every reader
// receives into the memory of its previous pull.
func pullAll(b testing.TB, clients []*storerpc.Client, size int, bufs [][]byte) []time.Duration {
	out := make([]time.Duration, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			var snap *store.Snapshot
			var err error
			if bufs == nil {
				snap, err = c.Get(ctx, "m", 0)
			} else {
				snap, err = c.GetInto(ctx, "m", 0, bufs[i])
			}
			if err != nil {
				b.Error(err)
				return
			}
			out[i] = time.Since(start)
			if len(snap.Blob) != size {
				b.Errorf("pulled %d bytes, want %d", len(snap.Blob), size)
			}
			if bufs != nil {
				if cap(bufs[i]) >= size && &snap.Blob[0] != &bufs[i][:1][0] {
					b.Errorf("reader %d: the pull did not reuse its buffer", i)
				}
				bufs[i] = snap.Blob
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

// median of xs (the mean of the middle two for an even count); xs is
// sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// BenchmarkPull pulls a model through the real hub to 1 and 4 concurrent
// readers, each with its own connection, and compares it with a plain TCP
// copy of the same bytes to the same number of readers, measured in the
// same iteration.
//
// Both sides do the same thing with the bytes: a pull returns a new
// snapshot that the caller owns, so its blob is freshly allocated
// (wire.Assembler); the TCP baseline likewise reads each copy into a
// freshly allocated aligned buffer (tcp_*). A second baseline reads into
// buffers allocated once and reused (tcp_warm_*): the stricter reference,
// free of the allocation, zeroing and page faults that a pull returning a
// new snapshot must pay. The TCP copies use 4 MiB socket buffers and one
// write of the whole blob.
//
// Every iteration runs the gRPC pull and both TCP copies back to back, in
// an order that rotates from one iteration to the next, and takes the
// ratio of each pair: neighbours in time see the same load on a shared
// machine. (No runtime.GC() between transfers: it would empty grpc-go's
// buffer pools, which are sync.Pools, and charge their refill to every
// pull.) Reported: MB/s (aggregate gRPC rate, from SetBytes),
// tcp_MB/s, tcp_warm_MB/s, ratio_vs_tcp (median over iterations of
// TCP time / gRPC time, the slowest reader on each side) with
// ratio_min/ratio_max, ratio_vs_tcp_warm (median), slowest_reader_MB/s,
// cpu-s/GB and tcp_cpu-s/GB (process CPU, both ends, per GB delivered),
// and for 4 readers slowest_vs_single (median over iterations of the
// slowest reader's rate over a lone reader's rate pulled in the same
// iteration; the issue asks ≥ 1/4). "codec=stock" runs one reader with
// gRPC's stock proto codec (as the Python client does) to show what
// chunkcodec saves.
//
// "readers=1/dst=reused/codec=blob" pulls with GetInto into the blob
// of its previous pull, as a collector that reuses the memory of a version
// it has finished with: no allocation, zeroing or page faults on either
// side, so its figure is ratio_vs_tcp_warm (warm against warm), and it
// also reports that ratio's spread (warm_ratio_min, warm_ratio_max) and
// tcp_warm_cpu-s/GB. The cells without dst pull into fresh memory.
//
//	GOEXPERIMENT=simd go test -run '^$' -bench 'Pull/size=(16|256)MiB/readers=./codec=blob' -benchtime 10x ./internal/store/storebench/
//	GOEXPERIMENT=simd go test -run '^$' -bench 'Pull/size=(16|256)MiB/readers=1' -benchtime 10x ./internal/store/storebench/
func BenchmarkPull(b *testing.B) {
	for _, size := range []int{16 << 20, 256 << 20} {
		blob := model(b, size)
		for _, tc := range []struct {
			readers int
			stock   bool
			reuse   bool
		}{{1, false, false}, {4, false, false}, {1, true, false}, {1, false, true}} {
			codec := "codec=blob"
			if tc.stock {
				codec = "codec=stock"
			}
			if tc.reuse {
				// Before codec, so that a pattern naming the codec
				// (".../codec=blob") selects only the fresh cells.
				codec = "dst=reused/" + codec
			}
			name := fmt.Sprintf("size=%dMiB/readers=%d/%s", size>>20, tc.readers, codec)
			b.Run(name, func(b *testing.B) {
				benchPull(b, blob, tc.readers, tc.stock, tc.reuse)
			})
		}
	}
}

// benchPull runs one cell of BenchmarkPull; with reuse every reader pulls
// into the memory of its previous pull.
func benchPull(b *testing.B, blob []byte, readers int, stock, reuse bool) {
	quiet := testkit.Logger()
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
	var clients []*storerpc.Client
	for range readers + 1 { // the extra one measures a lone reader
		c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String(), StockCodec: stock})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	lone, clients := clients[:1], clients[1:]
	src := newTCPSource(b, blob)
	defer src.close()
	addr := src.lis.Addr().String()
	fresh := make([][]byte, readers) // nil: allocate per copy
	warm := make([][]byte, readers)
	for i := range warm {
		warm[i] = make([]byte, len(blob))
	}

	var dsts [][]byte // nil: Get into fresh memory
	if reuse {
		dsts = make([][]byte, readers) // filled by the warm-up pull
	}

	// The same warm-up for every transfer: connections, windows, buffers.
	pullAll(b, clients, len(blob), dsts)
	pullAll(b, lone, len(blob), nil)
	tcpCopy(b, addr, len(blob), fresh)
	tcpCopy(b, addr, len(blob), warm)

	var grpcTotal, tcpTotal, warmTotal, grpcCPU, tcpCPU, warmCPU time.Duration
	var ratios, warmRatios, singles []float64
	b.SetBytes(int64(len(blob) * readers))
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		var g, t, w time.Duration
		phases := []func(){
			func() {
				c0 := cpuTime()
				b.StartTimer()
				g = maxDur(pullAll(b, clients, len(blob), dsts))
				b.StopTimer()
				grpcCPU += cpuTime() - c0
			},
			func() {
				c0 := cpuTime()
				t = maxDur(tcpCopy(b, addr, len(blob), fresh))
				tcpCPU += cpuTime() - c0
			},
			func() {
				c0 := cpuTime()
				w = maxDur(tcpCopy(b, addr, len(blob), warm))
				warmCPU += cpuTime() - c0
			},
		}
		for k := range phases {
			phases[(i+k)%len(phases)]()
		}
		grpcTotal += g
		tcpTotal += t
		warmTotal += w
		ratios = append(ratios, t.Seconds()/g.Seconds())
		warmRatios = append(warmRatios, w.Seconds()/g.Seconds())
		if readers > 1 {
			singles = append(singles, pullAll(b, lone, len(blob), nil)[0].Seconds()/g.Seconds())
		}
	}
	mb := float64(len(blob)) * float64(b.N) / 1e6
	gb := mb * float64(readers) / 1e3
	// CPU per GB moved (both ends are in this process) is the figure least
	// disturbed by other load on the shared machine.
	b.ReportMetric(grpcCPU.Seconds()/gb, "cpu-s/GB")
	b.ReportMetric(tcpCPU.Seconds()/gb, "tcp_cpu-s/GB")
	if reuse {
		b.ReportMetric(warmCPU.Seconds()/gb, "tcp_warm_cpu-s/GB")
	}
	b.ReportMetric(mb*float64(readers)/tcpTotal.Seconds(), "tcp_MB/s")
	b.ReportMetric(mb*float64(readers)/warmTotal.Seconds(), "tcp_warm_MB/s")
	b.ReportMetric(median(ratios), "ratio_vs_tcp") // sorts ratios
	b.ReportMetric(ratios[0], "ratio_min")
	b.ReportMetric(ratios[len(ratios)-1], "ratio_max")
	b.ReportMetric(median(warmRatios), "ratio_vs_tcp_warm") // sorts warmRatios
	if reuse {
		b.ReportMetric(warmRatios[0], "warm_ratio_min")
		b.ReportMetric(warmRatios[len(warmRatios)-1], "warm_ratio_max")
	}
	b.ReportMetric(mb/grpcTotal.Seconds(), "slowest_reader_MB/s")
	if readers > 1 {
		b.ReportMetric(median(singles), "slowest_vs_single")
	}
}
