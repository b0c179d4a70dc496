package auth

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/rlhub/rlhub/internal/errs"
)

// Usage is what a token's identity holds in the store now (models whose
// owner is Principal.Owner, and their newest versions' bytes), and what
// it holds of the model a push is for.
type Usage struct {
	Models int
	Bytes  int64
	// Owns: the pushed model is one of Models; ModelBytes is its newest
	// version's size.
	Owns       bool
	ModelBytes int64
}

// quotaBook holds the bytes and new models of pushes admitted but not yet
// landed, per owner, so concurrent pushes of one token cannot together
// pass its quota.
type quotaBook struct {
	inflight map[string]*reserved // guarded by Verifier.mu
}

type reserved struct {
	models int
	bytes  int64
}

// ReserveQuota admits a push of size bytes to model by p, given what p's
// identity holds (u, read from the store just before), against p's Quota
// and the pushes of p admitted and not yet done. It returns a function to
// call when the push is over (landed or not). Past a bound it fails with
// errs.ErrFull (ResourceExhausted) naming the bound; the caller must then
// read no body and change nothing.
func (v *Verifier) ReserveQuota(p Principal, model string, size int64, u Usage) (release func(), err error) {
	q := p.Quota
	if q == (Quota{}) {
		return func() {}, nil
	}
	owner := p.Owner()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.quota.inflight == nil {
		v.quota.inflight = map[string]*reserved{}
	}
	in := v.quota.inflight[owner]
	if in == nil {
		in = &reserved{}
	}
	newModel := 0
	if !u.Owns {
		newModel = 1
	}
	if q.Models > 0 && newModel == 1 && u.Models+in.models+1 > q.Models {
		v.stats.quotaModels.Add(1)
		return nil, fmt.Errorf("%w: token %q owns %d models (%d more being pushed) and its quota is %d (max-models): delete one or ask for a larger quota",
			errs.ErrFull, clip(p.Name), u.Models, in.models, q.Models)
	}
	after := u.Bytes - u.ModelBytes + in.bytes + size
	if q.Bytes > 0 && after > q.Bytes {
		v.stats.quotaBytes.Add(1)
		return nil, fmt.Errorf("%w: a push of %d bytes to %q would make token %q's models hold %d bytes; its quota is %d (max-bytes)",
			errs.ErrFull, size, clip(model), clip(p.Name), after, q.Bytes)
	}
	in.models += newModel
	in.bytes += size
	v.quota.inflight[owner] = in
	var once atomic.Bool
	return func() {
		if once.Swap(true) {
			return
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		in.models -= newModel
		in.bytes -= size
		if in.models == 0 && in.bytes == 0 {
			delete(v.quota.inflight, owner)
		}
	}, nil
}

// Stats are the verifier's counters (rlhub_auth_* metrics).
type Stats struct {
	Tokens          int    // tokens loaded
	LiveCalls       int    // calls in progress under a token
	Reloads         uint64 // token file reloads that took effect
	ReloadFailures  uint64 // reloads refused (the old tokens stayed)
	CallsCut        uint64 // calls ended by a revocation, a changed line or an expiry
	QuotaModelsFull uint64 // pushes refused by max-models
	QuotaBytesFull  uint64 // pushes refused by max-bytes
	QuotaRateFull   uint64 // requests refused by max-rps
}

type counters struct {
	reloads, reloadFailures, cut, quotaModels, quotaBytes, quotaRate atomic.Uint64
	lookups                                                          atomic.Uint64 // tokens hashed and looked up (tests: once per call)
}

// rates holds each rate-limited token's bucket, by token name (the
// identity: tokens reissued under one name share it). Replace empties it.
type rates struct {
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// allowRate takes one request from p's bucket (Quota.Rate); past it the
// request fails with errs.ErrFull.
func (v *Verifier) allowRate(p Principal) error {
	r := p.Quota.Rate
	if r <= 0 {
		return nil
	}
	v.rates.mu.Lock()
	if v.rates.buckets == nil {
		v.rates.buckets = map[string]*rate.Limiter{}
	}
	b := v.rates.buckets[p.Name]
	if b == nil {
		b = rate.NewLimiter(rate.Limit(r), max(1, int(math.Ceil(r))))
		v.rates.buckets[p.Name] = b
	}
	v.rates.mu.Unlock()
	if b.AllowN(v.now(), 1) {
		return nil
	}
	v.stats.quotaRate.Add(1)
	return fmt.Errorf("%w: token %q is over its rate of %g requests per second (max-rps): slow down and retry", errs.ErrFull, clip(p.Name), r)
}

// Stats returns the counters now; a nil verifier has none.
func (v *Verifier) Stats() Stats {
	if v == nil {
		return Stats{}
	}
	v.mu.RLock()
	s := Stats{Tokens: len(v.tokens), LiveCalls: len(v.live)}
	v.mu.RUnlock()
	s.Reloads, s.ReloadFailures, s.CallsCut = v.stats.reloads.Load(), v.stats.reloadFailures.Load(), v.stats.cut.Load()
	s.QuotaModelsFull, s.QuotaBytesFull, s.QuotaRateFull = v.stats.quotaModels.Load(), v.stats.quotaBytes.Load(), v.stats.quotaRate.Load()
	return s
}
