package arsrpc

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A hub that keeps nothing (no DataDir, a memory store) is replaced at the
// same address while a worker keeps running, and the new hub starts a run
// of another seed, which gets the same id (run-1) and version numbers. The
// worker's work for the old run-1 — a report in flight, or the policy it
// holds — must not count in the new one: the new run's policy is the
// single-process run of its own seed.
func TestReplacedHubRunIsItsSeedsRun(t *testing.T) {
	for _, inFlight := range []bool{true, false} {
		name := "idle worker"
		if inFlight {
			name = "report in flight"
		}
		t.Run(name, func(t *testing.T) { replacedHubRun(t, inFlight) })
	}
}

func replacedHubRun(t *testing.T, inFlight bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Hub A, run-1 of seed 11.
	stA, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svcA, err := New(Config{Store: stA, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	lisA := testkit.Listen(t)
	addr := lisA.Addr().String()
	srvA := grpc.NewServer()
	svcA.Register(srvA)
	var serving sync.WaitGroup
	serving.Go(func() { _ = srvA.Serve(lisA) })
	stopA := sync.OnceFunc(func() { svcA.Drain(); srvA.Stop(); serving.Wait(); svcA.Close(); stA.Close() })
	t.Cleanup(stopA)
	clientA := pb.NewARSClient(dial(t, addr))
	specA := runSpec()
	startA, err := clientA.StartRun(ctx, &pb.ARSStartRunRequest{Spec: specA})
	if err != nil {
		t.Fatal(err)
	}

	// The worker: its second lease (it holds run-1 v1 by then) waits
	// until the hub is replaced.
	leased, release := make(chan struct{}, 1), make(chan struct{})
	var n int
	hook := func(*pb.ARSLeaseResponse) {
		if n++; n != 2 {
			return
		}
		if !inFlight {
			// Run-1 ends on hub A; the worker's report is stale and
			// it waits idle, holding run-1 v1.
			if _, err := clientA.StopRun(ctx, &pb.ARSStopRunRequest{RunId: startA.RunId}); err != nil {
				t.Error(err)
			}
			leased <- struct{}{}
			return
		}
		leased <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := RunWorker(wctx, WorkerConfig{Conn: dial(t, addr), Name: "w", MaxTasks: 3, Logger: testkit.Logger(), afterLease: hook}); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	defer func() { wcancel(); <-done }()
	testkit.Recv(t, leased, 30*time.Second, "the worker's second lease")
	if !inFlight {
		time.Sleep(200 * time.Millisecond) // the stale report answered, the worker long-polls
	}
	stopA()

	// Hub B at the same address, run-1 of seed 12.
	stB, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svcB, err := New(Config{Store: stB, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svcB.Close(); stB.Close() })
	testkit.ServeGRPC(t, testkit.ListenAt(t, addr), svcB.Register)
	t.Cleanup(svcB.Drain)
	clientB := pb.NewARSClient(dial(t, addr))
	specB := runSpec()
	specB.Seed = 12
	startB, err := clientB.StartRun(ctx, &pb.ARSStartRunRequest{Spec: specB})
	if err != nil {
		t.Fatal(err)
	}
	if startB.RunId != startA.RunId {
		t.Fatalf("hub B's run is %s, hub A's %s", startB.RunId, startA.RunId)
	}
	if inFlight {
		close(release)
	}
	prog := watch(t, ctx, clientB, startB.RunId)
	if last := prog[len(prog)-1]; last.Reason != "budget" {
		t.Fatalf("hub B's run ended: %v", last)
	}
	p, _, err := PullPolicy(ctx, clientB, startB.RunId, 0)
	if err != nil {
		t.Fatal(err)
	}
	ref := localReference(t, specB)
	if !slices.Equal(p.Theta, ref.Theta()) || !slices.Equal(p.Stats.Mean, ref.Stats().Mean) || p.Stats.Count != ref.Stats().Count {
		t.Errorf("hub B's run of seed 12 differs from the single-process run of seed 12:\n%v\n%v", p.Theta, ref.Theta())
	}
}
