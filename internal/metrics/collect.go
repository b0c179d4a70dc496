package metrics

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
)

// Sources are the Stats functions of the services one process hosts; a nil
// field leaves that source's metrics (and dashboard panel) out. Each is
// called at most once per scrape or dashboard poll (requests that arrive
// together share one call; Config.StateReuse), from an HTTP handler's
// goroutine, so it must be safe for concurrent use (every Stats() is):
// a scrape and a dashboard reading may call it at once.
type Sources struct {
	Reducer        func() reducer.Stats
	ReducerLatency func() reducer.LatencyHistogram
	Store          func() store.Stats
	Sync           func(context.Context) wsync.Stats
	Aggregator     func() aggregator.Stats
	ARS            func() arsrpc.Stats
	// Worker is an ARS worker's live counters (arsrpc.WorkerConfig.Live).
	Worker *arsrpc.WorkerCounters
	// Auth is the token verifier's counters (a hub with tokens).
	Auth func() auth.Stats
	// DataPlane is the hub's listener and data plane (bulk.Server.Stats):
	// its requests by outcome and the connections it refused.
	DataPlane func() bulk.Stats
	// GRPCBodies is the hub's gRPC streams' body deadlines
	// (bodylimit.Limiter.Stats): the streams cut at one.
	GRPCBodies func() bodylimit.Stats
	// Cluster is a cluster member's role and replication (serve --etcd:
	// the primary's hub and the standby both export it).
	Cluster func() ClusterStats
	// RelayRefused is an rlhub relay's count of upstream versions it
	// refused as over its MaxModelBytes (relay.Relay.Refusals).
	RelayRefused func() uint64
}

// ClusterStats is one cluster member's role and replication state
// (internal/replica fills it).
type ClusterStats struct {
	Primary bool
	Epoch   uint64
	// Unit is the newest unit applied (standby) or asked for (primary).
	Unit uint64
	// Applied counts the units applied as a standby.
	Applied uint64
	// Synced: the standby holds a full copy of the primary it follows.
	Synced bool
	// Lag is, on the primary, each connected standby's units not yet
	// acknowledged, by member id.
	Lag map[string]uint64
	// Outside: this hub is not a member of the cluster — joining it (etcd
	// not reached yet, or its lease lost), or out after a local fault.
	Outside bool
	// Faults counts the times this hub left the cluster because it could
	// not write its data (disk full, read-only, I/O error).
	Faults uint64
	// KeepsInSync: this primary keeps the in-sync record (acks all);
	// InSync are then the member ids of the standbys it lists, sorted:
	// the only ones that may take over (the dashboard lists them; the
	// metrics export only their count).
	KeepsInSync bool
	InSync      []string
	// Scrubs counts the checks of this hub's copy completed as a standby
	// (on start and every --replica-scrub-every), DamagedFiles the files
	// they found damaged and moved aside for the primary to send again.
	Scrubs, DamagedFiles uint64
	// ShippedWhole, ShippedAppended and ShippedCut count the file bytes
	// this hub sent to standbys while primary (each standby's counted):
	// files sent whole, appends (the bytes past a standby's copy) and own
	// cuts; Cuts the units sent from own cuts (full syncs, and units after
	// the snapshots a standby needed were gone).
	ShippedWhole, ShippedAppended, ShippedCut, Cuts uint64
}

// OtherLabel is the label value shared by the collectors, learners, runs
// or models past Config.MaxLabelValues.
const OtherLabel = "other"

// statsCollector is a prometheus.Collector that reads Sources at scrape
// time; of its own it holds only which models the store's and the
// reducer's per-model families label by name (stickyLabels).
type statsCollector struct {
	src     Sources
	max     int           // label values kept per capped label (the rest: "other")
	timeout time.Duration // bounds Sources.Sync's store look-ups
	descs   map[string]*prometheus.Desc
	fams    []Family
	// storeLabels and reducerLabels keep the store's and the reducer's
	// per-model families' labels from scrape to scrape.
	storeLabels   stickyLabels[store.ModelStats]
	reducerLabels stickyLabels[reducerModel]
	// learnerLabels does the same for the aggregator's learners.
	learnerLabels stickyLabels[aggregator.LearnerStats]
}

