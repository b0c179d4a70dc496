package metrics

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
)

//go:embed web
var webFS embed.FS

// State is the dashboard's JSON (/api/state): what each panel shows. Every
// list is bounded, whatever the process holds: Models, Collectors and
// Learners have at most Config.MaxLabelValues rows of their own and then
// one "other" row (Sum) summing the rest; Runs are the MaxLabelValues
// newest, each curve thinned to MaxCurvePoints points; the Cluster lists
// MaxLabelValues ids.
type State struct {
	Role       string           `json:"role"`
	Time       time.Time        `json:"time"`
	Models     []ModelState     `json:"models"`
	Reducer    *ReducerState    `json:"reducer,omitempty"`
	Collectors []CollectorState `json:"collectors"`
	Learners   []LearnerState   `json:"learners"`
	Runs       []RunState       `json:"runs"`
	Worker     *WorkerState     `json:"worker,omitempty"`
	// Cluster is this hub's place in its cluster (serve --etcd); nil for
	// a process outside one.
	Cluster *ClusterState `json:"cluster,omitempty"`
	// Refusals is what the process turned away for its clients' fault;
	// nil for one without a listener of its own to count them.
	Refusals *RefusalState `json:"refusals,omitempty"`
}

// RefusalState is what the process turned away for its clients' fault,
// from the same counts as rlhub_conns_refused_total,
// rlhub_grpc_streams_cut_total and rlhub_auth_calls_cut_total /
// rlhub_auth_quota_refusals_total. Each list has every name, zeros
// included, in a fixed order.
type RefusalState struct {
	// Conns are the connections closed, by reason (nil without a data
	// plane).
	Conns []Count `json:"conns"`
	// StreamsCut are the gRPC streams ended at a body's deadline, by
	// direction (received, sent; nil without the bound).
	StreamsCut []Count `json:"streams_cut"`
	// AuthCut and Quota (with tokens): calls ended because their token
	// was revoked, changed or expired, and pushes refused by a token's
	// quota, by quota (models, bytes, rate).
	AuthCut *uint64 `json:"auth_calls_cut,omitempty"`
	Quota   []Count `json:"quota"`
}

// Count is one named count.
type Count struct {
	Name string `json:"name"`
	N    uint64 `json:"n"`
}

// refusalState is the Turned away panel, or nil when src counts nothing
// of it.
func refusalState(src Sources) *RefusalState {
	if src.DataPlane == nil && src.GRPCBodies == nil && src.Auth == nil {
		return nil
	}
	r := &RefusalState{}
	if src.DataPlane != nil {
		d := src.DataPlane()
		for _, reason := range bulk.RefusalReasons {
			r.Conns = append(r.Conns, Count{reason, d.Refused[reason]})
		}
	}
	if src.GRPCBodies != nil {
		b := src.GRPCBodies()
		r.StreamsCut = []Count{{"received", b.Received}, {"sent", b.Sent}}
	}
	if src.Auth != nil {
		a := src.Auth()
		r.AuthCut = &a.CallsCut
		r.Quota = []Count{{"models", a.QuotaModelsFull}, {"bytes", a.QuotaBytesFull}, {"rate", a.QuotaRateFull}}
	}
	return r
}

// ModelState is one stored model, or the "other" row: the models the
// metrics sum as model="other" (the same models and figures).
type ModelState struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	Bytes   int64  `json:"bytes"`
	Pushes  uint64 `json:"pushes"`
	Reads   uint64 `json:"reads"`
	// Sum marks the "other" row (named OtherLabel; the last): Others
	// models listed now, its version their largest, its bytes their sum,
	// its pushes and reads theirs and those of the models summed there
	// that were deleted since.
	Sum    bool `json:"sum,omitempty"`
	Others int  `json:"others,omitempty"`
}

// ReducerState is the gradient flow: pushed → applied, dropped or lost.
type ReducerState struct {
	Pushed  uint64            `json:"pushed"`
	Reduced uint64            `json:"reduced"`
	Applied uint64            `json:"applied"`
	Dropped map[string]uint64 `json:"dropped"` // by reason, lost excluded
	Lost    uint64            `json:"lost"`
	Steps   uint64            `json:"steps"`
	Queue   int               `json:"queue"`
	P50ms   float64           `json:"p50_ms"`
	P99ms   float64           `json:"p99_ms"`
}

