package metrics_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// refusalEndpoint is a metrics endpoint whose sources are a data plane's
// and a body bound's counts, which the test sets.
type refusalEndpoint struct {
	addr string
	mu   sync.Mutex
	dp   bulk.Stats
	cut  bodylimit.Stats
}

func startRefusalEndpoint(t *testing.T, dp bulk.Stats, cut bodylimit.Stats) *refusalEndpoint {
	t.Helper()
	e := &refusalEndpoint{dp: dp, cut: cut}
	e.addr = serveSources(t, 0, metrics.Sources{
		DataPlane: func() bulk.Stats {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.dp
		},
		GRPCBodies: func() bodylimit.Stats {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.cut
		}})
	return e
}

// The Turned away panel (/api/state and the page's first render) says
// what rlhub_conns_refused_total and rlhub_grpc_streams_cut_total say:
// every reason and direction in a fixed order, zeros included, a non-zero
// count marked; a process with neither source has no panel.
func TestDashboardRefusals(t *testing.T) {
	e := startRefusalEndpoint(t, bulk.Stats{Refused: map[string]uint64{bulk.RefusedPeerCap: 2, bulk.RefusedReplyTimeout: 1}},
		bodylimit.Stats{Sent: 3})
	var st metrics.State
	if err := json.Unmarshal([]byte(get(t, e.addr, "/api/state")), &st); err != nil {
		t.Fatal(err)
	}
	want := metrics.RefusalState{
		Conns:      []metrics.Count{{"peer_cap", 2}, {"handshake", 0}, {"frame_timeout", 0}, {"malformed", 0}, {"body_timeout", 0}, {"reply_timeout", 1}, {"unauthenticated", 0}},
		StreamsCut: []metrics.Count{{"received", 0}, {"sent", 3}},
	}
	if st.Refusals == nil || !reflect.DeepEqual(*st.Refusals, want) {
		t.Fatalf("refusals\n got %+v\nwant %+v", st.Refusals, want)
	}
	page := get(t, e.addr, "/")
	for _, s := range []string{`<span data-name="peer_cap" class="warn">peer_cap <b>2</b></span>`, `<span data-name="handshake">handshake <b>0</b></span>`,
		`<span data-name="sent" class="warn">sent <b>3</b></span>`} {
		if !strings.Contains(page, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if strings.Contains(page, `class="auth"`) {
		t.Error("a process without tokens shows token refusals")
	}

	// With tokens: the calls cut with their token and the quota refusals.
	withAuth := serveSources(t, 0, metrics.Sources{Auth: func() auth.Stats { return auth.Stats{CallsCut: 2, QuotaBytesFull: 1} }})
	page = get(t, withAuth, "/")
	for _, s := range []string{`calls cut with their token <b>2</b>`, `<span data-name="models">models <b>0</b></span>`,
		`<span data-name="bytes" class="warn">bytes <b>1</b></span>`} {
		if !strings.Contains(page, s) {
			t.Errorf("page with tokens lacks %q", s)
		}
	}

	none := serveSources(t, 0, metrics.Sources{})
	if body := get(t, none, "/api/state"); strings.Contains(body, `"refusals"`) {
		t.Errorf("/api/state of a process with no listener counts: %s", body)
	}
	if page := get(t, none, "/"); strings.Contains(page, `id="refusals"`) {
		t.Error("the page of a process with no listener counts has a Turned away panel")
	}
}

// In real headless Chromium, the open page redraws the Turned away panel
// as the counts grow, marking the ones that left zero.
func TestDashboardRefusalsInChromium(t *testing.T) {
	exe := chromiumPath(t)
	e := startRefusalEndpoint(t, bulk.Stats{Refused: map[string]uint64{}}, bodylimit.Stats{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bctx := startBrowser(t, ctx, exe)
	url := "http://" + e.addr + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`#refusals .cut`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	text := pageText(t, bctx)
	if got, want := text(`#refusals .cut`), "gRPC streams cut at a body's deadline: received 0 · sent 0"; got != want {
		t.Errorf("streams cut %q, want %q", got, want)
	}
	e.mu.Lock()
	e.dp = bulk.Stats{Refused: map[string]uint64{bulk.RefusedBodyTimeout: 4}}
	e.cut = bodylimit.Stats{Received: 1, Sent: 2}
	e.mu.Unlock()
	type view struct{ Cut, Body string }
	const js = `(() => ({Cut: document.querySelector('#refusals .cut').textContent,
		Body: [...document.querySelectorAll('#refusals .warn')].map((s) => s.dataset.name).join(',')}))()`
	var v view
	testkit.Eventually(t, 30*time.Second, "the open page shows the cuts", func() bool {
		var err error
		if v, err = chromedp.Run(bctx, chromedp.Evaluate[view](js)); err != nil {
			t.Fatalf("read the panel: %v", err)
		}
		return strings.Contains(v.Cut, "sent 2")
	})
	if want := "gRPC streams cut at a body's deadline: received 1 · sent 2"; v.Cut != want {
		t.Errorf("streams cut %q, want %q", v.Cut, want)
	}
	if want := "body_timeout,received,sent"; v.Body != want {
		t.Errorf("marked counts %q, want %q", v.Body, want)
	}
}