func newStatsCollector(src Sources, maxLabels int, timeout time.Duration) *statsCollector {
	c := &statsCollector{src: src, max: maxLabels, timeout: timeout, descs: map[string]*prometheus.Desc{}}
	add := func(on bool, fs []Family) {
		if on {
			c.fams = append(c.fams, fs...)
		}
	}
	add(src.Reducer != nil, reducerFamilies)
	add(src.Store != nil, storeFamilies)
	add(src.Sync != nil, syncFamilies)
	add(src.RelayRefused != nil, relayFamilies)
	add(src.Aggregator != nil, aggregatorFamilies)
	add(src.ARS != nil, arsFamilies)
	add(src.Worker != nil, workerFamilies)
	add(src.Auth != nil, authFamilies)
	add(src.DataPlane != nil, dataPlaneFamilies)
	add(src.GRPCBodies != nil, grpcBodyFamilies)
	add(src.Cluster != nil, clusterFamilies)
	for _, f := range c.fams {
		c.descs[f.Name] = f.desc()
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.fams {
		ch <- c.descs[f.Name]
	}
}

// emit sends one sample of family f.
func (c *statsCollector) emit(ch chan<- prometheus.Metric, f Family, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(c.descs[f.Name], f.valueType(), v, labels...)
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	if c.src.Reducer != nil {
		c.collectReducer(ch)
	}
	if c.src.Store != nil {
		c.collectStore(ch, c.src.Store())
	}
	if c.src.Sync != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		st := c.src.Sync(ctx)
		cancel()
		c.collectSync(ch, st)
	}
	if c.src.RelayRefused != nil {
		c.emit(ch, fRelayRefused, float64(c.src.RelayRefused()))
	}
	if c.src.Aggregator != nil {
		c.collectAggregator(ch, c.src.Aggregator())
	}
	if c.src.ARS != nil {
		c.collectARS(ch, c.src.ARS())
	}
	if w := c.src.Worker; w != nil {
		c.emit(ch, fWorkerTasks, float64(w.Tasks.Load()))
		c.emit(ch, fWorkerSteps, float64(w.Steps.Load()))
		c.emit(ch, fWorkerPulls, float64(w.Pulls.Load()))
		c.emit(ch, fWorkerIteration, float64(w.Iteration.Load()))
	}
	if c.src.Auth != nil {
		a := c.src.Auth()
		c.emit(ch, fAuthTokens, float64(a.Tokens))
		c.emit(ch, fAuthLive, float64(a.LiveCalls))
		c.emit(ch, fAuthReloads, float64(a.Reloads), "ok")
		c.emit(ch, fAuthReloads, float64(a.ReloadFailures), "failed")
		c.emit(ch, fAuthCut, float64(a.CallsCut))
		c.emit(ch, fAuthQuota, float64(a.QuotaModelsFull), "models")
		c.emit(ch, fAuthQuota, float64(a.QuotaBytesFull), "bytes")
		c.emit(ch, fAuthQuota, float64(a.QuotaRateFull), "rate")
	}
	if c.src.DataPlane != nil {
		d := c.src.DataPlane()
		for _, r := range d.Requests { // methods are the registered ones and "unknown": bounded
			c.emit(ch, fDPRequests, float64(r.N), r.Method, r.Code.String())
		}
		for _, reason := range bulk.RefusalReasons {
			c.emit(ch, fConnsRefused, float64(d.Refused[reason]), reason)
		}
	}
	if c.src.GRPCBodies != nil {
		b := c.src.GRPCBodies()
		c.emit(ch, fGRPCCut, float64(b.Received), "received")
		c.emit(ch, fGRPCCut, float64(b.Sent), "sent")
	}
	if c.src.Cluster != nil {
		c.collectCluster(ch, c.src.Cluster())
	}
}

