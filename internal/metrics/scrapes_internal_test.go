package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/rlhub/rlhub/internal/testkit"
)

// logLines is a promhttp.Logger that counts its lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Println(v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, x := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(toString(x))
	}
	l.lines = append(l.lines, b.String())
}

func toString(x any) string {
	switch x := x.(type) {
	case string:
		return x
	case error:
		return x.Error()
	}
	return "?"
}

// Scrapes that share a failed gather get promhttp's answer to it, each
// one: HTTP 500 with the error, as plain text even when gzip was asked
// for. The failure is logged once for the gather, not once per scrape;
// the gather is not kept once its scrapes are answered, and the next
// scrape gathers again.
func TestScrapesShareAFailedGather(t *testing.T) {
	var gathers atomic.Int64
	gate := make(chan struct{})
	released := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(released)
	failing := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		gathers.Add(1)
		<-gate
		return nil, errors.New("collector broke")
	})
	log := &logLines{}
	sc := &scrapes{reg: failing, opts: promhttp.HandlerOpts{ErrorLog: log}}
	srv := httptest.NewServer(sc) // 127.0.0.1
	t.Cleanup(srv.Close)
	hc := srv.Client()

	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Accept-Encoding", []string{"gzip", "identity"}[i%2])
			resp, err := hc.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			const want = "An error has occurred while serving metrics:\n\ncollector broke\n"
			if err != nil || resp.StatusCode != http.StatusInternalServerError || string(body) != want ||
				resp.Header.Get("Content-Encoding") != "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
				t.Errorf("scrape of a failed gather: %d %q, Content-Type %q, Content-Encoding %q, %v; want 500 %q", resp.StatusCode, body, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"), err, want)
			}
		})
	}
	testkit.Eventually(t, 10*time.Second, "every scrape in the endpoint", func() bool {
		return int(gathers.Load())+sc.s.waiters() == n
	})
	released()
	wg.Wait()
	if g := gathers.Load(); g != 1 {
		t.Fatalf("%d concurrent scrapes gathered %d times, want once", n, g)
	}
	log.mu.Lock()
	lines := log.lines
	log.mu.Unlock()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "error gathering metrics: collector broke") {
		t.Errorf("the failed gather was logged %q, want once per variant (gzip or not)", lines)
	}
	sc.s.mu.Lock()
	kept := sc.s.last
	sc.s.mu.Unlock()
	if kept != nil {
		t.Errorf("the gather is kept after its scrapes were answered")
	}
	resp, err := hc.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := gathers.Load(); g != 2 {
		t.Errorf("a scrape after the failed one gathered %d times in all, want 2", g)
	}
}
