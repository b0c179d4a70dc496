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

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
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

// startBrowser starts headless Chromium (exe) until ctx ends or the test
// does, and returns the context that drives its tab.
func startBrowser(t *testing.T, ctx context.Context, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 960))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	return bctx
}

// pageText returns a reader of the text of the first element sel selects
// in bctx's page.
func pageText(t *testing.T, bctx context.Context) func(sel string) string {
	return func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
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

	bctx := startBrowser(t, ctx, exe)
	url := "http://" + r.h.MetricsAddr() + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`tr[data-model="`+rigModel+`"] td.version`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	text := pageText(t, bctx)
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

	// The learner that took task-1 (rig.learn) and finished it once.
	learner := text(`tr[data-learner="learner-1"]`)
	if f := strings.Split(learner, "\t"); len(f) != 5 || f[0] != "learner-1" || f[2] != "task-1" || f[3] != "1" || f[4] != "0" {
		t.Errorf("learner row %q, want learner-1, its lease, task-1, 1 done, 0 failed", learner)
	}
	// More models than the cap (50): the page's last model row sums the
	// rest as /metrics' model="other" does, and the open page redraws it
	// (app.js) as models are pushed. (The store also holds the ARS run's
	// model.)
	for i := range 52 {
		pushModel(t, r, fmt.Sprintf("zz-%02d", i))
	}
	// One script reads the row: app.js replaces the rows every second.
	const otherJS = `(() => { const r = document.querySelector('#models tbody tr:last-child');
		return r && r.classList.contains('sum') ? [...r.cells].map((c) => c.textContent).join('|') : ''; })()`
	var other string
	otherRow := func(want string) bool {
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](otherJS))
		if err != nil {
			t.Fatalf("read the other row: %v", err)
		}
		other = s
		return strings.HasPrefix(s, want)
	}
	stored := func() int {
		l, err := r.h.Store().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	for i := range 2 {
		if i > 0 {
			pushModel(t, r, "zz-new")
		}
		want := fmt.Sprintf("other (%d models)|", stored()-50)
		testkit.Eventually(t, 30*time.Second, "the open page shows the row "+want, func() bool { return otherRow(want) })
	}
	if want := "|1|"; !strings.Contains(other, want) || !strings.HasSuffix(other, "|0") {
		t.Errorf("other row %q: want version 1, 0 reads", other)
	}
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

// The Cluster panel, in real headless Chromium: a primary shows its
// role, epoch, in-sync standbys and each standby's lag; when the open page
// next polls a new epoch whose in-sync record lists no standby, app.js
// redraws the panel with the warning that none may take over, escaping
// the member ids.
func TestDashboardClusterInChromium(t *testing.T) {
	exe := chromiumPath(t)
	e := startClusterEndpoint(t, 50, metrics.ClusterStats{Primary: true, Epoch: 4, Unit: 90, KeepsInSync: true,
		InSync: []string{"hub-a"}, Lag: map[string]uint64{"hub-a": 0, "hub-b": 7}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bctx := startBrowser(t, ctx, exe)
	url := "http://" + e.addr + "/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(`#cluster tr[data-standby="hub-b"] td.lag`)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}
	text := pageText(t, bctx)
	if got := text(`#cluster .crole`); got != "primary" {
		t.Errorf("cluster role %q, want primary", got)
	}
	if got := text(`#cluster .epoch`); got != "4" {
		t.Errorf("epoch %q, want 4", got)
	}
	if got := text(`#cluster tr[data-standby="hub-b"] td.lag`); got != "7" {
		t.Errorf("hub-b's lag %q, want 7", got)
	}
	if got, want := text(`#cluster .insync`), "in-sync standbys 1: hub-a · 2 connected"; got != want {
		t.Errorf("in-sync line %q, want %q", got, want)
	}

	const odd = `hub-<i>"c`
	e.set(metrics.ClusterStats{Primary: true, Epoch: 5, Unit: 2, KeepsInSync: true, Lag: map[string]uint64{"hub-a": 1, odd: 3}})
	type view struct {
		Epoch, Insync, Warning, OddLag string
		Tags                           bool
	}
	const js = `(() => { const q = (s) => document.querySelector('#cluster ' + s);
		const odd = [...document.querySelectorAll('#cluster tr[data-standby]')].find((r) => r.dataset.standby === 'hub-<i>"c');
		return {Epoch: q('.epoch').textContent, Insync: q('.insync').textContent, Warning: q('.warning') ? q('.warning').textContent : '',
			OddLag: odd ? odd.querySelector('.lag').textContent : '', Tags: !!q('i')}; })()`
	var v view
	testkit.Eventually(t, 30*time.Second, "the open page shows epoch 5", func() bool {
		var err error
		if v, err = chromedp.Run(bctx, chromedp.Evaluate[view](js)); err != nil {
			t.Fatalf("read the cluster panel: %v", err)
		}
		return v.Epoch == "5"
	})
	if !strings.Contains(v.Warning, "no standby may take over") {
		t.Errorf("warning %q with no standby in sync", v.Warning)
	}
	if want := "in-sync standbys 0 · 2 connected"; v.Insync != want {
		t.Errorf("in-sync line %q, want %q", v.Insync, want)
	}
	if v.OddLag != "3" || v.Tags {
		t.Errorf("member %q: lag %q, markup from its id %v", odd, v.OddLag, v.Tags)
	}
}

// pushModel pushes version 1 of a tiny model named name to the rig's store.
func pushModel(t *testing.T, r *rig, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.h.Store().Push(ctx, store.PushRequest{Name: name, Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 2)}); err != nil {
		t.Fatal(err)
	}
}