func (c *statsCollector) collectCluster(ch chan<- prometheus.Metric, st ClusterStats) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	c.emit(ch, fClusterMember, b(!st.Outside))
	c.emit(ch, fClusterFaults, float64(st.Faults))
	c.emit(ch, fClusterPrimary, b(st.Primary))
	c.emit(ch, fClusterEpoch, float64(st.Epoch))
	c.emit(ch, fClusterUnit, float64(st.Unit))
	c.emit(ch, fClusterApplied, float64(st.Applied))
	c.emit(ch, fClusterSynced, b(st.Synced))
	c.emit(ch, fClusterScrubs, float64(st.Scrubs))
	c.emit(ch, fClusterDamaged, float64(st.DamagedFiles))
	c.emit(ch, fClusterShipped, float64(st.ShippedWhole), "whole")
	c.emit(ch, fClusterShipped, float64(st.ShippedAppended), "append")
	c.emit(ch, fClusterShipped, float64(st.ShippedCut), "cut")
	c.emit(ch, fClusterCuts, float64(st.Cuts))
	if st.Primary && st.KeepsInSync {
		c.emit(ch, fClusterInSync, float64(len(st.InSync)))
	}
	for _, m := range lagMembers(st.Lag, c.max) {
		c.emit(ch, fClusterLag, float64(st.Lag[m]), m)
	}
}

// lagMembers are the standbys lag names, sorted, the first max of them (a
// cluster has a handful of members; the cap only bounds a broken one).
func lagMembers(lag map[string]uint64, max int) []string {
	ms := slices.Sorted(maps.Keys(lag))
	return ms[:min(len(ms), max)]
}

// dropReasons are the reasons always exported (0 until one happens), so
// rate() works from the first scrape; lost is exported on its own.
var dropReasons = []reduce.Reason{reduce.ReasonInvalid, reduce.ReasonNonFinite, reduce.ReasonStale, reduce.ReasonDuplicate,
	reduce.ReasonFull, reduce.ReasonUnknownModel, reduce.ReasonAborted, reduce.ReasonPublish, reduce.ReasonStepNonFinite}

func (c *statsCollector) collectReducer(ch chan<- prometheus.Metric) {
	st := c.src.Reducer()
	t := st.Total
	c.emit(ch, fReducerPushed, float64(t.Pushed))
	c.emit(ch, fReducerReduced, float64(t.Reduced))
	c.emit(ch, fReducerApplied, float64(t.Applied))
	c.emit(ch, fReducerSteps, float64(t.Steps))
	c.emit(ch, fReducerQueue, float64(st.QueueDepth))
	c.emit(ch, fReducerLost, float64(t.Dropped[reduce.ReasonLost]))
	for _, r := range dropReasons {
		c.emit(ch, fReducerDropped, float64(t.Dropped[r]), string(r))
	}
	for r, n := range t.Dropped {
		if r != reduce.ReasonLost && !slices.Contains(dropReasons, r) {
			c.emit(ch, fReducerDropped, float64(n), string(r)) // a reason added later
		}
	}
	models := make([]reducerModel, 0, len(st.Models))
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		m := st.Models[name]
		models = append(models, reducerModel{Name: name, Version: m.Version, Applied: m.Counters.Applied, OptimizerSteps: m.OptimizerSteps})
	}
	for _, m := range c.reducerLabels.split(models, c.max, reducerSum) {
		c.emit(ch, fReducerModelVer, float64(m.Version), m.Name)
		c.emit(ch, fReducerModelApp, float64(m.Applied), m.Name)
		c.emit(ch, fReducerModelOpt, float64(m.OptimizerSteps), m.Name)
	}
	var h reducer.LatencyHistogram
	if c.src.ReducerLatency != nil {
		h = c.src.ReducerLatency()
	}
	buckets := make(map[float64]uint64, len(reducer.LatencyBuckets))
	for i, b := range reducer.LatencyBuckets {
		if i < len(h.Counts) {
			buckets[b] = h.Counts[i]
		} else {
			buckets[b] = 0
		}
	}
	ch <- prometheus.MustNewConstHistogram(c.descs[fReducerLatency.Name], h.Count, h.Sum.Seconds(), buckets)
}

