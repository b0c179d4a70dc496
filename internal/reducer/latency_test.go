package reducer

import (
	"testing"
	"time"
)

// The histogram is cumulative and counts every sample, also past the
// quantile ring's size.
func TestLatencyHistogramCumulative(t *testing.T) {
	l := newLatencies(2)
	for _, d := range []time.Duration{300 * time.Microsecond, 2 * time.Millisecond, 2 * time.Millisecond, 20 * time.Second} {
		l.add(d)
	}
	h := l.hist.snapshot()
	if h.Count != 4 || h.Sum != 300*time.Microsecond+4*time.Millisecond+20*time.Second {
		t.Fatalf("count %d sum %v", h.Count, h.Sum)
	}
	want := map[float64]uint64{0.0005: 1, 0.001: 1, 0.0025: 3, 10: 3}
	for i, b := range LatencyBuckets {
		if w, ok := want[b]; ok && h.Counts[i] != w {
			t.Errorf("bucket ≤ %gs: %d, want %d", b, h.Counts[i], w)
		}
	}
}
