package wsync

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Stats shows each collector's version and lag and counts the versions a
// push stream sent and the reports received.
func TestStatsCollectorsLagAndCounters(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 64)
	c := startCollector(t, h.addr, "c1", 0)
	testkit.Eventually(t, 10*time.Second, "collector c1 applies version 1", func() bool { return slices.Contains(c.versions(), 1) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Report(ctx, dial(t, h.addr), &rlhubv1.CollectorReport{CollectorId: "slow", Model: "m", Version: 1, Via: "shm"}); err != nil {
		t.Fatal(err)
	}
	h.push(t, 4, 64)
	testkit.Eventually(t, 10*time.Second, "collector c1 applies version 4", func() bool { return slices.Contains(c.versions(), 4) })
	var st Stats
	testkit.Eventually(t, 10*time.Second, "c1 reports version 4", func() bool {
		st = h.svc.Stats(ctx)
		return len(st.Models) == 1 && len(st.Models[0].Collectors) == 2 && st.Models[0].Collectors[0].Version == 4
	})
	m := st.Models[0]
	if m.Newest != 4 || m.Collectors[1].ID != "slow" || m.Collectors[1].Lag != 3 || m.Collectors[0].Lag != 0 {
		t.Fatalf("lag picture %+v: want newest 4, c1 lag 0, slow lag 3", m)
	}
	if st.Streams != 1 || st.VersionsSent != 2 || st.BytesSent == 0 || st.Reports < 3 {
		t.Fatalf("counters %+v: want 1 stream, 2 versions sent, bytes, ≥ 3 reports (1 RPC + c1's 2)", st)
	}
}

// A worker that reports many collectors, each of its own model, must not
// make Stats (every metrics scrape and dashboard poll) slow, nor stall the
// reports of real collectors behind the tracker's lock while it runs.
// Models() compared every collector's model with every model listed
// before: 60,000 such collectors (six Report calls) made a hub's scrape
// take 5.5 s and a legitimate Report wait 5.3 s behind it.
func TestStatsStayFastWithManyReportedModels(t *testing.T) {
	const calls, per = 10, 10000
	h := startHub(t)
	conn := dial(t, h.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := rlhubv1.NewWeightSyncClient(conn)
	for b := range calls {
		req := &rlhubv1.SyncReportRequest{}
		for i := range per {
			req.Reports = append(req.Reports, &rlhubv1.CollectorReport{CollectorId: fmt.Sprintf("c%d-%d", b, i), Model: fmt.Sprintf("fake%d-%d", b, i), Version: 1})
		}
		if _, err := client.Report(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	st := h.svc.Stats(ctx)
	took := time.Since(start)
	if len(st.Models) != calls*per {
		t.Fatalf("Stats lists %d models, want %d", len(st.Models), calls*per)
	}
	// Linear work is well under a second even under the race detector;
	// the quadratic listing took 50 s there (18 s without it).
	if took > 5*time.Second {
		t.Fatalf("Stats took %v with %d reported models: want linear work (< 5s)", took, calls*per)
	}
	t.Logf("Stats of %d models: %v", calls*per, took)
}
