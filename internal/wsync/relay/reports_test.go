package relay

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// startReportingRelay runs a relay of model m that forwards its
// collectors' reports to h every 20 ms.
func startReportingRelay(t *testing.T, h *hubFixture) *Relay {
	t.Helper()
	r, err := New(Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-a", ReportEvery: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// upstreamView is what h shows of collector id.
func upstreamView(h *hubFixture, id string) (wsync.CollectorLag, bool) {
	for _, ms := range h.svc.Lag(context.Background(), "m") {
		for _, c := range ms.Collectors {
			if c.ID == id {
				return c, true
			}
		}
	}
	return wsync.CollectorLag{}, false
}

// A collector that leaves the relay and then runs against the hub directly
// (Failover to "upstream", or a restart with another source) is shown
// upstream at the version it runs now: the relay forwarded the one it last
// ran there every tick, over it, until it forgot the collector.
func TestRelayStopsForwardingACollectorThatLeft(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	r := startReportingRelay(t, h)
	waitFor(t, "relay at v1", func() bool { return r.Newest() == 1 })

	ctx := context.Background()
	onRelay, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dial(t, r.Addr()), CollectorID: "c1", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := onRelay.WaitNewer(ctx, 0); err != nil || s.Version != 1 {
		t.Fatal(s, err)
	}
	onRelay.Running(1)
	waitFor(t, "c1 forwarded at v1", func() bool { c, ok := upstreamView(h, "c1"); return ok && c.Version == 1 })
	onRelay.Close() // c1 leaves the relay

	h.push(t, 2, 100)
	direct, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dial(t, h.addr), CollectorID: "c1", Model: "m", Start: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if s, err := direct.WaitNewer(ctx, 1); err != nil || s.Version != 2 {
		t.Fatal(s, err)
	}
	direct.Running(2)
	waitFor(t, "c1 at v2 upstream", func() bool { c, ok := upstreamView(h, "c1"); return ok && c.Version == 2 })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if c, _ := upstreamView(h, "c1"); c.Version != 2 {
			t.Fatalf("c1 runs v2 on a stream to the hub, but the hub shows %+v (the relay re-forwards what c1 ran on it)", c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// One local collector reporting a long (valid, 256 bytes) via does not
// stop every other collector of the host from being reported upstream:
// prefixed relay/ it passed the hub's bound, and the hub refused the whole
// batch.
func TestRelayForwardsALongViaWithinTheHubsBound(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	r := startReportingRelay(t, h)
	waitFor(t, "relay at v1", func() bool { return r.Newest() == 1 })
	conn := dial(t, r.Addr())
	ctx := context.Background()
	if err := wsync.Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "good", Model: "m", Version: 1, Via: "shm"}); err != nil {
		t.Fatal(err)
	}
	if err := wsync.Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "long", Model: "m", Version: 1, Via: strings.Repeat("v", 256)}); err != nil {
		t.Fatalf("the relay refused a valid via: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := upstreamView(h, "good"); ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("collector %q never reached the upstream: the relay's batch (with %q's via prefixed by \"relay/\", 262 bytes) is refused whole", "good", "long")
}