func (c *statsCollector) collectStore(ch chan<- prometheus.Metric, st store.Stats) {
	models := c.storeLabels.split(st.Models, c.max, storeSum(st.UnlistedRefused))
	for _, m := range models {
		c.emit(ch, fStoreVersion, float64(m.Version), m.Name)
		c.emit(ch, fStoreBytes, float64(m.Bytes), m.Name)
		c.emit(ch, fStoreRetained, float64(m.RetainedBytes), m.Name)
		c.emit(ch, fStorePushes, float64(m.Pushes), m.Name)
		c.emit(ch, fStoreRefused, float64(m.Refused), m.Name)
		c.emit(ch, fStoreReads, float64(m.Reads), m.Name)
		c.emit(ch, fStoreReadBytes, float64(m.ReadBytes), m.Name)
	}
}

// stickyLabels decides which models a family with a capped model label
// labels by name (at most maxNamed) and which are summed as OtherLabel, so
// that the counters stay counters. A model keeps its label for as long as
// its source lists it, and one summed as "other" stays there: a new model
// sorting first no longer moves a named one into "other" (which jumped up
// by its counts), nor does a deletion move one out (which made "other"
// fall). "other" also keeps what the models it summed had counted when
// they left the list (their last scraped counts). A label freed by a
// model that left goes to a model first listed after. The store's
// families use it (storeSum), the reducer's per-model ones (reducerSum)
// and the aggregator's per-learner one (learnerSum).
type stickyLabels[T any] struct {
	mu     sync.Mutex
	named  map[string]bool
	others map[string]T // the models summed as other, as last scraped
	gone   T            // the counts of those that left the list
	shown  bool         // "other" has been exported: it stays
}

// labelSum says how one source's per-model entries are summed as "other".
type labelSum[T any] struct {
	name func(T) string
	// retire adds to gone the counters of last, a model summed as other
	// that left the list.
	retire func(gone *T, last T)
	// other is the "other" entry before the listed models are folded in:
	// named OtherLabel, holding gone's counters (and whatever the source
	// counts as other of its own).
	other func(gone T) T
	// fold adds m to the "other" entry o: counters and sizes summed,
	// versions the largest.
	fold func(o *T, m T)
	// counted reports whether o has counted anything (then "other" is
	// exported from then on).
	counted func(o T) bool
}

// split returns the models to export (models sorted by name): the named
// ones, sorted by name, then "other" when it sums anything.
func (l *stickyLabels[T]) split(models []T, maxNamed int, s labelSum[T]) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.named == nil {
		l.named, l.others = map[string]bool{}, map[string]T{}
	}
	live := make(map[string]bool, len(models))
	for _, m := range models {
		live[s.name(m)] = true
	}
	for name, last := range l.others {
		if !live[name] {
			s.retire(&l.gone, last)
			delete(l.others, name)
		}
	}
	for name := range l.named {
		if !live[name] {
			delete(l.named, name)
		}
	}
	out := make([]T, 0, min(len(models), maxNamed)+1)
	o := s.other(l.gone)
	for _, m := range models { // sorted by name: the first listed take the free labels
		name := s.name(m)
		if _, summed := l.others[name]; !summed && !l.named[name] {
			// A model named OtherLabel is summed: under its own name it
			// would repeat the sum's label set and fail the whole scrape.
			if len(l.named) < maxNamed && name != OtherLabel {
				l.named[name] = true
			}
		}
		if l.named[name] {
			out = append(out, m)
			continue
		}
		l.others[name] = m
		s.fold(&o, m)
	}
	if len(l.others) > 0 || s.counted(o) {
		l.shown = true
	}
	if l.shown {
		out = append(out, o)
	}
	return out
}

// storeSum sums the store's models as "other"; "other" also counts the
// pushes refused on names that held no version (store.Stats.UnlistedRefused).
func storeSum(unlistedRefused uint64) labelSum[store.ModelStats] {
	return labelSum[store.ModelStats]{
		name: func(m store.ModelStats) string { return m.Name },
		retire: func(gone *store.ModelStats, last store.ModelStats) {
			gone.Pushes += last.Pushes
			gone.Refused += last.Refused
			gone.Reads += last.Reads
			gone.ReadBytes += last.ReadBytes
		},
		other: func(gone store.ModelStats) store.ModelStats {
			return store.ModelStats{Name: OtherLabel, Pushes: gone.Pushes, Refused: gone.Refused + unlistedRefused,
				Reads: gone.Reads, ReadBytes: gone.ReadBytes}
		},
		fold: func(o *store.ModelStats, m store.ModelStats) {
			o.Version = max(o.Version, m.Version)
			o.Bytes += m.Bytes
			o.RetainedBytes += m.RetainedBytes
			o.Pushes += m.Pushes
			o.Refused += m.Refused
			o.Reads += m.Reads
			o.ReadBytes += m.ReadBytes
		},
		counted: func(o store.ModelStats) bool { return o.Pushes+o.Refused+o.Reads > 0 },
	}
}

