package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Collectors of names the store never had (any worker token may report
// them) neither crowd a stored model's lag out of the metrics nor make the
// dashboard's collector list unbounded: both keep Config.MaxLabelValues
// models, stored ones first. Before, the metrics kept the first 50 names,
// so 50 reported names sorting before "zz/policy" hid its lag, and the
// dashboard listed every model's collectors (1.9 MB of JSON per poll for
// 20,000 reported models).
func TestSyncModelsStoredFirstAndBounded(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const real = "zz/policy"
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: real, Version: 3, Expect: 0, Blob: storetest.Blob(t, 3, 4)}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &pb.SyncReportRequest{Reports: []*pb.CollectorReport{{CollectorId: "real-collector", Model: real, Version: 2}}}
	const junk, perJunk = 200, 20
	for i := range junk {
		for j := range perJunk {
			req.Reports = append(req.Reports, &pb.CollectorReport{CollectorId: fmt.Sprintf("c%d", j), Model: fmt.Sprintf("a/junk-%03d", i), Version: 1})
		}
	}
	if _, err := pb.NewWeightSyncClient(conn).Report(ctx, req); err != nil {
		t.Fatal(err)
	}

	fams := scrape(t, h.MetricsAddr())
	if lag, ok := value(fams, "rlhub_sync_collector_lag", "model="+real, "collector=real-collector"); !ok || lag != 1 {
		t.Errorf("rlhub_sync_collector_lag of %s = %v (found %v), want 1", real, lag, ok)
	}
	if n := len(fams["rlhub_sync_collectors"].GetMetric()); n != 50 {
		t.Errorf("rlhub_sync_collectors has %d models, want the cap, 50", n)
	}

	resp, err := http.Get("http://" + h.MetricsAddr() + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st metrics.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	models := map[string]int{}
	for _, c := range st.Collectors {
		models[c.Model]++
	}
	if len(models) > 50 || len(st.Collectors) > 50*perJunk {
		t.Errorf("dashboard lists %d collectors of %d models, want at most 50 models", len(st.Collectors), len(models))
	}
	if models[real] != 1 {
		t.Errorf("dashboard lists %d collectors of %s, want 1", models[real], real)
	}
}
