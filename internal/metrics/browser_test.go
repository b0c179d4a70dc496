package metrics_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rlhub/rlhub/internal/testkit"
)

// chromiumPath finds Debian's chromium (RLHUB_CHROMIUM overrides). The
// browser test never skips: without a browser it fails naming the set-up
// step.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RLHUB_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: run scripts/setup.sh (scripts/setup.d/50-obs.sh installs Debian's chromium package), or set RLHUB_CHROMIUM")
	return ""
}

// The dashboard, in real headless Chromium: it lists the model with its
// current version, shows a lagging collector's lag, and the ARS run's
// curve gains points while the page polls, without a reload. The
// screenshot goes to $RLHUB_DASHBOARD_PNG (docs/img/dashboard.png was made
// so) or the test's temp dir.
func TestDashboardInChromium(t *testing.T) {
	exe := chromiumPath(t)
	r := startRigWith(t, false)
	r.pushGrads(t, 12)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var version uint64
	testkit.Eventually(t, 30*time.Second, "the reducer publishes its steps", func() bool {
		snap, err := r.h.Store().Get(ctx, rigModel, 0)
		if err == nil {
			version = snap.Version
		}
		st := r.h.Reducer().Stats()
		return err == nil && st.Total.Applied == 12 && st.QueueDepth == 0
	})
	snap, err := r.h.Store().Get(ctx, rigModel, 0)
	if err != nil {
		t.Fatal(err)
	}
	version = snap.Version
	r.report(t, "slow-collector", 1)
	r.report(t, "fresh-collector", version)
	r.learn(t)
	runID := r.startARS(t, 60) // no worker yet: the curve is empty

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 960))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	url := "http://" + r.h.MetricsAddr() + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`tr[data-model="`+rigModel+`"] td.version`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	text := func(sel string) string {
		s, err := chromedp.Run(bctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	modelVersion := text(`tr[data-model="` + rigModel + `"] td.version`)
	lag := text(`tr[data-collector="slow-collector"] td.lag`)
	if modelVersion != strconv.FormatUint(version, 10) {
		t.Errorf("dashboard shows %s at version %q, store has %d", rigModel, modelVersion, version)
	}
	if lag != strconv.FormatUint(version-1, 10) {
		t.Errorf("dashboard shows slow-collector lag %q, want %d", lag, version-1)
	}
	points := func() int {
		js := fmt.Sprintf(`(() => { const s = document.querySelector('.run[data-run=%q] svg'); return s ? s.querySelectorAll('circle').length : -1; })()`, runID)
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("read the curve: %v", err)
		}
		return n
	}
	testkit.Eventually(t, 30*time.Second, "the page shows run "+runID+" with an empty curve", func() bool { return points() == 0 })

	// Now a worker: the run moves and the open page's curve grows.
	r.startWorker(t)
	testkit.Eventually(t, 60*time.Second, "the ARS curve gains a point while the page is open", func() bool { return points() >= 1 })
	testkit.Eventually(t, 90*time.Second, "the run's 60 evaluations on the page", func() bool { return points() >= 60 })

	learner := text(`tr[data-learner="learner-1"]`)
	flow := text(`#reducer .flow`)
	if want := "12 applied"; !strings.Contains(flow, want) {
		t.Errorf("gradient flow %q lacks %q", flow, want)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("RLHUB_DASHBOARD_PNG")
	if out == "" {
		out = filepath.Join(t.TempDir(), "dashboard.png")
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes); learner row %q", out, len(png), learner)
}
