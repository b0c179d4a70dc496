package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// An ARS run with more evaluations than metrics.MaxCurvePoints, through a
// real hub and worker: /api/state and the page's first render carry its
// curve thinned to MaxCurvePoints points (the first, the newest, and each
// stretch's lowest and highest evaluation: the curve's range, hence the
// plot's axes, is the full curve's), the open page draws that thinned
// curve and says so, and WatchRun still has every evaluation. Before, each
// run's whole curve went out on every poll: up to arsrpc.MaxCurvePoints
// (2,000) points for each of 50 runs, 2–3 MB of JSON a second and 100,000
// SVG circles per redraw.
func TestDashboardThinsARSCurves(t *testing.T) {
	exe := chromiumPath(t)
	const iterations = 1000 // under arsrpc.MaxCurvePoints: the hub keeps every evaluation
	r := startRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := &pb.ARSRunSpec{Env: "LQR", Seed: 1, Directions: 1, EvalEvery: 1, EvalEpisodes: 1, MaxIterations: iterations}
	start, err := r.ars.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.RunId

	// The full curve, from the ARS RPC.
	stream, err := r.ars.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var full [][2]float64
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("watch %s: %v", runID, err)
		}
		if p.HasEval {
			full = append(full, [2]float64{float64(p.PolicyEpisodes), p.EvalMean})
		}
		if p.Done {
			break
		}
	}
	if len(full) < iterations {
		t.Fatalf("WatchRun gave %d evaluations, want %d at least", len(full), iterations)
	}

	body := get(t, r.h.MetricsAddr(), "/api/state")
	var st metrics.State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.Runs, func(u metrics.RunState) bool { return u.ID == runID })
	if i < 0 {
		t.Fatalf("/api/state lacks run %s", runID)
	}
	run := st.Runs[i]
	t.Logf("/api/state: %d bytes with run %s's %d evaluations drawn as %d points", len(body), runID, len(full), len(run.Curve))
	if n := len(run.Curve); n > metrics.MaxCurvePoints || n < metrics.MaxCurvePoints/2 {
		t.Errorf("/api/state curve has %d points of %d evaluations, want at most %d (and not fewer than half that)", n, len(full), metrics.MaxCurvePoints)
	}
	if run.Evals != len(full) {
		t.Errorf("/api/state says %d evaluations, WatchRun gave %d", run.Evals, len(full))
	}
	c := run.Curve
	if len(c) == 0 {
		t.Fatal("/api/state has an empty curve")
	}
	if c[0] != full[0] || c[len(c)-1] != full[len(full)-1] {
		t.Errorf("thinned curve runs %v..%v, want the first and newest evaluations %v..%v", c[0], c[len(c)-1], full[0], full[len(full)-1])
	}
	// Each point is one of the evaluations, in order.
	j := 0
	for _, p := range c {
		for j < len(full) && full[j] != p {
			j++
		}
		if j == len(full) {
			t.Fatalf("thinned point %v is not an evaluation after the previous point", p)
		}
		j++
	}
	fullLo, fullHi := yRange(full)
	thinLo, thinHi := yRange(c)
	if thinLo != fullLo || thinHi != fullHi {
		t.Errorf("thinned curve spans %v..%v, the evaluations %v..%v", thinLo, thinHi, fullLo, fullHi)
	}

	// The page's first render draws the same thinned curve.
	page := get(t, r.h.MetricsAddr(), "/")
	m := regexp.MustCompile(`(?s)data-run="` + regexp.QuoteMeta(runID) + `"[^<]*<h3>.*?<svg[^>]*data-points="(\d+)"><polyline points="([^"]*)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("page lacks run %s's curve", runID)
	}
	if n, _ := strconv.Atoi(m[1]); n != len(c) || len(strings.Fields(m[2])) != len(c) {
		t.Errorf("page's first render draws %s points (polyline of %d), want the thinned %d", m[1], len(strings.Fields(m[2])), len(c))
	}

	// And so does the open page's script.
	bctx := startBrowser(t, ctx, exe)
	url := "http://" + r.h.MetricsAddr() + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`.run[data-run="`+runID+`"] svg`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	js := fmt.Sprintf(`(() => { const s = document.querySelector('.run[data-run=%q] svg'); return s ? s.querySelectorAll('circle').length : -1; })()`, runID)
	// app.js draws circles (the server's render has none) at its first
	// poll.
	testkit.Eventually(t, 30*time.Second, "the open page draws the thinned curve", func() bool {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("read the curve: %v", err)
		}
		if n > 0 && n != len(c) {
			t.Fatalf("the open page draws %d points, want the thinned %d", n, len(c))
		}
		return n == len(c)
	})
	caption := pageText(t, bctx)(`.run[data-run="` + runID + `"] .caption`)
	if want := fmt.Sprintf("%d of %d evaluations", len(c), len(full)); !strings.Contains(caption, want) {
		t.Errorf("caption %q lacks %q", caption, want)
	}
}

// yRange is the lowest and highest y of pts.
func yRange(pts [][2]float64) (lo, hi float64) {
	lo, hi = pts[0][1], pts[0][1]
	for _, p := range pts {
		lo, hi = min(lo, p[1]), max(hi, p[1])
	}
	return lo, hi
}
