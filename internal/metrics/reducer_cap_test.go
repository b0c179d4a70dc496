package metrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// reducerModelSeries returns rlhub_reducer_model_applied_total by model.
func reducerModelSeries(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	if f := fams["rlhub_reducer_model_applied_total"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "model" {
					out[l.GetValue()] = m.Counter.GetValue()
				}
			}
		}
	}
	return out
}

// TestReducerModelLabelsAreSticky: a hub with more reducer models than
// the label cap (50). The per-model families were cut at the cap by name
// with no "other": the 51st model's applied gradients were in no series,
// and registering a model that sorts first silently removed a named
// model's series (m49's). Now the first 50 keep their labels while they
// are registered and the rest are summed as model="other", a counter.
func TestReducerModelLabelsAreSticky(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Reducer: reducer.Config{BatchSize: 1, MaxWait: time.Millisecond}})
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: h.Addr().String(), ClientID: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	applied := 0
	// addModel stores version 1 of name, registers it with the reducer
	// over gRPC and has one gradient applied to it.
	addModel := func(name string) {
		t.Helper()
		if _, err := h.Store().Push(ctx, store.PushRequest{Name: name, Version: 1, Expect: 0, Blob: tinyBlob(t)}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: name, Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
			t.Fatalf("register %s: %v", name, err)
		}
		g := tensor.NewF32("w", 4)
		f, _ := g.Float32s()
		f[0] = 1
		sd, err := tensor.NewStateDict(g)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.PushGrad(ctx, name, 1, sd); err != nil {
			t.Fatalf("push to %s: %v", name, err)
		}
		applied++
		testkit.Eventually(t, 20*time.Second, "the gradient to "+name+" applied", func() bool {
			v, _ := value(scrape(t, h.MetricsAddr()), "rlhub_reducer_gradients_applied_total")
			return v == float64(applied)
		})
	}
	for i := range 51 { // m00..m50: m50 is past the cap of 50
		addModel(fmt.Sprintf("m%02d", i))
	}
	sum := func(s map[string]float64) (n float64) {
		for _, v := range s {
			n += v
		}
		return n
	}
	s0 := reducerModelSeries(scrape(t, h.MetricsAddr()))
	if len(s0) != 51 || s0["m00"] != 1 || s0["m49"] != 1 || s0["other"] != 1 {
		t.Errorf("%d series (want m00..m49 and other, each 1): %v", len(s0), s0)
	}
	if n := sum(s0); n != float64(applied) {
		t.Errorf("the per-model series count %v gradients applied, the hub %d: some model's are in no series", n, applied)
	}
	// A model "a" sorting first: no label is free, so it is summed in
	// "other", and no named model loses its series.
	addModel("a")
	fams := scrape(t, h.MetricsAddr())
	s1 := reducerModelSeries(fams)
	for name, before := range s0 {
		after, ok := s1[name]
		if !ok {
			t.Errorf("registering model a removed model %s's series", name)
		} else if after < before {
			t.Errorf("counter %s fell from %v to %v", name, before, after)
		}
	}
	if _, ok := s1["a"]; ok {
		t.Errorf("model a took a label past the cap")
	}
	if d := s1["other"] - s0["other"]; d != 1 {
		t.Errorf("one gradient applied to model a moved other by %v, want 1", d)
	}
	if n := sum(s1); n != float64(applied) {
		t.Errorf("the per-model series count %v gradients applied, the hub %d", n, applied)
	}
	// The gauges: "other" carries the largest version of what it sums.
	if v, ok := value(fams, "rlhub_reducer_model_version", "model=other"); !ok || v != 2 {
		t.Errorf("rlhub_reducer_model_version{model=other} = %v (found %v), want 2", v, ok)
	}
	if v, ok := value(fams, "rlhub_reducer_model_optimizer_steps", "model=other"); !ok || v != 2 {
		t.Errorf("rlhub_reducer_model_optimizer_steps{model=other} = %v (found %v), want 2 (m50's and a's steps)", v, ok)
	}
}
