package metrics_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func tinyBlob(t *testing.T) []byte {
	t.Helper()
	sd, err := tensor.NewStateDict(tensor.NewF32("w", 4))
	if err != nil {
		t.Fatal(err)
	}
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// pushV pushes version v of name over real gRPC / data plane.
func pushV(t *testing.T, sc *storerpc.Client, name string, v uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sc.Push(ctx, store.PushRequest{Name: name, Version: v, Expect: v - 1, Blob: tinyBlob(t)}); err != nil {
		t.Fatalf("push %s v%d: %v", name, v, err)
	}
}

// counterSeries returns every counter sample of the rlhub_store_* families
// keyed by "family{model}".
func counterSeries(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for name, f := range fams {
		if f.GetType() != dto.MetricType_COUNTER || !strings.HasPrefix(name, "rlhub_store_") {
			continue
		}
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out[name+"{"+strings.Join(ls, ",")+"}"] = m.Counter.GetValue()
		}
	}
	return out
}

// TestStoreCountersStayCounters: a hub with more models than the label
// cap. A push of a new model that sorts first used to move a named model
// into "other" (which jumped by that model's 5 pushes), and a deletion to
// move one out (which made "other" fall): rate() reported pushes that
// never happened. A model keeps its label, or its place in "other", for as
// long as the store lists it; "other" keeps the counts of its models that
// left. (A model deleted and pushed again starts its own series afresh: a
// counter reset to Prometheus, as a hub restart is.)
func TestStoreCountersStayCounters(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	for i := range 51 { // m00..m50: m50 is past the cap of 50
		pushV(t, sc, fmt.Sprintf("m%02d", i), 1)
	}
	for v := uint64(2); v <= 5; v++ { // m49: 5 pushes
		pushV(t, sc, "m49", v)
	}
	for v := uint64(2); v <= 3; v++ { // m00: 3 pushes
		pushV(t, sc, "m00", v)
	}
	const other = `rlhub_store_pushes_total{model=other}`
	s0 := counterSeries(scrape(t, h.MetricsAddr()))
	if s0[`rlhub_store_pushes_total{model=m49}`] != 5 || s0[other] != 1 {
		t.Fatalf("m49 %v (want 5), other %v (want m50's 1)", s0[`rlhub_store_pushes_total{model=m49}`], s0[other])
	}
	// One push of a new model "a" (sorting first): no label is free, so it
	// is summed in "other", which rises by that one push, not by m49's.
	pushV(t, sc, "a", 1)
	s1 := counterSeries(scrape(t, h.MetricsAddr()))
	if d := s1[other] - s0[other]; d != 1 {
		t.Errorf("one push of model a moved %s by %v (%v → %v), want 1", other, d, s0[other], s1[other])
	}
	if _, ok := s1[`rlhub_store_pushes_total{model=m49}`]; !ok {
		t.Errorf("m49 lost its label to a model listed after it")
	}
	// Delete "a" (in "other") and m00 (named), then push m00 again.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"a", "m00"} {
		if err := sc.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	s2 := counterSeries(scrape(t, h.MetricsAddr()))
	pushV(t, sc, "m00", 1)
	s3 := counterSeries(scrape(t, h.MetricsAddr()))
	for _, s := range []map[string]float64{s2, s3} {
		for k, before := range s1 {
			if k == `rlhub_store_pushes_total{model=m00}` || strings.Contains(k, "model=m00}") {
				continue // deleted and pushed again: its own series restarts
			}
			if after, ok := s[k]; ok && after < before {
				t.Errorf("counter %s fell from %v to %v within one hub process", k, before, after)
			}
		}
	}
	if s2[other] != s1[other] {
		t.Errorf("deleting a model summed in other moved %s from %v to %v", other, s1[other], s2[other])
	}
}

// TestStoreRefusalsAndReadsAreCounted: one pull over each transport moves
// rlhub_store_reads_total{model} by one, and every refused push is counted
// somewhere: one on a name holding no version (a push expecting a model
// not yet pushed) used to be counted on an entry that is then forgotten.
func TestStoreRefusalsAndReadsAreCounted(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, tr := range []string{"", "grpc"} {
		sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String(), Transport: tr, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		name := "m-" + tr
		pushV(t, sc, name, 1)
		r0, _ := value(scrape(t, h.MetricsAddr()), "rlhub_store_reads_total", "model="+name)
		if _, err := sc.Get(ctx, name, 0); err != nil {
			t.Fatal(err)
		}
		r1, _ := value(scrape(t, h.MetricsAddr()), "rlhub_store_reads_total", "model="+name)
		if r1-r0 != 1 {
			t.Errorf("transport %q: one pull moved reads_total by %v", tr, r1-r0)
		}
		// A stale push (version 1 again) and a push expecting a model that
		// does not exist: both refused by the version rules.
		_, err1 := sc.Push(ctx, store.PushRequest{Name: name, Version: 1, Expect: 0, Blob: tinyBlob(t)})
		_, err2 := sc.Push(ctx, store.PushRequest{Name: name + "-new", Version: 2, Expect: 1, Blob: tinyBlob(t)})
		if err1 == nil || err2 == nil {
			t.Fatalf("pushes not refused: %v, %v", err1, err2)
		}
		t.Logf("refusals: %v | %v", err1, err2)
		fams := scrape(t, h.MetricsAddr())
		ref, _ := value(fams, "rlhub_store_pushes_refused_total")
		if want := float64(2 * (i + 1)); ref != want {
			t.Errorf("transport %q: after 2 refused pushes rlhub_store_pushes_refused_total sums to %v over all models, want %v", tr, ref, want)
		}
	}
}

