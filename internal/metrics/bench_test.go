package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkMetricsOverhead measures gradients applied/s and pull
// throughput on a hub without a metrics endpoint ("off") and with one
// scraped every second ("on"; ScrapeEvery below), in the same run. -count
// repeats each sub-benchmark in place, so loop the test binary to
// interleave off and on. It reports figures, never asserts them
// (docs/benchlog/2026-12-01-obs.md).
func BenchmarkMetricsOverhead(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run("apply/"+mode, func(b *testing.B) { benchApply(b, mode == "on") })
		b.Run("pull/"+mode, func(b *testing.B) { benchPull(b, mode == "on") })
	}
}

// ScrapeEvery is the benchmark scraper's period.
const ScrapeEvery = time.Second

const benchFloats = 1 << 18 // 1 MiB of float32

func benchHub(b *testing.B, metricsOn bool) (*hub.Hub, func() int) {
	cfg := hub.Config{Logger: testkit.Logger(), Reducer: reducer.Config{BatchSize: 4, MaxWait: time.Millisecond, MaxQueue: 16}}
	if metricsOn {
		cfg.MetricsListen = "127.0.0.1:0"
	}
	h := hubtest.Start(b, cfg)
	sd, err := tensor.NewStateDict(tensor.NewF32("w", benchFloats))
	if err != nil {
		b.Fatal(err)
	}
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := h.Store().Push(context.Background(), store.PushRequest{Name: "bench", Version: 1, Blob: blob}); err != nil {
		b.Fatal(err)
	}
	scrapes := func() int { return 0 }
	if metricsOn {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var mu sync.Mutex
		n := 0
		wg.Add(1)
		go func() { // the scraper: GET /metrics every ScrapeEvery
			defer wg.Done()
			t := time.NewTicker(ScrapeEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.MetricsAddr()+"/metrics", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
		b.Cleanup(func() { cancel(); wg.Wait() })
		scrapes = func() int { mu.Lock(); defer mu.Unlock(); return n }
	}
	return h, scrapes
}

func benchApply(b *testing.B, metricsOn bool) {
	h, scrapes := benchHub(b, metricsOn)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "admin"})
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, reducer.ModelConfig{Model: "bench", Optimizer: optim.Config{Kind: optim.SGD, LR: 1e-6}, Reduction: reduce.Mean}); err != nil {
		b.Fatal(err)
	}
	grad, _ := tensor.NewStateDict(tensor.NewF32("w", benchFloats))
	const clients = 2
	cls := make([]*reducer.Client, clients)
	for i := range cls {
		if cls[i], err = reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: fmt.Sprintf("b%d", i)}); err != nil {
			b.Fatal(err)
		}
		defer cls[i].Close()
		if _, err := cls[i].PushGrad(ctx, "bench", 0, grad); err != nil { // warm up
			b.Fatal(err)
		}
	}
	settled := func(want uint64) {
		testkit.Eventually(b, time.Minute, "every pushed gradient applied or dropped", func() bool {
			t := h.Reducer().Stats().Total
			return t.Applied+t.DroppedTotal() >= want
		})
	}
	settled(clients)
	base := h.Reducer().Stats().Total
	b.SetBytes(int64(grad.ByteSize()))
	b.ResetTimer()
	cpu0 := processCPU()
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		k := b.N / clients
		if i < b.N%clients {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				if _, err := cls[i].PushGrad(ctx, "bench", 0, grad); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	settled(base.Applied + base.DroppedTotal() + uint64(b.N))
	el := time.Since(t0)
	b.StopTimer()
	reportCPU(b, cpu0)
	t := h.Reducer().Stats().Total
	b.ReportMetric(float64(t.Applied-base.Applied)/el.Seconds(), "applied/s")
	b.ReportMetric(float64(scrapes()), "scrapes")
}

func benchPull(b *testing.B, metricsOn bool) {
	h, scrapes := benchHub(b, metricsOn)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const clients = 2
	cls := make([]*storerpc.Client, clients)
	var size int64
	for i := range cls {
		var err error
		if cls[i], err = storerpc.NewClient(storerpc.ClientConfig{Addr: addr}); err != nil {
			b.Fatal(err)
		}
		defer cls[i].Close()
		snap, err := cls[i].Get(ctx, "bench", 0) // warm up
		if err != nil {
			b.Fatal(err)
		}
		size = int64(len(snap.Blob))
	}
	b.SetBytes(size)
	b.ResetTimer()
	cpu0 := processCPU()
	var wg sync.WaitGroup
	for i := range clients {
		k := b.N / clients
		if i < b.N%clients {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				if _, err := cls[i].Get(ctx, "bench", 0); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	reportCPU(b, cpu0)
	b.ReportMetric(float64(scrapes()), "scrapes")
}

// processCPU is this process's user + system CPU time: hub, clients and
// scraper all run here, so CPU per operation shows what metrics cost even
// when other work on the machine moves the wall-clock figures.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, since time.Duration) {
	b.ReportMetric(float64((processCPU()-since).Microseconds())/float64(b.N), "cpu-µs/op")
}
