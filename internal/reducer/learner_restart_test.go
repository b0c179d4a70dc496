package reducer_test

// This test is about the learner aggregator, not the reducer: it lives in
// this package because its test binary re-executes itself as `rlhub`
// (childEnv), so the hub can be a real process killed with SIGKILL.

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestLearnerReattachesToRestartedHub: a Go learner attached to a real hub
// process is in the middle of a learn task when the hub is SIGKILLed. The
// coordinator's Learn fails with Unavailable (bounded, never a hang); the
// hub is restarted on the same address and --data; the learner re-attaches
// by itself, and the coordinator's retry of the task (Start, Learn)
// succeeds.
func TestLearnerReattachesToRestartedHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	data := t.TempDir()
	serve := func(listen string) *testkit.Proc {
		return startProc(t, "serve", "--listen", listen, "--data", data, "--log-level", "info")
	}
	hubProc := serve("127.0.0.1:0")
	addr := hubProc.Addr()

	inLearn := make(chan struct{}, 16)
	release := make(chan struct{})
	var attaches int
	attached := make(chan int, 16)
	lctx, lcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- learner.Run(lctx, learner.Config{Hub: addr, ID: "l1", Backoff: 50 * time.Millisecond, Logger: testkit.Logger(),
			OnAttach: func() { attaches++; attached <- attaches },
			OnDemand: func(context.Context, string) (learner.Demand, error) { return learner.Demand{BatchSize: 4}, nil },
			OnLearn: func(ctx context.Context, lt *learner.LearnTask) (map[string]any, error) {
				inLearn <- struct{}{}
				select { // the first task is held until the hub has been killed
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return map[string]any{"rows": float64(lt.Rows)}, nil
			}})
	}()
	defer func() {
		lcancel()
		testkit.Recv(t, done, 30*time.Second, "the learner to stop")
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second,
			Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agg := aggregator.NewClient(conn)
	testkit.Recv(t, attached, 30*time.Second, "the learner to attach")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := agg.Start(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	batch, _ := tensor.NewStateDict(tensor.NewF32("x", 4, 2))
	learnErr := make(chan error, 1)
	go func() {
		_, err := agg.Learn(ctx, "t", batch, nil)
		learnErr <- err
	}()
	testkit.Recv(t, inLearn, 30*time.Second, "the task to reach the learner")
	hubProc.Kill()
	err = testkit.Recv(t, learnErr, 30*time.Second, "the in-flight Learn to fail after the kill")
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Learn across a hub kill: %v, want Unavailable", err)
	}
	close(release) // the learner's callback returns; its reply has nowhere to go

	hubProc = serve(addr)
	if n := testkit.Recv(t, attached, 30*time.Second, "the learner to re-attach by itself"); n < 2 {
		t.Fatalf("attach count %d after the restart", n)
	}
	// The coordinator retries the task.
	testkit.Eventually(t, 30*time.Second, "the retried task to start", func() bool {
		_, err := agg.Start(ctx, "t", nil)
		return err == nil
	})
	resp, err := agg.Learn(ctx, "t", batch, nil)
	if err != nil {
		t.Fatalf("retried Learn after the restart: %v", err)
	}
	if got := resp.GetInfo().GetMapValue().GetFields()["rows"]; got == nil {
		t.Fatalf("merged info of the retried task: %v", resp.GetInfo())
	}
}