// reducerModel is what the reducer's per-model families export of one
// model registered with the primary.
type reducerModel struct {
	Name                             string
	Version, Applied, OptimizerSteps uint64
}

// reducerSum sums the reducer's models as "other": applied (a counter)
// and optimizer steps summed, the version the largest.
var reducerSum = labelSum[reducerModel]{
	name:   func(m reducerModel) string { return m.Name },
	retire: func(gone *reducerModel, last reducerModel) { gone.Applied += last.Applied },
	other:  func(gone reducerModel) reducerModel { return reducerModel{Name: OtherLabel, Applied: gone.Applied} },
	fold: func(o *reducerModel, m reducerModel) {
		o.Version = max(o.Version, m.Version)
		o.Applied += m.Applied
		o.OptimizerSteps += m.OptimizerSteps
	},
	counted: func(o reducerModel) bool { return o.Applied > 0 },
}

// learnerSum sums the aggregator's learners as "other": their task
// counters, and those of the learners summed there that left.
var learnerSum = labelSum[aggregator.LearnerStats]{
	name: func(l aggregator.LearnerStats) string { return l.ID },
	retire: func(gone *aggregator.LearnerStats, last aggregator.LearnerStats) {
		gone.TasksDone += last.TasksDone
		gone.TasksFailed += last.TasksFailed
	},
	other: func(gone aggregator.LearnerStats) aggregator.LearnerStats {
		return aggregator.LearnerStats{ID: OtherLabel, TasksDone: gone.TasksDone, TasksFailed: gone.TasksFailed}
	},
	fold: func(o *aggregator.LearnerStats, l aggregator.LearnerStats) {
		o.TasksDone += l.TasksDone
		o.TasksFailed += l.TasksFailed
	},
	counted: func(o aggregator.LearnerStats) bool { return o.TasksDone+o.TasksFailed > 0 },
}

