package metrics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/wsync"
)

// Past the cap, collectors share collector="other" with the lowest version
// and the largest lag of the rest; the most-lagging keep their own label.
func TestCollectorLabelsCapped(t *testing.T) {
	var cs []wsync.CollectorLag
	for i := range 8 {
		cs = append(cs, wsync.CollectorLag{ID: fmt.Sprintf("c%d", i), Version: uint64(10 + i), Lag: uint64(7 - i)})
	}
	got := cappedCollectors(cs, 3)
	if len(got) != 4 {
		t.Fatalf("%d entries, want 3 + other", len(got))
	}
	for i, want := range []string{"c0", "c1", "c2", OtherLabel} {
		if got[i].ID != want {
			t.Errorf("entry %d is %s, want %s", i, got[i].ID, want)
		}
	}
	if o := got[3]; o.Version != 13 || o.Lag != 4 {
		t.Errorf("other = version %d lag %d, want 13 and 4", o.Version, o.Lag)
	}
}

// A scrape of many collectors and learners exports at most the cap + 1
// label values per family.
func TestScrapeBoundsCardinality(t *testing.T) {
	ms := wsync.ModelStatus{Model: "m", Newest: 100}
	var ls []aggregator.LearnerStats
	for i := range 500 {
		ms.Collectors = append(ms.Collectors, wsync.CollectorLag{ID: fmt.Sprintf("c%03d", i), Model: "m", Version: uint64(i % 100)})
		ls = append(ls, aggregator.LearnerStats{ID: fmt.Sprintf("l%03d", i), TasksDone: 1})
	}
	for i := range ms.Collectors {
		ms.Collectors[i].Lag = ms.Newest - ms.Collectors[i].Version
	}
	src := Sources{
		Sync:       func(context.Context) wsync.Stats { return wsync.Stats{Models: []wsync.ModelStatus{ms}} },
		Aggregator: func() aggregator.Stats { return aggregator.Stats{Learners: ls} },
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newStatsCollector(src, 50, time.Second))
	out, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range out {
		series[f.GetName()] = len(f.Metric)
		if f.GetName() != "rlhub_aggregator_learner_tasks_total" {
			continue
		}
		for _, m := range f.Metric {
			if strings.Contains(m.String(), `value:"other"`) && strings.Contains(m.String(), `value:"done"`) && m.Counter.GetValue() != 450 {
				t.Errorf("learner=other done = %v, want the 450 learners past the cap", m.Counter.GetValue())
			}
		}
	}
	if n := series["rlhub_sync_collector_lag"]; n != 51 {
		t.Errorf("collector lag series %d, want 51", n)
	}
	if n := series["rlhub_aggregator_learner_tasks_total"]; n != 2*51 {
		t.Errorf("learner task series %d, want 102", n)
	}
}
