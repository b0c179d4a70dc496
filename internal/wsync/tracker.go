package wsync

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
)

// LagBuckets are the upper bounds of the lag histogram's buckets; the last
// bucket (math.MaxUint64) catches the rest.
var LagBuckets = []uint64{0, 1, 2, 4, 8, 16, 32, 64, math.MaxUint64}

// CollectorLag is one collector's state as the hub sees it.
type CollectorLag struct {
	ID    string
	Model string
	// Version the collector last reported running.
	Version uint64
	// Lag is Newest − Version of its model (0 when current or ahead).
	Lag uint64
	// Via is how it gets weights ("push", "shm", ...).
	Via string
	// Attached is true while it holds a push stream to this server.
	Attached bool
	// Reported is when it last reported.
	Reported time.Time
}

// LagBucket counts collectors whose lag is ≤ Max (and above the previous
// bucket's Max).
type LagBucket struct {
	Max   uint64
	Count uint64
}

// ModelStatus is the lag picture of one model.
type ModelStatus struct {
	Model      string
	Newest     uint64
	Collectors []CollectorLag // sorted by ID
	Histogram  []LagBucket    // one per LagBuckets entry
}

// Tracker is the pure core of lag accounting: which version each collector
// runs and which is the newest per model. Safe for concurrent use; it starts
// no goroutines.
type Tracker struct {
	now    func() time.Time
	forget time.Duration
	max    int // collectors tracked at most; 0: no cap

	mu         sync.Mutex
	collectors map[trackKey]*CollectorLag // guarded by mu
	// streams counts the push streams each collector holds: it may hold
	// two for a while (a reconnect while the old stream's connection is
	// still half-open on the hub), and it is attached while any is open.
	streams map[trackKey]int  // guarded by mu
	newest  map[string]uint64 // guarded by mu
	lives   map[string]uint64 // the life of each newest (store.Snapshot.Life, 0: unknown); guarded by mu
	swept   time.Time         // last forgetting sweep at the cap; guarded by mu
}

type trackKey struct{ id, model string }

// NewTracker returns an empty tracker. now is the clock (nil: time.Now);
// collectors that are not attached and have not reported for forget are
// dropped from status (0: kept forever). It tracks at most maxCollectors
// collectors (0: no cap): a report of another one is refused (Report).
func NewTracker(now func() time.Time, forget time.Duration, maxCollectors int) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{now: now, forget: forget, max: maxCollectors, collectors: map[trackKey]*CollectorLag{},
		streams: map[trackKey]int{}, newest: map[string]uint64{}, lives: map[string]uint64{}}
}

// A CollectorReport is one collector's report (Tracker.ReportAll).
type CollectorReport struct {
	ID, Model, Via string
	Version        uint64
}

// Report records that collector id runs version of model. A collector the
// tracker does not hold yet is refused with errs.ErrFull when it holds its
// cap of collectors even after dropping the forgotten ones.
func (t *Tracker) Report(id, model, via string, version uint64) error {
	return t.ReportAll([]CollectorReport{{ID: id, Model: model, Via: via, Version: version}})
}

// ReportAll records every report of rs, or, when the collectors it does
// not hold yet would pass the cap, none (errs.ErrFull).
func (t *Tracker) ReportAll(rs []CollectorReport) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.max > 0 {
		if err := t.roomFor(rs); err != nil {
			return err
		}
	}
	now := t.now()
	for _, r := range rs {
		c := t.entry(r.ID, r.Model)
		c.Version = r.Version
		if r.Via != "" {
			c.Via = r.Via
		}
		c.Reported = now
	}
	return nil
}