// cappedCollectors returns the max collectors with the largest lag (ties
// by id) and, when there are more, one "other" entry with the lowest
// version and the largest lag of the rest.
func cappedCollectors(cs []wsync.CollectorLag, maxN int) []wsync.CollectorLag {
	s := slices.Clone(cs)
	slices.SortFunc(s, func(a, b wsync.CollectorLag) int {
		if c := cmp.Compare(b.Lag, a.Lag); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(s) <= maxN {
		return s
	}
	s = othersLast(s, func(c wsync.CollectorLag) string { return c.ID }) // see collectStore
	o := wsync.CollectorLag{ID: OtherLabel, Version: s[maxN].Version, Lag: s[maxN].Lag}
	for _, c := range s[maxN:] {
		o.Version = min(o.Version, c.Version)
		o.Lag = max(o.Lag, c.Lag)
	}
	return append(s[:maxN], o)
}

// syncModels returns at most maxN of weight sync's models (sorted by
// name): those with a stored version first, then those without one. Any
// worker token may report collectors of names the store never had; kept
// by name alone, fifty such names sorting before a real model's would hide
// that model's lag from the metrics and the dashboard.
func syncModels(ms []wsync.ModelStatus, maxN int) []wsync.ModelStatus {
	if len(ms) <= maxN {
		return ms
	}
	out := make([]wsync.ModelStatus, 0, maxN)
	for _, versioned := range []bool{true, false} {
		for _, m := range ms {
			if len(out) < maxN && (m.Newest > 0) == versioned {
				out = append(out, m)
			}
		}
	}
	return out
}

func (c *statsCollector) collectSync(ch chan<- prometheus.Metric, st wsync.Stats) {
	c.emit(ch, fSyncStreams, float64(st.Streams))
	c.emit(ch, fSyncSent, float64(st.VersionsSent))
	c.emit(ch, fSyncSentBytes, float64(st.BytesSent))
	c.emit(ch, fSyncReports, float64(st.Reports))
	for _, m := range syncModels(st.Models, c.max) {
		c.emit(ch, fSyncNewest, float64(m.Newest), m.Model)
		c.emit(ch, fSyncCollectors, float64(len(m.Collectors)), m.Model)
		for _, cl := range cappedCollectors(m.Collectors, c.max) {
			c.emit(ch, fSyncVersion, float64(cl.Version), m.Model, cl.ID)
			c.emit(ch, fSyncLag, float64(cl.Lag), m.Model, cl.ID)
		}
		buckets := map[float64]uint64{}
		var cum, sum uint64
		for i, b := range m.Histogram {
			cum += b.Count
			if i < len(m.Histogram)-1 { // the last bucket is +Inf
				buckets[float64(b.Max)] = cum
			}
		}
		for _, cl := range m.Collectors {
			sum += cl.Lag
		}
		ch <- prometheus.MustNewConstHistogram(c.descs[fSyncLagHist.Name], uint64(len(m.Collectors)), float64(sum), buckets, m.Model)
	}
}

func (c *statsCollector) collectAggregator(ch chan<- prometheus.Metric, st aggregator.Stats) {
	c.emit(ch, fAggLearners, float64(len(st.Learners)))
	c.emit(ch, fAggAttached, float64(st.Attached))
	c.emit(ch, fAggRemoved, float64(st.Removed))
	c.emit(ch, fAggLearn, float64(st.LearnOK), "ok")
	c.emit(ch, fAggLearn, float64(st.LearnFailed), "failed")
	c.emit(ch, fAggResplits, float64(st.Resplits))
	ls := slices.Clone(st.Learners)
	slices.SortFunc(ls, func(a, b aggregator.LearnerStats) int { return strings.Compare(a.ID, b.ID) })
	for _, l := range c.learnerLabels.split(ls, c.max, learnerSum) {
		c.emit(ch, fAggLearnerTasks, float64(l.TasksDone), l.ID, "done")
		c.emit(ch, fAggLearnerTasks, float64(l.TasksFailed), l.ID, "failed")
	}
}

func (c *statsCollector) collectARS(ch chan<- prometheus.Metric, st arsrpc.Stats) {
	var running, done int
	for _, r := range st.Runs {
		if r.Done {
			done++
		} else {
			running++
		}
	}
	c.emit(ch, fARSRuns, float64(running), "running")
	c.emit(ch, fARSRuns, float64(done), "done")
	c.emit(ch, fARSWorkers, float64(st.Workers))
	c.emit(ch, fARSReassigned, float64(st.Reassigned))
	runs := st.Runs
	if len(runs) > c.max { // the newest runs: start order, so the tail
		runs = runs[len(runs)-c.max:]
	}
	for _, r := range runs {
		c.emit(ch, fARSIteration, float64(r.Iteration), r.ID, r.Env)
		c.emit(ch, fARSEpisodes, float64(r.Episodes), r.ID, r.Env)
		c.emit(ch, fARSSteps, float64(r.Steps), r.ID, r.Env)
		if s := r.Elapsed.Seconds(); s > 0 {
			c.emit(ch, fARSStepsRate, float64(r.Steps)/s, r.ID, r.Env)
		}
		if r.HasEval {
			c.emit(ch, fARSEval, r.EvalMean, r.ID, r.Env)
		}
		if r.HasTrain {
			c.emit(ch, fARSTrain, r.TrainMean, r.ID, r.Env)
		}
	}
}

// othersLast returns s (a fresh slice) with the entries whose label value
// is OtherLabel moved to the end, the others' order kept: a list cut at a
// cap then folds a real "other" (a model, collector or learner so named by
// its client) into the overflow bucket instead of exporting two samples
// with one label set, which fails the whole scrape.
func othersLast[T any](s []T, label func(T) string) []T {
	out := make([]T, 0, len(s))
	var others []T
	for _, e := range s {
		if label(e) == OtherLabel {
			others = append(others, e)
		} else {
			out = append(out, e)
		}
	}
	return append(out, others...)
}
