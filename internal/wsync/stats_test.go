package wsync

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	h := startHubWith(t, ServiceConfig{MaxCollectors: -1})
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

// Weight sync keeps at most MaxCollectors collectors: past the cap a new
// collector's report (or attach, or data-plane watch) fails
// ResourceExhausted and changes nothing, while those it holds still
// report; forgotten collectors make room without anyone asking for
// status. Before, any worker token could make a real hub hold 776,000
// collectors (0.8 GB) in 8 s of Report calls, kept for the forget window,
// and a hub whose status nobody asked for never dropped a collector.
func TestCollectorsAreCapped(t *testing.T) {
	const maxN = 100
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := startHubWith(t, ServiceConfig{MaxCollectors: maxN, Forget: time.Minute, Now: clock})
	client := rlhubv1.NewWeightSyncClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	report := func(from, n int, version uint64) error {
		req := &rlhubv1.SyncReportRequest{}
		for i := from; i < from+n; i++ {
			req.Reports = append(req.Reports, &rlhubv1.CollectorReport{CollectorId: fmt.Sprintf("c%d", i), Model: "m", Version: version})
		}
		_, err := client.Report(ctx, req)
		return err
	}
	collectors := func() int {
		st := h.svc.Tracker().Status("m")
		return len(st[0].Collectors)
	}
	if err := report(0, maxN-1, 1); err != nil {
		t.Fatal(err)
	}
	// Two new collectors where one fits: refused whole.
	if err := report(maxN-1, 2, 1); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 100") {
		t.Fatalf("reports past the cap: %v, want ResourceExhausted naming the cap", err)
	}
	if n := collectors(); n != maxN-1 {
		t.Fatalf("%d collectors after a refused report, want %d", n, maxN-1)
	}
	// The collectors it holds still report.
	if err := report(0, maxN-1, 2); err != nil {
		t.Fatalf("reports of known collectors at the cap: %v", err)
	}
	if err := report(maxN-1, 1, 1); err != nil {
		t.Fatalf("the last collector that fits: %v", err)
	}
	// A new collector's attach is refused too.
	stream, err := client.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{CollectorId: "late", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("attach past the cap: %v, want ResourceExhausted", err)
	}
	// Past the forget window the old collectors make room, though no one
	// asked for status meanwhile.
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if err := report(1000, maxN, 1); err != nil {
		t.Fatalf("new collectors once the old ones are forgotten: %v", err)
	}
	if n := collectors(); n != maxN {
		t.Fatalf("%d collectors, want %d", n, maxN)
	}
}

// A collector's id, model and via are shown in `rlhub sync status`, the
// dashboard and logs: one holding a control character (a terminal escape
// sequence that would forge lines or drive the operator's terminal) is
// refused InvalidArgument, and nothing is recorded.
func TestReportWithAControlCharacterIsRefused(t *testing.T) {
	h := startHub(t)
	client := rlhubv1.NewWeightSyncClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []*rlhubv1.CollectorReport{
		{CollectorId: "x\x1b]0;pwned\a\x1b[2J", Model: "m", Version: 1},
		{CollectorId: "c", Model: "m\nmodel forged", Version: 1},
		{CollectorId: "c", Model: "m", Version: 1, Via: "shm\r"},
	} {
		_, err := client.Report(ctx, &rlhubv1.SyncReportRequest{Reports: []*rlhubv1.CollectorReport{r}})
		if status.Code(err) != codes.InvalidArgument || strings.Contains(err.Error(), "\x1b") {
			t.Fatalf("report %q/%q/%q: %v, want InvalidArgument, the text quoted", r.CollectorId, r.Model, r.Via, err)
		}
	}
	if st := h.svc.Tracker().Status(""); len(st) != 0 {
		t.Fatalf("refused reports recorded: %+v", st)
	}
}
