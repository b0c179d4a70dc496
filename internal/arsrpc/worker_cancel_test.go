package arsrpc

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// slowEnv is a 1-D environment whose steps take 5 ms (a loaded MuJoCo
// step takes 1–4 ms) over 200-step episodes: one lease of 8 tasks is
// about 16 s of work.
type slowEnv struct {
	obs [1]float64
	n   int
}

func (e *slowEnv) Spec() env.Spec {
	return env.Spec{Name: "SlowForTest-v0", ObsDim: 1, ActDim: 1, ActLow: []float64{-1}, ActHigh: []float64{1}, MaxEpisodeSteps: 200}
}
func (e *slowEnv) Reset(*rand.Rand) []float64 { e.n = 0; return e.obs[:] }
func (e *slowEnv) Step([]float64) ([]float64, float64, bool, bool) {
	time.Sleep(5 * time.Millisecond)
	e.n++
	return e.obs[:], 1, false, e.n >= 200
}

func init() { env.Register("SlowForTest-v0", func() (env.Env, error) { return &slowEnv{}, nil }) }

// A worker whose context is cancelled (SIGTERM) in the middle of a lease
// stops its episode, detaches and returns within a second or two, its
// leases released at once; it used to run every task of the lease first
// (16 s here) and then lose the results to the cancelled report.
func TestWorkerCancelStopsMidLease(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: &pb.ARSRunSpec{
		Env: "SlowForTest-v0", Seed: 1, Version: "V1", Directions: 16, StepSize: 0.01, Noise: 0.01, EvalEvery: 1, EvalEpisodes: 1, MaxIterations: 1}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	leased := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := RunWorker(wctx, WorkerConfig{Conn: dial(t, h.addr), Name: "w", MaxTasks: 8, Logger: testkit.Logger(),
			afterLease: func(*pb.ARSLeaseResponse) {
				select {
				case leased <- struct{}{}:
				default:
				}
			}})
		done <- err
	}()
	testkit.Recv(t, leased, 30*time.Second, "a lease")
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	wcancel() // SIGTERM
	if err := testkit.Recv(t, done, 30*time.Second, "the worker to return"); err != nil {
		t.Fatalf("worker: %v", err)
	}
	d := time.Since(t0)
	if d > 2*time.Second {
		t.Fatalf("RunWorker returned %v after its context was cancelled", d.Round(time.Millisecond))
	}
	t.Logf("RunWorker returned %v after its context was cancelled", d.Round(time.Millisecond))
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	r := h.svc.c.runs[start.RunId]
	for i, ls := range r.leases {
		if len(ls) != 0 {
			t.Fatalf("task %v is still leased after the worker left", r.tasks[i])
		}
	}
}
