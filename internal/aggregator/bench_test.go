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

func reportPercentiles(b *testing.B, d []time.Duration, baselineP50 time.Duration) time.Duration {
	slices.Sort(d)
	p50 := d[len(d)/2]
	p99 := d[min(len(d)-1, len(d)*99/100)]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	if baselineP50 > 0 {
		b.ReportMetric(float64(p50)/float64(baselineP50), "x_upload_p50")
	}
	b.ReportMetric(0, "ns/op") // percentiles say more than the mean here
	return p50
}

// BenchmarkLearnRoundTrip measures a Learn of a 16 MiB batch on loopback:
// coordinator → aggregator → 1, 2 or 4 learner processes (whose OnLearn
// only counts rows) → merged info back. The baseline, measured in the same
// run, is the upload alone: the same Learn to an aggregator with no task,
// which receives and decodes the whole batch and then refuses it.
//
//	go test -run '^$' -bench LearnRoundTrip -benchtime 100x ./internal/aggregator/
func BenchmarkLearnRoundTrip(b *testing.B) {
	batch := benchBatch(b)
	size := batch.ByteSize()
	var baseline time.Duration
	b.Run("upload-only", func(b *testing.B) {
		h := newHarness(b, Config{})
		ctx := testCtx(b, 10*time.Minute)
		b.SetBytes(size)
		d := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			_, err := h.client.Learn(ctx, "", batch, nil)
			d = append(d, time.Since(t0))
			if !errors.Is(err, errs.ErrStale) {
				b.Fatalf("upload-only: %v, want ErrStale (no task)", err)
			}
		}
		baseline = reportPercentiles(b, d, 0)
	})
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
			b.SetBytes(size)
			d := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				resp, err := h.client.Learn(ctx, "bench", batch, nil)
				d = append(d, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				if len(resp.Shares) != n {
					b.Fatalf("%d shares, want %d", len(resp.Shares), n)
				}
			}
			reportPercentiles(b, d, baseline)
		})
	}
}
