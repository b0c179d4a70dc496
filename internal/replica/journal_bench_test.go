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

// readBytes is what process pid has read (rchar of /proc/PID/io: files
// and sockets).
func readBytes(t testing.TB, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no rchar")
	return 0
}

// journalShipping runs a primary and one standby (acks all) for run,
// under 16 learners pushing 64 KiB gradients to one model in batches of
// 64 (a journal record of ~1 KiB per step), and returns, over the last
// third of the run, the steps per second, what the standby read per step
// (/proc/PID/io rchar: sockets and files) and the primary's journal size
// at the end.
func journalShipping(t testing.TB, run time.Duration, extra ...string) (stepsPerSec, readPerStep float64, journalBytes int64) {
	e := startEtcd(t)
	c := newClusterTTL(t, e, 2, "2s", append([]string{"--reduce-batch-size", "64"}, extra...)...)
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
	time.Sleep(run * 2 / 3)
	a0, r0, start := applied(), readBytes(t, sb.proc.Pid()), time.Now()
	time.Sleep(run / 3)
	a1, r1, secs := applied(), readBytes(t, sb.proc.Pid()), time.Since(start).Seconds()
	fi, err := os.Stat(filepath.Join(p.data, "reducer", store.ModelDir(model), "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	steps := float64(a1-a0) / 64
	return steps / secs, float64(r1-r0) / steps, fi.Size()
}

// BenchmarkJournalShipping: what a replicated reducer step ships as its
// step journal grows (every step ships the whole journal: docs/cluster.md),
// with the default compaction threshold and with the former default (16
// MiB), in one run, RLHUB_JOURNAL_RUN (default 30s) each.
func BenchmarkJournalShipping(b *testing.B) {
	run := 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("RLHUB_JOURNAL_RUN")); err == nil && d > 0 {
		run = d
	}
	for range b.N {
		steps, read, journal := journalShipping(b, run)
		oldSteps, oldRead, oldJournal := journalShipping(b, run, "--reduce-journal-compact", "16MiB")
		b.Logf("after %v: default threshold: journal %d KiB, %.0f steps/s, standby read %.0f KiB per step; 16 MiB: journal %d KiB, %.0f steps/s, %.0f KiB per step",
			run, journal>>10, steps, read/1024, oldJournal>>10, oldSteps, oldRead/1024)
		b.ReportMetric(read/1024, "KiB_read/step")
		b.ReportMetric(oldRead/1024, "KiB_read/step_16MiB")
		b.ReportMetric(steps, "steps/s")
		b.ReportMetric(oldSteps, "steps/s_16MiB")
		b.ReportMetric(steps/oldSteps, "x_steps")
		b.ReportMetric(float64(journal>>10), "journal_KiB")
		b.ReportMetric(float64(oldJournal>>10), "journal_KiB_16MiB")
	}
}
