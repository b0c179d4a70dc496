package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A hub with thousands of models and collectors: each of the dashboard's
// model, collector and learner lists has at most Config.MaxLabelValues
// rows of their own and one "other" row summing the rest, so /api/state is
// bounded whatever the hub holds, and the models' "other" row says what
// the metrics' model="other" says. Before, the models past the cap were
// left out (the page's totals disagreed with /metrics) and the collectors
// listed 50 per model of 50 models: 2,550 rows, 1.5 MB of JSON (2.1 MB of
// page) per poll with 200-byte ids.
func TestDashboardListsBoundedWithOtherRow(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Conn: conn})
	if err != nil {
		t.Fatal(err)
	}
	const models, maxN = 5000, 50
	pad := strings.Repeat("x", 200)
	name := func(i int) string { return fmt.Sprintf("m%04d", i) }
	blob := storetest.Blob(t, 1, 2)
	pushes := 0
	for i := range models {
		for v := uint64(1); v <= 1+uint64(i%3/2); v++ { // every third model twice
			if _, err := sc.Push(ctx, store.PushRequest{Name: name(i), Version: v, Expect: v - 1, Blob: blob}); err != nil {
				t.Fatal(err)
			}
			pushes++
		}
	}
	// 60 models with 200 collectors each (one version behind on the models
	// pushed twice), and one collector on every other model.
	var reports []*pb.CollectorReport
	for i := range models {
		per := 1
		if i < 60 {
			per = 200
		}
		for j := range per {
			reports = append(reports, &pb.CollectorReport{CollectorId: fmt.Sprintf("c%03d-%s", j, pad), Model: name(i), Version: 1, Via: "shm"})
		}
	}
	collectors := len(reports)
	wsc := pb.NewWeightSyncClient(conn)
	for len(reports) > 0 {
		k := min(len(reports), 4000)
		if _, err := wsc.Report(ctx, &pb.SyncReportRequest{Reports: reports[:k]}); err != nil {
			t.Fatal(err)
		}
		reports = reports[k:]
	}

	var body []byte
	t0 := time.Now()
	const polls = 5
	for range polls {
		resp, err := http.Get("http://" + h.MetricsAddr() + "/api/state")
		if err != nil {
			t.Fatal(err)
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The first poll reads the hub; the rest, within StateReuse, share its
	// reading (BenchmarkPoll measures either).
	t.Logf("/api/state of %d models, %d collectors: %d bytes, %v per request of %d", models, collectors, len(body), time.Since(t0)/polls, polls)
	var st metrics.State
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if n := len(st.Models); n != maxN+1 {
		t.Fatalf("dashboard lists %d models, want %d and other", n, maxN)
	}
	fams := scrape(t, h.MetricsAddr())
	var listedPushes uint64
	for _, m := range st.Models[:maxN] {
		if m.Sum {
			t.Errorf("model %s marked as the other row", m.Name)
		}
		if _, ok := value(fams, "rlhub_store_pushes_total", "model="+m.Name); !ok {
			t.Errorf("dashboard lists %s, which /metrics sums as other", m.Name)
		}
		listedPushes += m.Pushes
	}
	o := st.Models[maxN]
	if !o.Sum || o.Name != metrics.OtherLabel || o.Others != models-maxN {
		t.Errorf("last model row %+v, want the other row of %d models", o, models-maxN)
	}
	for _, c := range []struct {
		family string
		got    float64
	}{{"rlhub_store_pushes_total", float64(o.Pushes)}, {"rlhub_store_reads_total", float64(o.Reads)},
		{"rlhub_store_model_bytes", float64(o.Bytes)}, {"rlhub_store_model_version", float64(o.Version)}} {
		if want, _ := value(fams, c.family, "model=other"); c.got != want {
			t.Errorf("dashboard's other row has %s %v, /metrics %v", c.family, c.got, want)
		}
	}
	if got := listedPushes + o.Pushes; got != uint64(pushes) {
		t.Errorf("dashboard's model rows sum %d pushes, want %d", got, pushes)
	}

	if n := len(st.Collectors); n != maxN+1 {
		t.Fatalf("dashboard lists %d collectors, want %d and other", n, maxN)
	}
	for _, c := range st.Collectors[:maxN] {
		if c.Sum || c.Lag != 1 {
			t.Errorf("collector row %s/%s lag %d, want the most-lagging (1) first", c.Model, c.ID, c.Lag)
		}
	}
	if oc := st.Collectors[maxN]; !oc.Sum || oc.Others != collectors-maxN || oc.Lag != 1 {
		t.Errorf("last collector row %+v, want the other row of %d collectors, largest lag 1", oc, collectors-maxN)
	}

	page := get(t, h.MetricsAddr(), "/")
	if want := fmt.Sprintf(">other (%d models)<", models-maxN); !strings.Contains(page, want) {
		t.Errorf("page lacks %q", want)
	}
	if want := fmt.Sprintf(">other (%d collectors)<", collectors-maxN); !strings.Contains(page, want) {
		t.Errorf("page lacks %q", want)
	}
}

// The Learners panel keeps the metrics' learner labels: past the cap, one
// "other" row with the tasks /metrics counts as learner="other". Before,
// the learners past the cap were left out.
func TestDashboardLearnersOtherRow(t *testing.T) {
	var ls []aggregator.LearnerStats
	for i := range 5 {
		ls = append(ls, aggregator.LearnerStats{ID: fmt.Sprintf("l%d", 4-i), StartedTask: "t", TasksDone: uint64(10 * i), TasksFailed: 1})
	}
	addr := serveSources(t, 3, metrics.Sources{Aggregator: func() aggregator.Stats { return aggregator.Stats{Learners: ls} }})
	var st metrics.State
	if err := json.Unmarshal([]byte(get(t, addr, "/api/state")), &st); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range st.Learners {
		ids = append(ids, l.ID)
	}
	if got, want := strings.Join(ids, " "), "l0 l1 l2 other"; got != want {
		t.Fatalf("learner rows %q, want %q", got, want)
	}
	fams := scrape(t, addr)
	o := st.Learners[3]
	done, _ := value(fams, "rlhub_aggregator_learner_tasks_total", "learner=other", "outcome=done")
	failed, _ := value(fams, "rlhub_aggregator_learner_tasks_total", "learner=other", "outcome=failed")
	if !o.Sum || o.Others != 2 || float64(o.Done) != done || float64(o.Failed) != failed || o.Done != 10 {
		t.Errorf("other row %+v, want 2 learners, done %v (10), failed %v as /metrics", o, done, failed)
	}
	if page := get(t, addr, "/"); !strings.Contains(page, ">other (2 learners)<") {
		t.Error("page lacks the learners' other row")
	}
}
