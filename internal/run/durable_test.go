package run

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// startHub runs `rlhub serve` on listen with data dir data; crash, when
// not "", is the RLHUB_TEST_ARS_CRASH point. It returns once the hub has
// written its address (the file is read before the exit is checked: a
// hub may listen and reach its crash point at once).
func startHub(t *testing.T, listen, data, crash string) *testkit.Proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	return testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: addrFile, StartTimeout: 30 * time.Second,
		Args: []string{"--log-level", "warn", "serve", "--listen", listen, "--data", data, "--addr-file", addrFile},
		Env:  []string{"RLHUB_TEST_ARS_CRASH=" + crash}})
}

// killedBy reports how the process ended ("" while it runs).
func killedBy(h *testkit.Proc) string {
	st := h.State()
	if st == nil {
		return ""
	}
	if sig, ok := h.KilledBy(); ok {
		return sig.String()
	}
	return st.String()
}

// startWorkers runs n `rlhub worker ars` processes against addr; they stop
// (SIGINT, then SIGKILL after 10s) at cleanup, and one that exited with
// an error fails the test.
func startWorkers(t *testing.T, addr string, n int) {
	t.Helper()
	for i := range n {
		w := testkit.StartProc(t, testkit.ProcConfig{Name: fmt.Sprintf("worker %d", i),
			Args: []string{"--log-level", "warn", "worker", "ars", "--hub", addr, "--name", fmt.Sprintf("ext-%d", i), "--retry-for", "60s"}})
		t.Cleanup(func() {
			w.Stop(os.Interrupt, 10*time.Second)
			if st := w.State(); st.ExitCode() > 0 {
				t.Errorf("worker %d: %v\n%s", i, st, w.Output())
			}
		})
	}
}

func durableSpec() *pb.ARSRunSpec {
	return &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 11, Directions: 8, Top: 4, MaxIterations: 40, EvalEvery: 3, EvalEpisodes: 8}
}

// The hub process is SIGKILLed at named points of an ARS run — results
// accepted mid-iteration, an evaluation in progress, state.json half
// written, the state on disk but the version not yet published, an
// iteration fully recorded — and once from outside right after an
// iteration, and restarted on the same --data and address each time. The
// external workers and the training client ride it out; the run ends with
// a policy byte-identical to an undisturbed run's and a curve with every
// iteration exactly once.
func TestRunSurvivesHubKills(t *testing.T) {
	survivesHubKills(t, durableSpec, []string{"report:2", "eval-report:1", "snapshot:3", "publish:2", "iteration:2", "report:5"})
}

// The same with Adam, a warm-up + cosine schedule and clipping: a restart
// resumes with the optimizer's state (moments, step count, schedule
// position) from state.json, so the policy is still byte-identical.
func TestOptimizerRunSurvivesHubKills(t *testing.T) {
	spec := func() *pb.ARSRunSpec {
		s := durableSpec()
		s.MaxIterations = 20
		s.Optimizer = &pb.ReducerOptimizer{Kind: "adam", Schedule: "cosine", TMax: 12, WarmupSteps: 3}
		s.GradientMax = 0.5
		return s
	}
	sum := survivesHubKills(t, spec, []string{"report:2", "snapshot:3", "publish:2", "iteration:4"})
	if sum.Optimizer == nil || sum.Optimizer.Kind != "adam" || sum.Optimizer.Schedule != "cosine" || sum.GradientMax != 0.5 {
		t.Fatalf("summary optimizer %+v, gradient max %v", sum.Optimizer, sum.GradientMax)
	}
}

