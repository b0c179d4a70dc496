package reducer

import (
	"slices"
	"time"
)

// LatencyBuckets are the upper bounds of the admitted → published latency
// histogram (Service.PublishLatency), in seconds; a last +Inf bucket is
// implied.
var LatencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// LatencyHistogram is a cumulative histogram of admitted → published
// latencies at a primary since it started: Counts[i] is the number of
// batches published within LatencyBuckets[i] (cumulative, Prometheus
// style); Count and Sum cover every batch.
type LatencyHistogram struct {
	Counts []uint64 // one per LatencyBuckets entry, cumulative
	Count  uint64
	Sum    time.Duration
}

// latencyHist accumulates a LatencyHistogram; the owning latencies' mutex
// guards it.
type latencyHist struct {
	perBucket []uint64 // not cumulative; len(LatencyBuckets)+1 (last: +Inf)
	count     uint64
	sum       time.Duration
}

func (h *latencyHist) observe(d time.Duration) {
	if h.perBucket == nil {
		h.perBucket = make([]uint64, len(LatencyBuckets)+1)
	}
	i, _ := slices.BinarySearch(LatencyBuckets, d.Seconds())
	h.perBucket[i]++
	h.count++
	h.sum += d
}

func (h *latencyHist) snapshot() LatencyHistogram {
	out := LatencyHistogram{Counts: make([]uint64, len(LatencyBuckets)), Count: h.count, Sum: h.sum}
	var run uint64
	for i := range LatencyBuckets {
		if h.perBucket != nil {
			run += h.perBucket[i]
		}
		out.Counts[i] = run
	}
	return out
}

// PublishLatency returns the primary's admitted → published latency
// histogram.
func (p *Primary) PublishLatency() LatencyHistogram {
	p.lat.mu.Lock()
	defer p.lat.mu.Unlock()
	return p.lat.hist.snapshot()
}

// PublishLatency is the hosted primary's latency histogram, or a zero
// histogram (no counts) when the primary is remote.
func (s *Service) PublishLatency() LatencyHistogram {
	if s.primary == nil {
		return (&latencyHist{}).snapshot()
	}
	return s.primary.PublishLatency()
}