// roomFor checks that rs's new collectors fit under the cap, first
// dropping the forgotten collectors when they would not (at most once a
// second: a client that keeps the tracker full must not make every call
// walk it). Only Status dropped them before, so a hub nobody asked for
// status kept every collector it ever saw. t.mu is held.
func (t *Tracker) roomFor(rs []CollectorReport) error {
	newKeys := map[trackKey]struct{}{}
	for _, r := range rs {
		if k := (trackKey{r.ID, r.Model}); t.collectors[k] == nil {
			newKeys[k] = struct{}{}
		}
	}
	if len(t.collectors)+len(newKeys) <= t.max {
		return nil
	}
	if now := t.now(); t.forget > 0 && now.Sub(t.swept) >= time.Second {
		t.swept = now
		for k, c := range t.collectors {
			if !c.Attached && now.Sub(c.Reported) > t.forget {
				delete(t.collectors, k)
			}
		}
	}
	if len(t.collectors)+len(newKeys) <= t.max {
		return nil
	}
	return fmt.Errorf("%w: weight sync tracks %d collectors, at most %d: %d more reported (collectors are forgotten %v after their last report)",
		errs.ErrFull, len(t.collectors), t.max, len(newKeys), t.forget)
}

// SetAttached records that collector id opened (attached true) or closed
// a push stream; it is attached while it holds any. Every open must be
// paired with one close.
func (t *Tracker) SetAttached(id, model string, attached bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := trackKey{id, model}
	if attached {
		t.streams[k]++
	} else if t.streams[k]--; t.streams[k] <= 0 {
		delete(t.streams, k)
	}
	c := t.entry(id, model)
	c.Attached = t.streams[k] > 0
	c.Reported = t.now()
}

// SawVersion records that version of model exists (newest only grows).
func (t *Tracker) SawVersion(model string, version uint64) { t.SawLife(model, version, 0) }

// SawLife is SawVersion for a version of the given life of its model
// (store.Snapshot.Life; 0: unknown, as SawVersion). A later life (the
// model deleted and pushed again, its versions numbered afresh) makes
// version the newest even when it is lower; a version of an earlier life
// (sent after the Delete) changes nothing.
func (t *Tracker) SawLife(model string, version, life uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.lives[model]
	switch {
	case life > cur:
		t.newest[model], t.lives[model] = version, life
	case life != 0 && life < cur:
	case version > t.newest[model]:
		t.newest[model] = version
	}
}

// Newest is the newest version of model seen.
func (t *Tracker) Newest(model string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.newest[model]
}

func (t *Tracker) entry(id, model string) *CollectorLag {
	k := trackKey{id, model}
	c := t.collectors[k]
	if c == nil {
		c = &CollectorLag{ID: id, Model: model}
		t.collectors[k] = c
	}
	return c
}

// Models lists the models that have collectors, sorted. It runs on every
// metrics scrape and dashboard poll with t.mu held, so it is linear in the
// collectors: every Report and Attach waits for it.
func (t *Tracker) Models() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[string]struct{})
	for k := range t.collectors {
		seen[k.model] = struct{}{}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Status returns the lag picture of model ("" for every model with
// collectors), forgetting collectors gone longer than the forget window.
func (t *Tracker) Status(model string) []ModelStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	by := map[string]*ModelStatus{}
	for k, c := range t.collectors {
		if t.forget > 0 && !c.Attached && now.Sub(c.Reported) > t.forget {
			delete(t.collectors, k)
			continue
		}
		if model != "" && k.model != model {
			continue
		}
		ms := by[k.model]
		if ms == nil {
			ms = &ModelStatus{Model: k.model, Newest: t.newest[k.model]}
			by[k.model] = ms
		}
		cl := *c
		if ms.Newest > cl.Version {
			cl.Lag = ms.Newest - cl.Version
		}
		ms.Collectors = append(ms.Collectors, cl)
	}
	if model != "" && by[model] == nil {
		by[model] = &ModelStatus{Model: model, Newest: t.newest[model]}
	}
	out := make([]ModelStatus, 0, len(by))
	for _, ms := range by {
		slices.SortFunc(ms.Collectors, func(a, b CollectorLag) int { return strings.Compare(a.ID, b.ID) })
		ms.Histogram = histogram(ms.Collectors)
		out = append(out, *ms)
	}
	slices.SortFunc(out, func(a, b ModelStatus) int { return strings.Compare(a.Model, b.Model) })
	return out
}

func histogram(cs []CollectorLag) []LagBucket {
	h := make([]LagBucket, len(LagBuckets))
	for i, m := range LagBuckets {
		h[i].Max = m
	}
	for _, c := range cs {
		i, _ := slices.BinarySearch(LagBuckets, c.Lag)
		h[i].Count++
	}
	return h
}