func survivesHubKills(t *testing.T, durableSpec func() *pb.ARSRunSpec, crashes []string) Summary {
	bin := testkit.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The undisturbed run: an embedded hub and the binary's workers.
	ref := t.TempDir()
	refSum, err := Run(ctx, Config{Spec: durableSpec(), Workers: 2, WorkerCommand: []string{bin}, Out: ref, Logger: testkit.Logger()})
	if err != nil {
		t.Fatalf("undisturbed run: %v", err)
	}
	want, err := os.ReadFile(filepath.Join(ref, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}

	data := t.TempDir()
	h := startHub(t, "127.0.0.1:0", data, crashes[0])
	addr := h.Addr()
	startWorkers(t, addr, 2)

	var mu sync.Mutex
	var seen []uint64
	iterCh := make(chan uint64, 64)
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	out := t.TempDir()
	go func() {
		sum, err := Run(ctx, Config{Spec: durableSpec(), Hub: addr, Out: out, ReconnectWindow: time.Minute, Logger: testkit.Logger(),
			Observer: ObserverFunc(func(it Iteration) {
				mu.Lock()
				seen = append(seen, it.Iteration)
				mu.Unlock()
				select {
				case iterCh <- it.Iteration:
				default:
				}
			})})
		done <- result{sum, err}
	}()

	for i := range crashes {
		select {
		case <-h.Done():
		case r := <-done:
			t.Fatalf("the run ended (%v) before the hub crashed at %q: %s", r.err, crashes[i], h.Output())
		case <-ctx.Done():
			t.Fatalf("hub never reached crash point %q", crashes[i])
		}
		if how := killedBy(h); how != "killed" {
			t.Fatalf("hub with crash point %q ended by %q, want SIGKILL: %s", crashes[i], how, h.Output())
		}
		next := ""
		if i+1 < len(crashes) {
			next = crashes[i+1]
		}
		h = startHub(t, addr, data, next)
	}
	// One more kill from outside, just after an iteration arrived.
	testkit.Recv(t, iterCh, 2*time.Minute, "an iteration after the last crash point")
	h.Kill()
	h = startHub(t, addr, data, "")

	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the run did not finish")
	}
	if r.err != nil {
		t.Fatalf("run: %v\nhub: %s", r.err, h.Output())
	}
	got, err := os.ReadFile(filepath.Join(out, "policy.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("policy after %d hub kills differs from the undisturbed run's", len(crashes)+1)
	}
	if r.sum.Iterations != refSum.Iterations || r.sum.Episodes != refSum.Episodes || *r.sum.FinalEvalMean != *refSum.FinalEvalMean {
		t.Fatalf("summary %+v, undisturbed %+v", r.sum, refSum)
	}
	// Each outage the client noticed counts once: the first crash point
	// lands after StartRun reached the hub, while the client waits for
	// its answer or follows the run, so at least one is noticed; no more
	// than the kills can be (the old count, one per attempt while a hub
	// was down, ran past it).
	t.Logf("%d hub kills, %d reconnects counted", len(crashes)+1, r.sum.HubReconnects)
	if n := r.sum.HubReconnects; n < 1 || n > len(crashes)+1 {
		t.Errorf("summary counts %d reconnects over %d hub kills", n, len(crashes)+1)
	}
	recs := readCurve(t, out)[1:]
	if uint64(len(recs)) != refSum.Iterations {
		t.Fatalf("curve.csv has %d rows, want %d", len(recs), refSum.Iterations)
	}
	refRecs := readCurve(t, ref)[1:]
	for i, rec := range recs {
		if rec[0] != strconv.Itoa(i) {
			t.Fatalf("curve.csv row %d is iteration %s", i, rec[0])
		}
		// Every column but the two clocks matches the undisturbed run.
		for c := range rec {
			if curveHeader[c] != "wall_seconds" && curveHeader[c] != "hub_seconds" && rec[c] != refRecs[i][c] {
				t.Fatalf("curve.csv row %d column %s: %s, undisturbed %s", i, curveHeader[c], rec[c], refRecs[i][c])
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, it := range seen {
		if it != uint64(i) {
			t.Fatalf("observer saw iterations %v", seen)
		}
	}
	return r.sum
}
