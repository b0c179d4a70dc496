package metrics_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// countedSources are a store, weight sync and aggregator whose Stats count
// their calls; the store holds one model at the version the test sets.
type countedSources struct {
	version               atomic.Uint64
	store, sync, learners atomic.Int64
	// gate, when set, holds every store Stats call until it is closed.
	gate atomic.Pointer[chan struct{}]
}

func (c *countedSources) sources() metrics.Sources {
	return metrics.Sources{
		Store: func() store.Stats {
			c.store.Add(1)
			if g := c.gate.Load(); g != nil {
				<-*g
			}
			return store.Stats{Models: []store.ModelStats{{Name: "policy", Version: c.version.Load()}}}
		},
		Sync:       func(context.Context) wsync.Stats { c.sync.Add(1); return wsync.Stats{} },
		Aggregator: func() aggregator.Stats { c.learners.Add(1); return aggregator.Stats{} },
	}
}

// reads is how many times each source was read, if all alike; else -1.
func (c *countedSources) reads() int64 {
	n := c.store.Load()
	if c.sync.Load() != n || c.learners.Load() != n {
		return -1
	}
	return n
}

func startCounted(t *testing.T, reuse time.Duration, c *countedSources) *metrics.Server {
	t.Helper()
	s, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", StateReuse: reuse, Sources: c.sources(), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Close() })
	return s
}

// fetch GETs path and returns its body.
func fetch(t *testing.T, hc *http.Client, addr, path string) string {
	resp, err := hc.Get("http://" + addr + path)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return string(b)
}

// N dashboard polls and N scrapes that arrive together read each source
// once, however many they are: the endpoint's cost follows time, not
// viewers. Before, each read every source itself (N reads of a hub's
// 5,000 models and 16,940 collectors for N open pages).
func TestConcurrentRequestsReadSourcesOnce(t *testing.T) {
	const n = 8
	c := &countedSources{}
	// Reuse of a finished reading is off: only sharing the reading in
	// progress can keep the count at one.
	s := startCounted(t, -1, c)
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	for _, path := range []string{"/api/state", "/metrics"} {
		c.store.Store(0)
		c.sync.Store(0)
		c.learners.Store(0)
		gate := make(chan struct{})
		c.gate.Store(&gate)
		released := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(released) // a failed wait must not leave requests held
		var wg sync.WaitGroup
		bodies := make([]string, n)
		for i := range n {
			wg.Go(func() { bodies[i] = fetch(t, hc, s.Addr(), path) })
		}
		// Every request is in: reading the store (held at the gate), or
		// waiting for a reading in progress.
		testkit.Eventually(t, 10*time.Second, "every request in the endpoint", func() bool {
			dash, scrapes := metrics.Waiting(s)
			return int(c.store.Load())+dash+scrapes == n
		})
		released()
		wg.Wait()
		if got := c.reads(); got != 1 {
			t.Errorf("%d concurrent GET %s read the sources %d, %d, %d times, want once", n, path, c.store.Load(), c.sync.Load(), c.learners.Load())
		}
		differ := 0
		for _, b := range bodies {
			if b != bodies[0] {
				differ++
			}
		}
		if differ > 0 {
			t.Errorf("%d of %d concurrent GET %s answered other figures than the first", differ, n, path)
		}
	}
}

// A dashboard reading is reused for Config.StateReuse and no longer: a
// poll after it reads the sources again and shows what changed. A scrape
// never reuses a finished reading: one after a change shows it.
func TestStateReusedWithinItsWindowOnly(t *testing.T) {
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	version := func(body string) uint64 {
		var st metrics.State
		if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Models) != 1 {
			t.Fatalf("/api/state %.300q: %v", body, err)
		}
		return st.Models[0].Version
	}

	// Within the window (an hour): the first reading answers.
	c := &countedSources{}
	c.version.Store(1)
	s := startCounted(t, time.Hour, c)
	if v := version(fetch(t, hc, s.Addr(), "/api/state")); v != 1 {
		t.Fatalf("first poll shows version %d, want 1", v)
	}
	c.version.Store(2)
	if v := version(fetch(t, hc, s.Addr(), "/api/state")); v != 1 || c.reads() != 1 {
		t.Errorf("a poll within StateReuse shows version %d after %d readings, want the first reading's 1", v, c.reads())
	}
	fetch(t, hc, s.Addr(), "/") // the page's first render shares it too
	if c.reads() != 1 {
		t.Errorf("the page read the sources again (%d readings) within StateReuse", c.reads())
	}

	// After the window: read again, the change shown.
	const reuse = 100 * time.Millisecond
	c = &countedSources{}
	c.version.Store(1)
	s = startCounted(t, reuse, c)
	for want := uint64(1); want <= 3; want++ {
		c.version.Store(want)
		time.Sleep(2 * reuse) // the last reading is past its window
		if v := version(fetch(t, hc, s.Addr(), "/api/state")); v != want || c.reads() != int64(want) {
			t.Errorf("a poll after StateReuse shows version %d after %d readings, want %d and %d", v, c.reads(), want, want)
		}
	}

	// Scrapes: each one after a change reads again and shows it.
	before := c.reads()
	for want := uint64(4); want <= 5; want++ {
		c.version.Store(want)
		fams := scrape(t, s.Addr())
		if v, _ := value(fams, "rlhub_store_model_version", "model=policy"); v != float64(want) {
			t.Errorf("a scrape after the change shows version %v, want %d", v, want)
		}
	}
	if got := c.reads() - before; got != 2 {
		t.Errorf("2 scrapes one after the other read the sources %d times, want 2", got)
	}
}