// CollectorState is one collector, or the "other" row.
type CollectorState struct {
	Model    string `json:"model"`
	ID       string `json:"id"`
	Version  uint64 `json:"version"`
	Newest   uint64 `json:"newest"`
	Lag      uint64 `json:"lag"`
	Via      string `json:"via"`
	Attached bool   `json:"attached"`
	// Sum marks the "other" row (ID OtherLabel; the last, present when
	// weight sync tracks collectors without a row of their own): Others
	// collectors, of any model (Model ""), Lag the largest of theirs.
	Sum    bool `json:"sum,omitempty"`
	Others int  `json:"others,omitempty"`
}

// LearnerState is one attached learner, or the "other" row: the learners
// the metrics sum as learner="other".
type LearnerState struct {
	ID          string `json:"id"`
	LeaseLeftMs int64  `json:"lease_left_ms"`
	Task        string `json:"task"`
	Done        uint64 `json:"done"`
	Failed      uint64 `json:"failed"`
	// Sum marks the "other" row (ID OtherLabel; the last): Others learners
	// attached now, Done and Failed theirs and those of the learners
	// summed there that left.
	Sum    bool `json:"sum,omitempty"`
	Others int  `json:"others,omitempty"`
}

// RunState is one ARS run with its evaluation curve.
type RunState struct {
	ID        string   `json:"id"`
	Env       string   `json:"env"`
	Model     string   `json:"model"`
	Iteration uint64   `json:"iteration"`
	Version   uint64   `json:"version"`
	Episodes  int64    `json:"episodes"`
	Steps     int64    `json:"steps"`
	StepsPerS float64  `json:"steps_per_s"`
	Eval      *float64 `json:"eval,omitempty"`
	Train     *float64 `json:"train,omitempty"`
	Done      bool     `json:"done"`
	Reason    string   `json:"reason"`
	// Curve is the evaluations (training episodes, eval mean), oldest
	// first, thinned to at most MaxCurvePoints (thinCurve); Evals is how
	// many the hub keeps (arsrpc.RunStats.Curve), all of which WatchRun
	// sends.
	Curve      [][2]float64 `json:"curve"`
	Evals      int          `json:"evals"`
	CurvePoint string       `json:"-"` // SVG polyline points for the page's first render
}

// MaxCurvePoints bounds each run's curve in State: the page polls every
// second and draws a circle per point on a 600-unit-wide plot, for up to
// MaxLabelValues runs of up to arsrpc.MaxCurvePoints evaluations each.
const MaxCurvePoints = 200

// WorkerState is an ARS worker's own counters.
type WorkerState struct {
	Tasks     int64  `json:"tasks"`
	Steps     int64  `json:"steps"`
	Pulls     int64  `json:"pulls"`
	Iteration uint64 `json:"iteration"`
}

// ClusterState is a cluster member's role and replication, from the same
// ClusterStats as the rlhub_cluster_* metrics.
type ClusterState struct {
	// Role is "primary", "standby" or "outside" (not a member: joining,
	// or out after a local fault).
	Role  string `json:"role"`
	Epoch uint64 `json:"epoch"`
	// Unit is the newest unit applied (standby) or asked for (primary).
	Unit    uint64 `json:"unit"`
	Applied uint64 `json:"applied"`
	// Synced: a standby holding a full copy of the primary it follows.
	Synced bool `json:"synced"`
	// KeepsInSync: a primary keeping the in-sync record (acks all), which
	// lists InSyncStandbys standbys, the only ones that may take over;
	// InSync are the first Config.MaxLabelValues of their ids, sorted.
	KeepsInSync    bool     `json:"keeps_in_sync"`
	InSyncStandbys int      `json:"in_sync_standbys"`
	InSync         []string `json:"in_sync"`
	// Warning, when not "", is what the operator must act on.
	Warning string `json:"warning,omitempty"`
	// Standbys are the primary's connected standbys (Connected of them),
	// the first Config.MaxLabelValues by id.
	Standbys  []StandbyState `json:"standbys"`
	Connected int            `json:"connected"`
	Faults    uint64         `json:"faults"`
	Scrubs    uint64         `json:"scrubs"`
	Damaged   uint64         `json:"damaged_files"`
}

