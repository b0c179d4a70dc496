package metrics_test

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The hub's /metrics, scraped over HTTP while the test drives every
// service, counts exactly what the test did.
func TestScrapeCountsWhatTheHubDid(t *testing.T) {
	r := startRig(t)
	before := scrape(t, r.h.MetricsAddr())

	// Reducer: n good gradients and one with a NaN (dropped as nonfinite).
	const n = 10
	r.pushGrads(t, n)
	bad := tensor.NewF32("w", 4)
	f, _ := bad.Float32s()
	f[0] = float32(math.NaN())
	sd, _ := tensor.NewStateDict(bad)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.rc.PushGrad(ctx, rigModel, 1, sd); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("NaN gradient: err %v, want invalid", err)
	}
	const pushed = n + 1
	outcomes := func(fams map[string]*dto.MetricFamily) float64 {
		a, _ := value(fams, "rlhub_reducer_gradients_applied_total")
		d, _ := value(fams, "rlhub_reducer_gradients_dropped_total")
		l, _ := value(fams, "rlhub_reducer_gradients_lost")
		return a + d + l
	}
	var after map[string]*dto.MetricFamily
	testkit.Eventually(t, 30*time.Second, "every pushed gradient applied, dropped or lost", func() bool {
		after = scrape(t, r.h.MetricsAddr())
		return outcomes(after)-outcomes(before) == pushed
	})
	delta := func(name string, labels ...string) float64 {
		a, _ := value(after, name, labels...)
		b, _ := value(before, name, labels...)
		return a - b
	}
	if d := delta("rlhub_reducer_gradients_pushed_total"); d != pushed {
		t.Errorf("pushed rose by %v, want %d", d, pushed)
	}
	if d := delta("rlhub_reducer_gradients_dropped_total", "reason=nonfinite"); d != 1 {
		t.Errorf("dropped{nonfinite} rose by %v, want 1", d)
	}
	if d := delta("rlhub_reducer_gradients_applied_total"); d != n {
		t.Errorf("applied rose by %v, want %d", d, n)
	}
	if d := delta("rlhub_reducer_model_applied_total", "model="+rigModel); d != n {
		t.Errorf("applied to %s rose by %v, want %d", rigModel, d, n)
	}
	steps := delta("rlhub_reducer_steps_total")
	if steps < 1 {
		t.Errorf("no optimizer step counted")
	}
	if lat, _ := value(after, "rlhub_reducer_publish_latency_seconds"); lat != steps {
		t.Errorf("latency histogram holds %v batches, want one per step (%v)", lat, steps)
	}

	// Store: version = 1 + steps; the pushes counted.
	snap, err := r.h.Store().Get(ctx, rigModel, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := value(after, "rlhub_store_model_version", "model="+rigModel); v != float64(snap.Version) || v != 1+steps {
		t.Errorf("store version metric %v, store %d, 1 + steps %v", v, snap.Version, 1+steps)
	}
	if v, _ := value(after, "rlhub_store_model_bytes", "model="+rigModel); v != float64(len(snap.Blob)) {
		t.Errorf("store bytes %v, want %d", v, len(snap.Blob))
	}
	if v, _ := value(after, "rlhub_reducer_model_version", "model="+rigModel); v != float64(snap.Version) {
		t.Errorf("reducer's version of %s %v, store has %d", rigModel, v, snap.Version)
	}
	if d := delta("rlhub_store_pushes_total", "model="+rigModel); d != steps {
		t.Errorf("store pushes rose by %v, want %v", d, steps)
	}

	// Weight sync: a collector still on version 1 lags by newest − 1.
	r.report(t, "slow-collector", 1)
	r.report(t, "fresh-collector", snap.Version)
	// Learner: one task through the aggregator.
	r.learn(t)
	// ARS: a 3-iteration run.
	runID := r.startARS(t, 3)
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	last := watchARS(t, wctx, r.ars, runID)

	after = scrape(t, r.h.MetricsAddr())
	worker := scrape(t, r.workerAddr)
	if v, _ := value(after, "rlhub_sync_collector_lag", "collector=slow-collector"); v != float64(snap.Version-1) {
		t.Errorf("slow collector lag %v, want %d", v, snap.Version-1)
	}
	if v, _ := value(after, "rlhub_sync_collector_lag", "collector=fresh-collector"); v != 0 {
		t.Errorf("fresh collector lag %v, want 0", v)
	}
	if v, _ := value(after, "rlhub_sync_lag", "model="+rigModel); v != 2 {
		t.Errorf("lag histogram counts %v collectors, want 2", v)
	}
	if v, _ := value(after, "rlhub_aggregator_learners"); v != 1 {
		t.Errorf("learners %v, want 1", v)
	}
	if v, _ := value(after, "rlhub_aggregator_learn_total", "outcome=ok"); v != 1 {
		t.Errorf("learn ok %v, want 1", v)
	}
	if v, _ := value(after, "rlhub_aggregator_learner_tasks_total", "learner=learner-1", "outcome=done"); v != 1 {
		t.Errorf("learner-1 tasks done %v, want 1", v)
	}
	if v, _ := value(after, "rlhub_ars_iteration", "run="+runID); v != float64(last.Iteration+1) {
		t.Errorf("ARS iteration %v, want %d", v, last.Iteration+1)
	}
	if v, _ := value(after, "rlhub_ars_env_steps_total", "run="+runID); v != float64(last.Steps) {
		t.Errorf("ARS steps %v, want %d", v, last.Steps)
	}
	if v, ok := value(after, "rlhub_ars_eval_return", "run="+runID); !ok || v != last.EvalMean {
		t.Errorf("ARS eval return %v (present %v), want %v", v, ok, last.EvalMean)
	}
	if v, _ := value(after, "rlhub_ars_runs", "state=done"); v != 1 {
		t.Errorf("ARS runs done %v, want 1", v)
	}
	if v, _ := value(worker, "rlhub_ars_worker_env_steps_total"); v < float64(last.Steps) {
		t.Errorf("worker env steps %v, below the run's %d (one worker ran every task)", v, last.Steps)
	}
	if v, _ := value(after, "rlhub_grpc_server_handled_total", "grpc_method=StartRun", "grpc_code=OK"); v != 1 {
		t.Errorf("gRPC StartRun handled OK %v, want 1", v)
	}

	// Every documented family is there (the worker's on its own endpoint),
	// and the Go runtime's.
	for _, f := range metrics.Families() {
		if strings.HasPrefix(f.Name, "rlhub_auth_") {
			continue // a hub with tokens only: TestEndpointSecureByDefault
		}
		if strings.HasPrefix(f.Name, "rlhub_cluster_") {
			continue // serve --etcd only: internal/replica's TestStandbysServeClusterMetrics
		}
		if strings.HasPrefix(f.Name, "rlhub_relay_") {
			continue // rlhub relay only: internal/cli's TestRelayExportsItsRefusals
		}
		if after[f.Name] == nil && worker[f.Name] == nil {
			t.Errorf("documented metric %s missing from /metrics", f.Name)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total"} {
		if after[name] == nil {
			t.Errorf("runtime metric %s missing", name)
		}
	}
	for name := range after {
		if !strings.HasPrefix(name, "rlhub_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
			t.Errorf("unexpected metric %s (names are rlhub_*, go_*, process_*)", name)
		}
	}
}

// watchARS follows a run to its end and returns the last progress.
func watchARS(t *testing.T, ctx context.Context, c pb.ARSClient, runID string) *pb.ARSProgress {
	t.Helper()
	stream, err := c.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var last *pb.ARSProgress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("watch %s: %v", runID, err)
		}
		last = p
		if p.Done {
			break
		}
	}
	if last == nil || !last.Done {
		t.Fatalf("run %s did not finish: %v", runID, last)
	}
	return last
}

// docs/metrics.md has one table row per family, with the same type and
// labels, and no row for a family that does not exist.
func TestDocsTableMatchesFamilies(t *testing.T) {
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(rlhub_[a-z_]+)` \\| (counter|gauge|histogram) \\| ([^|]*) \\|")
	doc := map[string]string{}
	var order []string
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := doc[m[1]]; dup {
			t.Errorf("docs/metrics.md lists %s twice", m[1])
		}
		doc[m[1]] = m[2] + " " + strings.TrimSpace(strings.ReplaceAll(m[3], "`", ""))
		order = append(order, m[1])
	}
	var names []string
	for _, f := range metrics.Families() {
		names = append(names, f.Name)
		labels := strings.Join(f.Labels, ", ")
		if labels == "" {
			labels = "–"
		}
		want := f.Type + " " + labels
		got, ok := doc[f.Name]
		switch {
		case !ok:
			t.Errorf("docs/metrics.md has no row for %s (%s)", f.Name, want)
		case got != want:
			t.Errorf("docs/metrics.md row for %s says %q, code says %q", f.Name, got, want)
		}
	}
	for _, name := range order {
		if !slices.Contains(names, name) {
			t.Errorf("docs/metrics.md documents %s, which is not exported", name)
		}
	}
}
