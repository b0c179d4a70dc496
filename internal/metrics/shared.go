package metrics

import (
	"bytes"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		defer func() { // a panic too must release the waiters
			if s.reuse <= 0 {
				// Never reused: let it go with its last waiter rather
				// than keep it (a gather's families and responses) until
				// the next computation.
				s.mu.Lock()
				if s.last == r {
					s.last = nil
				}
				s.mu.Unlock()
			}
			close(r.done)
		}()
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

// scrapes serves /metrics: promhttp's handler over reg, with the scrapes
// that arrive while a gather is in progress sharing its families and
// their encoding. A finished gather is not reused, so a scrape never sees
// figures read before it arrived, except those of the gather in progress
// it joined.
//
// promhttp encodes (and, when asked, gzips) the families for each
// request: on BenchmarkPoll's hub of 5,000 models about 7 ms of CPU per
// scrape besides the gather's 32, so 8 scrapes sharing a gather still
// cost 90 ms. So the scrapes that share a gather share its response too: the first scrape of
// each variant (what promhttp's answer depends on: Accept, Accept-Encoding
// and the query's name[] filter) has promhttp write it into memory, and
// every scrape of that variant gets those bytes. promhttp stays the
// encoder, rather than expfmt and compress/gzip called here, so that the
// negotiation, the headers, compression and the answer to a failed gather
// stay exactly promhttp's.
type scrapes struct {
	reg     prometheus.Gatherer
	opts    promhttp.HandlerOpts
	s       shared[*gathered] // reuse 0: only a gather in progress is shared
	encodes atomic.Int64      // responses promhttp encoded (tests read it)
}

// maxVariants bounds the responses a gather keeps: past it, a scrape of
// yet another variant is encoded for it alone, streamed as promhttp does,
// so that clients asking in many ways cannot make the hub buffer many
// bodies.
const maxVariants = 8

// gathered is one gather and the responses encoded from it.
type gathered struct {
	mfs []*dto.MetricFamily
	err error

	mu        sync.Mutex
	responses map[variant]*shared[*response] // at most maxVariants; guarded by mu
}

// variant is what, besides the families, promhttp's response depends on:
// the format it negotiates from Accept, the compression from
// Accept-Encoding, and the query (its name[] filter). Requests alike get
// the same bytes.
type variant struct{ accept, encoding, query string }

// Gather implements prometheus.Gatherer for promhttp. The families are
// shared between the scrapes that joined: promhttp only reads them.
func (g *gathered) Gather() ([]*dto.MetricFamily, error) { return g.mfs, g.err }

// response is where the scrapes of v share their response: nil when the
// gather keeps maxVariants others already.
func (g *gathered) response(v variant) *shared[*response] {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.responses[v]
	if r == nil && len(g.responses) < maxVariants {
		if g.responses == nil {
			g.responses = make(map[variant]*shared[*response])
		}
		// Kept for as long as the gather: every scrape that joined it
		// takes this response, however late it asks.
		r = &shared[*response]{reuse: math.MaxInt64}
		g.responses[v] = r
	}
	return r
}

func (sc *scrapes) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	g := sc.s.get(func() *gathered {
		mfs, err := sc.reg.Gather()
		return &gathered{mfs: mfs, err: err}
	})
	v := variant{
		accept:   strings.Join(req.Header.Values("Accept"), "\n"),
		encoding: strings.Join(req.Header.Values("Accept-Encoding"), "\n"),
		query:    req.URL.RawQuery,
	}
	share := g.response(v)
	if share == nil {
		sc.encodes.Add(1)
		promhttp.HandlerFor(g, sc.opts).ServeHTTP(w, req)
		return
	}
	share.get(func() *response {
		sc.encodes.Add(1)
		r := &response{header: http.Header{}}
		promhttp.HandlerFor(g, sc.opts).ServeHTTP(r, req)
		return r
	}).writeTo(w)
}

// response is an http.ResponseWriter that keeps what it is given, for
// writeTo to send to every scrape that shares it. It is read-only once
// the handler writing it returned.
type response struct {
	header http.Header
	status int // 0 until WriteHeader or Write
	body   bytes.Buffer
}

var _ http.ResponseWriter = (*response)(nil)

func (r *response) Header() http.Header { return r.header }

func (r *response) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *response) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// writeTo sends r as w's response. An error writing it is the client's
// (gone, or a HEAD request): nothing to report.
func (r *response) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = slices.Clone(v)
	}
	if r.status != 0 {
		w.WriteHeader(r.status)
	}
	w.Write(r.body.Bytes())
}
