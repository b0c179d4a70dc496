package aggregator

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

// benchBatch is 16 MiB: x [65536, 63] F32 and y [65536] F32.
func benchBatch(b *testing.B) *tensor.StateDict {
	const rows = 65536
	sd, err := tensor.NewStateDict(tensor.NewF32("x", rows, 63), tensor.NewF32("y", rows))
	if err != nil {
		b.Fatal(err)
	}
	return sd
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkLearnRoundTrip measures a Learn of a 16 MiB batch on loopback:
// coordinator → aggregator → 1, 2 or 4 learner processes (whose OnLearn
// only counts rows) → merged info back (ns/op covers the round trip and
// its baseline together; read the percentiles). The baseline, interleaved with it
// iteration by iteration so load swings hit both alike, is the upload
// alone: the same Learn naming a task that does not exist, which the
// aggregator receives and decodes in full before refusing it.
//
//	go test -run '^$' -bench LearnRoundTrip -benchtime 100x ./internal/aggregator/
func BenchmarkLearnRoundTrip(b *testing.B) {
	batch := benchBatch(b)
	size := batch.ByteSize()
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("learners=%d", n), func(b *testing.B) {
			h := newHarness(b, Config{})
			opts := make([]childOpts, n)
			for i := range opts {
				opts[i] = childOpts{batchSize: 65536 / int64(n), noop: true}
			}
			h.startLearners(b, opts...)
			ctx := testCtx(b, 10*time.Minute)
			if _, err := h.client.Start(ctx, "bench", map[string]any{"w": []any{1.0}}); err != nil {
				b.Fatal(err)
			}
			if _, err := h.client.GetDataDemand(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			var trip, upload []time.Duration
			for b.Loop() {
				t0 := time.Now()
				_, err := h.client.Learn(ctx, "no-such-task", batch, nil)
				upload = append(upload, time.Since(t0))
				if !errors.Is(err, errs.ErrStale) {
					b.Fatalf("upload-only: %v, want ErrStale (no such task)", err)
				}
				t0 = time.Now()
				resp, err := h.client.Learn(ctx, "bench", batch, nil)
				trip = append(trip, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				if len(resp.Shares) != n {
					b.Fatalf("%d shares, want %d", len(resp.Shares), n)
				}
			}
			p50, p99 := percentiles(trip)
			u50, u99 := percentiles(upload)
			b.ReportMetric(ms(p50), "p50_ms")
			b.ReportMetric(ms(p99), "p99_ms")
			b.ReportMetric(ms(u50), "upload_p50_ms")
			b.ReportMetric(ms(u99), "upload_p99_ms")
			b.ReportMetric(float64(p50)/float64(u50), "x_upload_p50")
			b.ReportMetric(float64(size)/1e6/p50.Seconds(), "p50_MB/s")
		})
	}
}
