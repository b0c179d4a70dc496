package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// BenchmarkPoll: what one GET of /api/state and of /metrics costs the
// process (CPU of this process per request: server and client both run
// here) over a real in-memory store of 5,000 models and weight sync with
// 16,940 collectors (TestDashboardListsBoundedWithOtherRow's hub), asked
// by one poller at a time and by 8 at once (every op is one round of
// pollers concurrent GETs), with Config.StateReuse's default and off. store-reads/req is how many times a request
// made the endpoint read the store's Stats: 1 when each request pays for
// its own, below 1 when requests share. It reports, never asserts.
func BenchmarkPoll(b *testing.B) {
	src, reads := bigSources(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	b.Cleanup(hc.CloseIdleConnections)
	// reuse=off: every round is past the last reading's StateReuse, as
	// for pages polling every second; reuse=default: the rounds follow
	// each other within it (pollers hammering the endpoint).
	for _, reuse := range []struct {
		name string
		d    time.Duration
	}{{"default", 0}, {"off", -1}} {
		ms, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Role: "hub", Sources: src, StateReuse: reuse.d, Logger: testkit.Logger()})
		if err != nil {
			b.Fatal(err)
		}
		ms.Start()
		b.Cleanup(func() { ms.Close() })
		for _, path := range []string{"/api/state", "/metrics"} {
			if path == "/metrics" && reuse.d != 0 {
				continue // scrapes never reuse a finished reading
			}
			for _, pollers := range []int{1, 8} {
				b.Run(fmt.Sprintf("%s/reuse=%s/pollers=%d", strings.TrimPrefix(path, "/"), reuse.name, pollers), func(b *testing.B) {
					cpu0, r0, n := processCPU(), reads.Load(), 0
					for b.Loop() {
						var wg sync.WaitGroup
						for range pollers {
							wg.Go(func() {
								resp, err := hc.Get("http://" + ms.Addr() + path)
								if err != nil {
									b.Error(err)
									return
								}
								io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
							})
						}
						wg.Wait()
						n += pollers
					}
					b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1e3/float64(n), "cpu-ms/req")
					b.ReportMetric(float64(reads.Load()-r0)/float64(n), "store-reads/req")
				})
			}
		}
	}
}

// bigSources are a real in-memory store of 5,000 models (every third
// pushed twice) and a weight sync service that knows 16,940 collectors
// with 200-byte ids: 200 on each of 60 models (one version behind on the
// models pushed twice), one on every other model. reads counts the calls
// of the store's Stats.
func bigSources(b *testing.B) (src metrics.Sources, reads *atomic.Int64) {
	b.Helper()
	ctx := context.Background()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ws, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ws.Close() })
	const models = 5000
	pad := strings.Repeat("x", 200)
	name := func(i int) string { return fmt.Sprintf("m%04d", i) }
	blob := storetest.Blob(b, 1, 2)
	var reports []*pb.CollectorReport
	for i := range models {
		for v := uint64(1); v <= 1+uint64(i%3/2); v++ {
			if _, err := st.Push(ctx, store.PushRequest{Name: name(i), Version: v, Expect: v - 1, Blob: blob}); err != nil {
				b.Fatal(err)
			}
		}
		per := 1
		if i < 60 {
			per = 200
		}
		for j := range per {
			reports = append(reports, &pb.CollectorReport{CollectorId: fmt.Sprintf("c%03d-%s", j, pad), Model: name(i), Version: 1, Via: "shm"})
		}
	}
	for len(reports) > 0 {
		k := min(len(reports), 4000)
		if _, err := ws.Report(ctx, &pb.SyncReportRequest{Reports: reports[:k]}); err != nil {
			b.Fatal(err)
		}
		reports = reports[k:]
	}
	reads = &atomic.Int64{}
	return metrics.Sources{
		Store: func() store.Stats { reads.Add(1); return st.Stats() },
		Sync:  ws.Stats,
	}, reads
}