// TestModelNamedOtherDoesNotBreakTheScrape: a model named "other" (the
// default name pattern allows it), the cap's own label value, among more
// models than the cap: kept under its own name it repeated the sum's label
// set, and the registry failed the whole scrape (HTTP 500: every rlhub_*,
// go_* and process_* series gone).
func TestModelNamedOtherDoesNotBreakTheScrape(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	for i := range 50 {
		pushV(t, sc, fmt.Sprintf("p%02d", i), 1) // "other" sorts before them
	}
	pushV(t, sc, "other", 1)   // 51 models: p49 is past the cap
	scrape(t, h.MetricsAddr()) // fails the test unless 200 and parsed
}

// TestCollectorNamedOtherDoesNotBreakTheScrape: the same with a collector
// id "other" (any worker token may report one).
func TestCollectorNamedOtherDoesNotBreakTheScrape(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	pushV(t, sc, "policy", 1)
	pushV(t, sc, "policy", 2)
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := []string{"other"} // lag 2: the most lagging, so it keeps its own label
	for i := range 51 {
		ids = append(ids, fmt.Sprintf("c%02d", i))
	}
	for i, id := range ids {
		v := uint64(1)
		if i == 0 {
			v = 0
		}
		if err := wsync.Report(ctx, conn, &pb.CollectorReport{CollectorId: id, Model: "policy", Version: v, Via: "grpc"}); err != nil {
			t.Fatal(err)
		}
	}
	scrape(t, h.MetricsAddr()) // fails the test unless 200 and parsed
}

// TestDashboardShowsMarkupInNamesAsText: a model named with markup (a hub
// whose --name-pattern allows it) and collector reports whose model, id
// and via carry markup, in real headless Chromium: the dashboard renders
// them as text, no script runs, no JavaScript error is thrown.
func TestDashboardShowsMarkupInNamesAsText(t *testing.T) {
	exe := chromiumPath(t)
	const evil = `<img src=x onerror=alert(1)>`
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Store: store.Config{NamePattern: regexp.MustCompile(`^.+$`)}})
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	pushV(t, sc, evil, 1)
	pushV(t, sc, "plain", 1)
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, rep := range []*pb.CollectorReport{
		{CollectorId: `<img src=x onerror=alert(2)>`, Model: "plain", Version: 1, Via: `<img src=x onerror=alert(3)>`},
		{CollectorId: "c1", Model: `"><svg onload=alert(4)>`, Version: 1, Via: "grpc"},
	} {
		if err := wsync.Report(ctx, conn, rep); err != nil {
			t.Fatal(err)
		}
	}
	bctx := startBrowser(t, ctx, exe)
	var mu sync.Mutex
	var dialogs, exceptions []string
	if err := chromedp.Do(bctx); err != nil { // open the tab first
		t.Fatal(err)
	}
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			dialogs = append(dialogs, e.Message)
			go chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		case *runtime.EventExceptionThrown:
			exceptions = append(exceptions, fmt.Sprintf("%s %s:%d", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
		}
	}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + h.MetricsAddr() + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`tr[data-model="plain"]`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	time.Sleep(3 * time.Second) // several polls: app.js redraws every panel
	type view struct {
		Imgs, Svgs int
		Models     []string
		Collectors string
	}
	v, err := chromedp.Run(bctx, chromedp.Evaluate[view](`(() => ({Imgs: document.querySelectorAll('main img').length,
		Svgs: document.querySelectorAll('#collectors svg').length,
		Models: [...document.querySelectorAll('#models tbody td:first-child')].map((e) => e.textContent),
		Collectors: document.querySelector('#collectors tbody').textContent}))()`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page: %+v", v)
	mu.Lock()
	defer mu.Unlock()
	if v.Imgs != 0 || v.Svgs != 0 || len(dialogs) != 0 {
		t.Errorf("markup from names became elements: %d img, %d svg, dialogs %q", v.Imgs, v.Svgs, dialogs)
	}
	if len(v.Models) == 0 || v.Models[0] != evil {
		t.Errorf("models column %q, want %q shown as text first", v.Models, evil)
	}
	if len(exceptions) != 0 {
		t.Errorf("JavaScript exceptions: %q", exceptions)
	}
}

// TestDashboardSaysWhenTheHubIsGone: the dashboard open on a real hub that
// then stops must say its figures are no longer live; it kept showing the
// last state with its old time, as if nothing had happened.
func TestDashboardSaysWhenTheHubIsGone(t *testing.T) {
	exe := chromiumPath(t)
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			h.Close()
		}
	})
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	pushV(t, sc, "policy", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bctx := startBrowser(t, ctx, exe)
	url := "http://" + h.MetricsAddr() + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`tr[data-model="policy"]`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	pushV(t, sc, "policy", 2)
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : ""; })()`, sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return v
	}
	testkit.Eventually(t, 10*time.Second, "the page polls version 2", func() bool { return text(`tr[data-model="policy"] td.version`) == "2" })
	before, bodyBefore := text("header"), text("body")
	h.Close()
	closed = true
	time.Sleep(6 * time.Second) // six polls, each failing
	after := text("header")
	body := text("body")
	t.Logf("header before the hub stopped %q, 6 s after %q; policy still shown at version %q", before, after, text(`tr[data-model="policy"] td.version`))
	if body == bodyBefore || !strings.HasPrefix(text("#updated"), "not live") {
		t.Errorf("6 s after the hub stopped, the dashboard still shows its last figures with no sign they are stale (header %q)", after)
	}
}
