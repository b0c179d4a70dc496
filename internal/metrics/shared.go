package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// shared computes a value for concurrent callers so that the endpoint's
// cost follows time, not the number of clients: a caller arriving while a
// computation is in progress waits for it and takes its result, and one
// arriving less than reuse after the last finished computation started
// takes that result. At most one computation runs at a time, and with
// reuse > 0 at most one starts per reuse. So the figures a caller gets
// were read at most reuse before it arrived, or, when it joined a
// computation in progress, after that computation started. The zero value
// shares only computations in progress.
type shared[T any] struct {
	reuse time.Duration // ≤ 0: a finished result is never reused

	mu      sync.Mutex
	last    *sharedResult[T] // the computation in progress or the last finished; guarded by mu
	waiting int              // callers waiting for last; guarded by mu (tests read it)
}

type sharedResult[T any] struct {
	start time.Time
	done  chan struct{} // closed once the computation returned or panicked
	ok    bool          // val is set (it did not panic); read after done
	val   T
}

// get returns a result of compute, computed now or shared as above. The
// result is shared: callers must not modify it.
func (s *shared[T]) get(compute func() T) T {
	s.mu.Lock()
	now := time.Now()
	r := s.last
	if r != nil {
		select {
		case <-r.done:
			if !r.ok || now.Sub(r.start) >= s.reuse {
				r = nil
			}
		default: // in progress: wait for it
		}
	}
	if r == nil {
		r = &sharedResult[T]{start: now, done: make(chan struct{})}
		s.last = r
		s.mu.Unlock()
		defer close(r.done) // a panic too must release the waiters
		r.val = compute()
		r.ok = true
		return r.val
	}
	s.waiting++
	s.mu.Unlock()
	<-r.done
	s.mu.Lock()
	s.waiting--
	s.mu.Unlock()
	if !r.ok {
		// The computation panicked (net/http recovered its request): this
		// caller computes its own rather than answer with a zero value.
		return compute()
	}
	return r.val
}

// waiters is how many callers wait for a computation in progress.
func (s *shared[T]) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// sharedGatherer is a prometheus.Gatherer whose concurrent Gather calls
// share one gather of g: scrapes that arrive while one is gathered take
// its families. A finished gather is not reused, so a scrape never sees
// figures read before it arrived, except those of the gather in progress
// it joined.
type sharedGatherer struct {
	g prometheus.Gatherer
	s shared[gathered]
}

type gathered struct {
	mfs []*dto.MetricFamily
	err error
}

// Gather implements prometheus.Gatherer. The families are shared between
// the scrapes that joined: promhttp only reads them.
func (sg *sharedGatherer) Gather() ([]*dto.MetricFamily, error) {
	r := sg.s.get(func() gathered {
		mfs, err := sg.g.Gather()
		return gathered{mfs, err}
	})
	return r.mfs, r.err
}
