package replica_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// written is what process pid has written (wchar of /proc/PID/io:
// files and sockets).
func written(t testing.TB, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no wchar in /proc/%d/io", pid)
	return 0
}

// journalRun is one journalShipping measurement, per step over the
// last third of the run: steps/s, the primary's CPU time and bytes
// written (its files and its sockets: the version persisted, the unit
// shipped), and the primary's journal size at the end.
type journalRun struct {
	steps, cpuMS, written float64
	journal               int64
}

// journalShipping runs a primary and one standby (acks all; bin, or the
// test's build when ""), under 16 learners pushing 64 KiB gradients to
// one model in batches of 64 (a journal record of ~1 KiB per step).
func journalShipping(t testing.TB, run time.Duration, bin string, extra ...string) journalRun {
	e := startEtcd(t)
	c := newClusterBin(t, e, 2, "2s", bin, append([]string{"--reduce-batch-size", "64"}, extra...)...)
	l, p := c.leader(0)
	sb := c.standbys(p)[0]
	c.synced(sb, l)
	const n = 16 << 10
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{n}, make([]float32, n)))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	const model = "jm"
	c.push(model, 1, 0, blob)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rcs []*reducer.Client
	for i := range 16 {
		rc, err := reducer.NewClient(reducer.ClientConfig{Hub: p.addr, ClientID: fmt.Sprintf("learner-%02d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Close() })
		rcs = append(rcs, rc)
	}
	if _, _, err := rcs[0].Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, rc := range rcs {
		wg.Go(func() {
			v := uint64(1)
			for ctx.Err() == nil {
				r, err := rc.PushGrad(ctx, model, v, sd)
				if err != nil {
					return
				}
				v = max(v, r.Version)
			}
		})
	}
	applied := func() uint64 {
		st, err := rcs[0].HubStats(ctx, p.addr)
		if err != nil {
			t.Fatal(err)
		}
		return st.Models[model].Counters.Applied
	}
	pid := p.proc.Pid()
	time.Sleep(run * 2 / 3)
	a0, c0, start := applied(), cpuTime(pid), time.Now()
	w0 := written(t, pid)
	time.Sleep(run / 3)
	a1, c1, secs := applied(), cpuTime(pid), time.Since(start).Seconds()
	w1 := written(t, pid)
	fi, err := os.Stat(filepath.Join(p.data, "reducer", store.ModelDir(model), "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	steps := float64(a1-a0) / 64
	return journalRun{steps: steps / secs, cpuMS: float64(c1-c0) / float64(time.Millisecond) / steps, written: float64(w1-w0) / steps, journal: fi.Size()}
}

// BenchmarkJournalShipping: what a replicated reducer step costs the
// primary as its step journal grows, with the default compaction
// threshold and with the former default (16 MiB), in one run of
// RLHUB_JOURNAL_RUN (default 30s) each. A unit ships the journal's new
// bytes only (Source.Appended), so the threshold should not show; with
// RLHUB_JOURNAL_BASE_BIN the second run is that build's, at its default.
func BenchmarkJournalShipping(b *testing.B) {
	run := 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("RLHUB_JOURNAL_RUN")); err == nil && d > 0 {
		run = d
	}
	base, baseArgs, sfx := os.Getenv("RLHUB_JOURNAL_BASE_BIN"), []string{"--reduce-journal-compact", "16MiB"}, "_16MiB"
	if base != "" {
		baseArgs, sfx = nil, "_base"
	}
	for range b.N {
		r := journalShipping(b, run, "")
		o := journalShipping(b, run, base, baseArgs...)
		b.Logf("after %v: this build at its default threshold: journal %d KiB, %.0f steps/s, primary CPU %.2f ms and %.0f KiB written per step; %s: journal %d KiB, %.0f steps/s, %.2f ms, %.0f KiB",
			run, r.journal>>10, r.steps, r.cpuMS, r.written/1024, strings.TrimPrefix(sfx, "_"), o.journal>>10, o.steps, o.cpuMS, o.written/1024)
		b.ReportMetric(r.steps, "steps/s")
		b.ReportMetric(o.steps, "steps/s"+sfx)
		b.ReportMetric(r.steps/o.steps, "x_steps"+sfx)
		b.ReportMetric(r.cpuMS, "cpu_ms/step")
		b.ReportMetric(o.cpuMS, "cpu_ms/step"+sfx)
		b.ReportMetric(r.written/1024, "KiB_written/step")
		b.ReportMetric(o.written/1024, "KiB_written/step"+sfx)
		b.ReportMetric(float64(r.journal>>10), "journal_KiB")
		b.ReportMetric(float64(o.journal>>10), "journal_KiB"+sfx)
	}
}
