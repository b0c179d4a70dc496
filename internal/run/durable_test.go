package run

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// rlhubBinary returns the rlhub binary under test: $RLHUB_BIN, or one
// built from this module into a temporary directory.
func rlhubBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("RLHUB_BIN"); b != "" {
		return b
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "rlhub")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rlhub")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// hubProc is a real `rlhub serve` process.
type hubProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited
}

// startHub runs `rlhub serve` on listen with data dir data; crash, when
// not "", is the RLHUB_TEST_ARS_CRASH point. It returns the bound address.
func startHub(t *testing.T, bin, listen, data, crash string) (*hubProc, string) {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	cmd := exec.Command(bin, "--log-level", "warn", "serve", "--listen", listen, "--data", data, "--addr-file", addrFile)
	cmd.Env = append(os.Environ(), "RLHUB_TEST_ARS_CRASH="+crash)
	h := &hubProc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = h.out, h.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(h.done) }()
	t.Cleanup(func() { h.kill() })
	var addr string
	testkit.Eventually(t, 30*time.Second, "the hub's address file", func() bool {
		// The file first: a hub may listen and reach its crash point (a
		// worker reporting at once) before this poll comes round.
		if b, err := os.ReadFile(addrFile); err == nil && strings.TrimSpace(string(b)) != "" {
			addr = strings.TrimSpace(string(b))
			return true
		}
		select {
		case <-h.done:
			t.Fatalf("hub exited before listening: %s", h.out.String())
		default:
		}
		return false
	})
	return h, addr
}

func (h *hubProc) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	<-h.done
}

// killedBy reports how the process ended ("" while it runs).
func (h *hubProc) killedBy() string {
	select {
	case <-h.done:
	default:
		return ""
	}
	if ws, ok := h.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return h.cmd.ProcessState.String()
}

// startWorkers runs n `rlhub worker ars` processes against addr; they stop
// (SIGINT) at cleanup.
func startWorkers(t *testing.T, bin, addr string, n int) {
	t.Helper()
	for i := range n {
		cmd := exec.Command(bin, "--log-level", "warn", "worker", "ars", "--hub", addr, "--name", fmt.Sprintf("ext-%d", i), "--retry-for", "60s")
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cmd.Process.Signal(os.Interrupt)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			if st := cmd.ProcessState; st != nil && st.ExitCode() > 0 {
				t.Errorf("worker %d: %v\n%s", i, cmd.ProcessState, out.String())
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
	bin := rlhubBinary(t)
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
	h, addr := startHub(t, bin, "127.0.0.1:0", data, crashes[0])
	startWorkers(t, bin, addr, 2)

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
		case <-h.done:
		case r := <-done:
			t.Fatalf("the run ended (%v) before the hub crashed at %q: %s", r.err, crashes[i], h.out.String())
		case <-ctx.Done():
			t.Fatalf("hub never reached crash point %q", crashes[i])
		}
		if how := h.killedBy(); how != "killed" {
			t.Fatalf("hub with crash point %q ended by %q, want SIGKILL: %s", crashes[i], how, h.out.String())
		}
		next := ""
		if i+1 < len(crashes) {
			next = crashes[i+1]
		}
		h, _ = startHub(t, bin, addr, data, next)
	}
	// One more kill from outside, just after an iteration arrived.
	testkit.Recv(t, iterCh, 2*time.Minute, "an iteration after the last crash point")
	h.kill()
	h, _ = startHub(t, bin, addr, data, "")

	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the run did not finish")
	}
	if r.err != nil {
		t.Fatalf("run: %v\nhub: %s", r.err, h.out.String())
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
	if r.sum.HubReconnects < 1 {
		t.Errorf("summary counts %d reconnects", r.sum.HubReconnects)
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
