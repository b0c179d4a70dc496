package arsrpc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestFinishedRunsCloseTheirLogs: every run a hub started kept its
// progress.log open until the hub stopped, so each finished run cost a
// file descriptor for the process's life (under a container's 128-fd
// limit, StartRun failed "too many open files" after 115 runs, none
// live). A real `rlhub serve` starts and stops 200 runs.
func TestFinishedRunsCloseTheirLogs(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	h := testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: addrFile, StartTimeout: 60 * time.Second,
		Args: []string{"--log-level", "warn", "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--addr-file", addrFile}})
	c := pb.NewARSClient(dial(t, h.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", h.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	startStop := func(i int) {
		r, err := c.StartRun(ctx, &pb.ARSStartRunRequest{Spec: &pb.ARSRunSpec{Env: "CartPole-v1", MaxIterations: 5}, RequestId: fmt.Sprintf("req-%d", i)})
		if err != nil {
			t.Fatalf("start run %d: %v", i, err)
		}
		if _, err := c.StopRun(ctx, &pb.ARSStopRunRequest{RunId: r.RunId}); err != nil {
			t.Fatalf("stop run %s: %v", r.RunId, err)
		}
	}
	for i := range 5 { // warm up
		startStop(i)
	}
	before := fds()
	const n = 200
	for i := range n {
		startStop(100 + i)
	}
	if after := fds(); after-before > 20 {
		t.Errorf("%d finished runs left %d more file descriptors open in the hub", n, after-before)
	}
}

// TestSilentWorkersAreNotCounted: workers were forgotten only when some
// worker leased, so the last one to die stayed counted for ever
// (rlhub_ars_workers, the dashboard). Stats counts a worker silent for a
// lease TTL as gone.
func TestSilentWorkersAreNotCounted(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := startHub(t, Config{Now: clock, LeaseTTL: 10 * time.Second})
	c := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Attach(ctx, &pb.ARSAttachRequest{Name: "doomed"}); err != nil {
		t.Fatal(err)
	}
	if n := h.svc.Stats().Workers; n != 1 {
		t.Fatalf("workers after an attach: %d", n)
	}
	mu.Lock()
	now = now.Add(11 * time.Second) // silent past its lease TTL: it died
	mu.Unlock()
	if n := h.svc.Stats().Workers; n != 0 {
		t.Errorf("workers a lease TTL after the only one went silent: %d, want 0", n)
	}
}

// TestCurveKeptIncrementally: Stats rebuilt every run's curve from all its
// progress under the coordinator lock at each scrape (a hub with 300 long
// runs held leases up to 211 ms per scrape). The curve is kept as
// progress arrives; it must equal the last MaxCurvePoints evaluations
// across its compactions.
func TestCurveKeptIncrementally(t *testing.T) {
	r := &run{}
	var evals []uint64
	for it := range 5*MaxCurvePoints + 7 {
		p := &pb.ARSProgress{Iteration: uint64(it), HasEval: it%3 != 0, EvalMean: float64(it)}
		r.addProgress(p)
		if p.HasEval {
			evals = append(evals, uint64(it))
		}
		if len(evals) > 0 && (it%997 == 0 || it == 5*MaxCurvePoints+6) {
			n := len(r.curve)
			got := r.curve[max(0, n-MaxCurvePoints):]
			want := evals[max(0, len(evals)-MaxCurvePoints):]
			if len(got) != len(want) {
				t.Fatalf("iteration %d: curve of %d points, want %d", it, len(got), len(want))
			}
			for i := range got {
				if got[i].Iteration != want[i] || got[i].EvalMean != float64(want[i]) {
					t.Fatalf("iteration %d: point %d is iteration %d, want %d", it, i, got[i].Iteration, want[i])
				}
			}
		}
	}
}