// StandbyState is one standby connected to the primary.
type StandbyState struct {
	ID string `json:"id"`
	// Lag is the units asked for that it has not acknowledged yet.
	Lag uint64 `json:"lag"`
	// InSync: the in-sync record lists it.
	InSync bool `json:"in_sync"`
}

// noTakeOver is the warning of a primary whose in-sync record lists no
// standby (docs/cluster.md, "Who may take over").
const noTakeOver = "the in-sync record lists no standby: no standby may take over; if this primary dies, no hub serves until it is back"

// clusterState is the Cluster panel for cs, its lists bounded to maxN.
func clusterState(cs ClusterStats, maxN int) *ClusterState {
	c := &ClusterState{Role: "standby", Epoch: cs.Epoch, Unit: cs.Unit, Applied: cs.Applied, Synced: cs.Synced,
		Faults: cs.Faults, Scrubs: cs.Scrubs, Damaged: cs.DamagedFiles, InSync: []string{}, Standbys: []StandbyState{}}
	switch {
	case cs.Outside:
		c.Role = "outside"
	case cs.Primary:
		c.Role = "primary"
	}
	if !cs.Primary {
		return c
	}
	c.KeepsInSync, c.InSyncStandbys = cs.KeepsInSync, len(cs.InSync)
	if c.KeepsInSync {
		c.InSync = append(c.InSync, cs.InSync...) // never null: the page reads its length
		slices.Sort(c.InSync)
		c.InSync = c.InSync[:min(len(c.InSync), maxN)]
		if c.InSyncStandbys == 0 {
			c.Warning = noTakeOver
		}
	}
	c.Connected = len(cs.Lag)
	for _, m := range lagMembers(cs.Lag, maxN) {
		c.Standbys = append(c.Standbys, StandbyState{ID: m, Lag: cs.Lag[m], InSync: slices.Contains(cs.InSync, m)})
	}
	return c
}

type dashboard struct {
	cfg  Config
	page *template.Template
	// labels is the /metrics collector, whose sticky labels (storeLabels,
	// learnerLabels) decide which models and learners have a row of their
	// own here too: the page's "other" rows are the metrics' "other".
	labels *statsCollector
	// states shares one reading of the Sources between the requests of
	// Config.StateReuse (shared).
	states shared[State]
}

func newDashboard(cfg Config, labels *statsCollector) *dashboard {
	page := template.Must(template.New("index.html").Funcs(template.FuncMap{
		"bytes": humanBytes,
		"ms":    func(f float64) string { return fmt.Sprintf("%.1f", f) },
		"num":   func(p *float64) string { return fmtOpt(p) },
	}).ParseFS(webFS, "web/index.html"))
	return &dashboard{cfg: cfg, page: page, labels: labels, states: shared[State]{reuse: cfg.StateReuse}}
}

func (d *dashboard) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", d.index)
	mux.HandleFunc("GET /api/state", d.api)
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(mustSub(webFS, "web"))))
}

func (d *dashboard) index(w http.ResponseWriter, _ *http.Request) {
	st := d.current()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := d.page.Execute(w, st); err != nil {
		d.cfg.Logger.Warn("metrics: dashboard page", "err", err)
	}
}

func (d *dashboard) api(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(d.current()); err != nil {
		d.cfg.Logger.Debug("metrics: dashboard state", "err", err)
	}
}

// current is the dashboard's State: read now, or shared with the
// requests around it (states). The State is shared: read it only.
func (d *dashboard) current() State { return d.states.get(d.state) }

