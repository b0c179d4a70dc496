package wsync

import (
	"context"
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
