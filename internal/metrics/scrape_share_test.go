package metrics_test

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	dto "github.com/prometheus/client_model/go"

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/testkit"
)

// scrapeVariants are requests that promhttp answers differently: the
// text format with gzip and without, Prometheus's Accept (which offers
// OpenMetrics first), and the protobuf format.
var scrapeVariants = []struct {
	name             string
	accept, encoding string
}{
	{"text+gzip", "", "gzip"},
	{"text", "", "identity"},
	{"prometheus", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1", "gzip"},
	{"protobuf", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "identity"},
}

// scraped is one /metrics response: its Content-Type and Content-Encoding,
// its body decompressed, and the rlhub families it decodes to.
type scraped struct {
	contentType, contentEncoding string
	body                         string
	fams                         map[string]*dto.MetricFamily
}

// scrapeAs GETs /metrics with accept and encoding as the request's Accept
// and Accept-Encoding (the transport then leaves the body as sent) and
// decodes the body in the format the response names.
func scrapeAs(hc *http.Client, addr, accept, encoding string) (scraped, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return scraped{}, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	req.Header.Set("Accept-Encoding", encoding)
	resp, err := hc.Do(req)
	if err != nil {
		return scraped{}, err
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return scraped{}, err
		}
		r = zr
	}
	b, err := io.ReadAll(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		return scraped{}, errors.Join(err, errors.New(resp.Status))
	}
	s := scraped{contentType: resp.Header.Get("Content-Type"), contentEncoding: resp.Header.Get("Content-Encoding"), body: string(b), fams: map[string]*dto.MetricFamily{}}
	dec := expfmt.NewDecoder(strings.NewReader(s.body), expfmt.ResponseFormat(resp.Header))
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err == io.EOF {
			break
		} else if err != nil {
			return scraped{}, err
		}
		if strings.HasPrefix(mf.GetName(), "rlhub_") {
			s.fams[mf.GetName()] = &mf
		}
	}
	return s, nil
}

// Scrapes that share a gather share its encoding too: 8 scrapes arriving
// together, two of each variant, are encoded once per variant, and each
// gets a complete body, in the format and encoding it asked for, with the
// figures a lone scrape of the same variant shows. Before, each scrape
// encoded (and gzipped) the shared families itself, about 7 ms of CPU per
// scrape on a hub of 5,000 models (BenchmarkPoll). A scrape after them
// gathers and encodes afresh.
func TestConcurrentScrapesShareOneEncoding(t *testing.T) {
	c := &countedSources{}
	c.version.Store(3)
	s := startCounted(t, -1, c) // off: only sharing in progress can count
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(hc.CloseIdleConnections)

	gate := make(chan struct{})
	c.gate.Store(&gate)
	released := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(released)
	const per = 2
	n := per * len(scrapeVariants)
	got := make([]scraped, n)
	var wg sync.WaitGroup
	for i := range n {
		v := scrapeVariants[i%len(scrapeVariants)]
		wg.Go(func() {
			var err error
			if got[i], err = scrapeAs(hc, s.Addr(), v.accept, v.encoding); err != nil {
				t.Errorf("scrape %s: %v", v.name, err)
			}
		})
	}
	testkit.Eventually(t, 10*time.Second, "every scrape in the endpoint", func() bool {
		_, scrapes := metrics.Waiting(s)
		return int(c.store.Load())+scrapes == n
	})
	released()
	wg.Wait()
	c.gate.Store(nil)
	if t.Failed() {
		return
	}
	if r := c.reads(); r != 1 {
		t.Fatalf("%d concurrent scrapes read the sources %d times, want once", n, r)
	}
	if e := metrics.Encodes(s); e != int64(len(scrapeVariants)) {
		t.Errorf("%d concurrent scrapes of %d variants were encoded %d times, want once per variant", n, len(scrapeVariants), e)
	}

	for i, v := range scrapeVariants {
		lone, err := scrapeAs(hc, s.Addr(), v.accept, v.encoding)
		if err != nil {
			t.Fatalf("lone scrape %s: %v", v.name, err)
		}
		if r := c.reads(); r != int64(2+i) {
			t.Errorf("lone scrape %s after the shared ones: the sources were read %d times in all, want %d (a finished gather is never reused)", v.name, r, 2+i)
		}
		if len(lone.fams) == 0 {
			t.Fatalf("lone scrape %s decoded no rlhub families: %.300q", v.name, lone.body)
		}
		for j := i; j < n; j += len(scrapeVariants) {
			g := got[j]
			if g.contentType != lone.contentType || g.contentEncoding != lone.contentEncoding {
				t.Errorf("concurrent scrape %s answered %q, %q; a lone one %q, %q", v.name, g.contentType, g.contentEncoding, lone.contentType, lone.contentEncoding)
			}
			if g.body != got[i].body {
				t.Errorf("concurrent scrapes %s answered different bodies", v.name)
			}
			if len(g.fams) != len(lone.fams) {
				t.Errorf("concurrent scrape %s decoded %d rlhub families, a lone one %d", v.name, len(g.fams), len(lone.fams))
			}
			for name, mf := range lone.fams {
				if !proto.Equal(g.fams[name], mf) {
					t.Errorf("concurrent scrape %s: %s is %v, a lone scrape's %v", v.name, name, g.fams[name], mf)
				}
			}
		}
	}
	if ct := got[0].contentType; got[0].contentEncoding != "gzip" || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("a gzip scrape answered %q, %q, want gzipped text", ct, got[0].contentEncoding)
	}
	if got[1].contentEncoding != "" {
		t.Errorf("a scrape asking for identity was answered with Content-Encoding %q", got[1].contentEncoding)
	}
	if ct := got[3].contentType; !strings.HasPrefix(ct, "application/vnd.google.protobuf") {
		t.Errorf("a protobuf scrape answered %q", ct)
	}
	if e := metrics.Encodes(s); e != int64(2*len(scrapeVariants)) {
		t.Errorf("after %d lone scrapes: %d encodings in all, want %d", len(scrapeVariants), e, 2*len(scrapeVariants))
	}
}