// state reads every source once. It runs for every request that shares
// its result, so no one request's context bounds it: StatsTimeout does.
func (d *dashboard) state() State {
	src, maxN := d.cfg.Sources, d.cfg.MaxLabelValues
	st := State{Role: d.cfg.Role, Time: time.Now().UTC(), Models: []ModelState{}, Collectors: []CollectorState{}, Learners: []LearnerState{}, Runs: []RunState{}}
	if src.Store != nil {
		ss := src.Store()
		rows := d.labels.storeLabels.split(ss.Models, maxN, storeSum(ss.UnlistedRefused))
		for _, m := range rows {
			st.Models = append(st.Models, ModelState{Name: m.Name, Version: m.Version, Bytes: m.Bytes, Pushes: m.Pushes, Reads: m.Reads})
		}
		if named := len(rows) - 1; len(rows) > 0 && rows[named].Name == OtherLabel { // split names no model "other"
			st.Models[named].Sum, st.Models[named].Others = true, len(ss.Models)-named
		}
	}
	if src.Reducer != nil {
		rs := src.Reducer()
		t := rs.Total
		red := &ReducerState{Pushed: t.Pushed, Reduced: t.Reduced, Applied: t.Applied, Steps: t.Steps, Queue: rs.QueueDepth,
			Lost: t.Dropped[reduce.ReasonLost], Dropped: map[string]uint64{},
			P50ms: float64(rs.P50) / float64(time.Millisecond), P99ms: float64(rs.P99) / float64(time.Millisecond)}
		for r, n := range t.Dropped {
			if r != reduce.ReasonLost && n > 0 {
				red.Dropped[string(r)] = n
			}
		}
		st.Reducer = red
	}
	if src.Sync != nil {
		sctx, cancel := context.WithTimeout(context.Background(), d.cfg.StatsTimeout)
		ss := src.Sync(sctx)
		cancel()
		st.Collectors = collectorRows(ss.Models, maxN)
	}
	if src.Aggregator != nil {
		ls := slices.Clone(src.Aggregator().Learners)
		slices.SortFunc(ls, func(a, b aggregator.LearnerStats) int { return strings.Compare(a.ID, b.ID) })
		for _, l := range d.labels.learnerLabels.split(ls, maxN, learnerSum) {
			st.Learners = append(st.Learners, LearnerState{ID: l.ID, LeaseLeftMs: l.LeaseLeft.Milliseconds(), Task: l.StartedTask, Done: l.TasksDone, Failed: l.TasksFailed})
		}
		if named := len(st.Learners) - 1; named >= 0 && st.Learners[named].ID == OtherLabel { // split names no learner "other"
			st.Learners[named].Sum, st.Learners[named].Others = true, len(ls)-named
		}
	}
	if src.ARS != nil {
		runs := src.ARS().Runs
		if len(runs) > maxN {
			runs = runs[len(runs)-maxN:]
		}
		for i := len(runs) - 1; i >= 0; i-- { // newest first
			r := runs[i]
			rs := RunState{ID: r.ID, Env: r.Env, Model: r.Model, Iteration: r.Iteration, Version: r.Version, Episodes: r.Episodes,
				Steps: r.Steps, Done: r.Done, Reason: r.Reason, Curve: thinCurve(r.Curve, MaxCurvePoints), Evals: len(r.Curve)}
			if s := r.Elapsed.Seconds(); s > 0 {
				rs.StepsPerS = float64(r.Steps) / s
			}
			if r.HasEval {
				v := r.EvalMean
				rs.Eval = &v
			}
			if r.HasTrain {
				v := r.TrainMean
				rs.Train = &v
			}
			rs.CurvePoint = polyline(rs.Curve, curveW, curveH)
			st.Runs = append(st.Runs, rs)
		}
	}
	if w := src.Worker; w != nil {
		st.Worker = &WorkerState{Tasks: w.Tasks.Load(), Steps: w.Steps.Load(), Pulls: w.Pulls.Load(), Iteration: w.Iteration.Load()}
	}
	if src.Cluster != nil {
		st.Cluster = clusterState(src.Cluster(), maxN)
	}
	st.Refusals = refusalState(src)
	return st
}

