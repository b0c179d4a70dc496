package metrics_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// learnerTaskSeries returns rlhub_aggregator_learner_tasks_total keyed by
// "learner/outcome".
func learnerTaskSeries(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams["rlhub_aggregator_learner_tasks_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		out[labels["learner"]+"/"+labels["outcome"]] = m.Counter.GetValue()
	}
	return out
}

// TestLearnerCountersStayCounters: a hub with more learners than the label
// cap (50). The learners past the cap were summed as learner="other" by
// their order at each scrape, so a learner attaching that sorts first
// moved a named learner's tasks into "other" (which rose with no task
// run), and one of those past the cap leaving made "other" fall: rate()
// reported a counter reset. Learners now keep their label, or their place
// in "other", while attached, as the store's models do, and "other" keeps
// the counts of its learners that left.
func TestLearnerCountersStayCounters(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	addr := h.Addr().String()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agg := aggregator.NewClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	defer wg.Wait()
	stops := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	attach := func(id string) {
		lctx, stop := context.WithCancel(context.Background())
		stops[id] = stop
		ex := &learner.Example{ID: id, BatchSize: 1}
		cfg := ex.Config(addr)
		cfg.Logger = testkit.Logger()
		wg.Add(1)
		go func() { defer wg.Done(); learner.Run(lctx, cfg) }()
	}
	attached := func(n int) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d learners attached", n), func() bool {
			st, err := agg.HubStats(ctx)
			return err == nil && len(st.Learners) == n
		})
	}
	for i := range 51 { // l00..l50: l50 is past the cap of 50
		attach(fmt.Sprintf("l%02d", i))
	}
	attached(51)
	// One task: each learner learns one row.
	if _, err := agg.Start(ctx, "task-1", map[string]any{"w": []any{0.0, 0.0}}); err != nil {
		t.Fatal(err)
	}
	if _, err := agg.GetDataDemand(ctx, "task-1"); err != nil {
		t.Fatal(err)
	}
	sd, err := tensor.NewStateDict(tensor.NewF32("x", 51, 2), tensor.NewF32("y", 51))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agg.Learn(ctx, "task-1", sd, nil); err != nil {
		t.Fatal(err)
	}
	s0 := learnerTaskSeries(scrape(t, h.MetricsAddr()))
	if s0["l00/done"] != 1 || s0["l49/done"] != 1 || s0["other/done"] != 1 {
		t.Fatalf("after one task: l00 %v, l49 %v, other %v; want 1 each: %v", s0["l00/done"], s0["l49/done"], s0["other/done"], s0)
	}
	// A learner "a" sorting first attaches, and l50 (in "other") leaves:
	// no task runs, so no counter may move.
	attach("a")
	attached(52)
	s1 := learnerTaskSeries(scrape(t, h.MetricsAddr()))
	stops["l50"]()
	attached(51)
	s2 := learnerTaskSeries(scrape(t, h.MetricsAddr()))
	for i, pair := range [][2]map[string]float64{{s0, s1}, {s1, s2}} {
		for k, before := range pair[0] {
			if after, ok := pair[1][k]; ok && after != before {
				t.Errorf("scrape %d: %s moved from %v to %v with no task run", i+1, k, before, after)
			}
		}
		if _, ok := pair[1]["l49/done"]; !ok {
			t.Errorf("scrape %d: l49 lost its label to a learner attached after it", i+1)
		}
	}
	if s2["other/done"] != 1 {
		t.Errorf("other/done %v after l50 left, want the 1 task it counted", s2["other/done"])
	}
}