// collectorRows are the Collectors panel's rows: the maxN most-lagging
// collectors (ties: those of models with a stored version first, so names
// the store never had cannot crowd a real model's collectors out, as in
// syncModels; then by model and id), and one "other" row for every
// collector without a row, with the largest lag of theirs. maxN rows in
// all, not maxN per model of maxN models as the metrics label: the page
// redraws the panel every second.
func collectorRows(ms []wsync.ModelStatus, maxN int) []CollectorState {
	rows := []CollectorState{}
	// The first maxN of all are among the first maxN of each model
	// (cappedCollectors: most-lagging, then by id) of syncModels' models.
	for _, m := range syncModels(ms, maxN) {
		cs := cappedCollectors(m.Collectors, maxN)
		if len(m.Collectors) > maxN {
			cs = cs[:maxN] // without its "other" entry: counted below
		}
		for _, c := range cs {
			rows = append(rows, CollectorState{Model: m.Model, ID: c.ID, Version: c.Version, Newest: m.Newest, Lag: c.Lag, Via: c.Via, Attached: c.Attached})
		}
	}
	slices.SortFunc(rows, func(a, b CollectorState) int {
		if c := cmp.Compare(b.Lag, a.Lag); c != 0 {
			return c
		}
		if sa, sb := a.Newest > 0, b.Newest > 0; sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.ID, b.ID))
	})
	rows = rows[:min(len(rows), maxN)]
	shown := make(map[[2]string]bool, len(rows))
	for _, r := range rows {
		shown[[2]string{r.Model, r.ID}] = true
	}
	o := CollectorState{ID: OtherLabel, Sum: true}
	for _, m := range ms {
		for _, c := range m.Collectors {
			if !shown[[2]string{m.Model, c.ID}] {
				o.Others++
				o.Lag = max(o.Lag, c.Lag)
			}
		}
	}
	if o.Others > 0 {
		rows = append(rows, o)
	}
	return rows
}

// thinCurve returns c's points (training episodes, eval mean), all of
// them when there are at most maxPts (≥ 4), else at most maxPts: the
// first, the newest, and of the evaluations between, split into
// (maxPts-2)/2 stretches of consecutive ones, each stretch's lowest and
// highest, in order. Lowest and highest rather than every k-th: the plot
// scales and labels its axes to the points' range, which stays the full
// curve's, and a one-evaluation collapse or spike still shows, where
// every k-th would drop it, or show it on one poll and not the next as
// the curve grows.
func thinCurve(c []arsrpc.CurvePoint, maxPts int) [][2]float64 {
	out := make([][2]float64, 0, min(len(c), maxPts))
	add := func(p arsrpc.CurvePoint) { out = append(out, [2]float64{float64(p.Episodes), p.EvalMean}) }
	if len(c) <= maxPts {
		for _, p := range c {
			add(p)
		}
		return out
	}
	add(c[0])
	inner, stretches := c[1:len(c)-1], (maxPts-2)/2
	for s := range stretches { // len(inner) > stretches: none is empty
		seg := inner[s*len(inner)/stretches : (s+1)*len(inner)/stretches]
		lo, hi := 0, 0
		for i, p := range seg {
			if p.EvalMean < seg[lo].EvalMean {
				lo = i
			}
			if p.EvalMean > seg[hi].EvalMean {
				hi = i
			}
		}
		add(seg[min(lo, hi)])
		if lo != hi {
			add(seg[max(lo, hi)])
		}
	}
	add(c[len(c)-1])
	return out
}

// The curve's SVG viewBox (the page's JS uses the same numbers).
const curveW, curveH, curveL = 600, 160, 56 // curveL: the y labels' margin

// polyline maps points onto a w×h box (y up) as SVG polyline points. It is
// the server-side twin of the page's plot() in web/app.js.
func polyline(pts [][2]float64, w, h float64) string {
	if len(pts) == 0 {
		return ""
	}
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		x0, x1, y0, y1 = min(x0, p[0]), max(x1, p[0]), min(y0, p[1]), max(y1, p[1])
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	if y1 == y0 {
		y1 = y0 + 1
	}
	var b strings.Builder
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", curveL+(p[0]-x0)/(x1-x0)*(w-curveL-4), h-14-(p[1]-y0)/(y1-y0)*(h-22))
	}
	return b.String()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func fmtOpt(p *float64) string {
	if p == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f", *p)
}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // dir is embedded: cannot fail
	}
	return sub
}
