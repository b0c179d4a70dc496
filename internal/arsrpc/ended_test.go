package arsrpc

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestEndedRunsAreBounded: the coordinator kept every run a hub ever
// started, in its run map and in the list every Lease (and every expiry,
// detach and wake-up) scans, and a restart loaded them all again with
// their progress: a long-lived hub running a sweep of short runs (`rlhub
// train ars` in a loop, a Ray driver) held, and scanned, all of them. A
// lease scans the live runs only; the newest MaxEndedRuns ended ones are
// kept in memory, before and after a restart; what a client may ask of an
// older one (its progress, its policy, StopRun) is answered from --data.
func TestEndedRunsAreBounded(t *testing.T) {
	const keep, n = 4, 40
	// A hub as `rlhub serve --data` runs it: the store on disk too, so
	// the heap measured is the coordinator's.
	dir, storeDir := t.TempDir(), t.TempDir()
	st, err := store.OpenFile(store.FileConfig{Dir: storeDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := New(Config{Store: st, DataDir: dir, MaxEndedRuns: keep, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	h := &testHub{addr: testkit.ServeGRPC(t, nil, svc.Register), svc: svc, store: st}
	t.Cleanup(svc.Drain)
	stop := workers(t, h.addr, 1)
	defer stop()
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := &pb.ARSRunSpec{Env: "CartPole-v1", Directions: 2, MaxIterations: 8, EvalEvery: 1, EvalEpisodes: 1}
	type ended struct {
		id   string
		prog []*pb.ARSProgress
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var runs []ended
	var before uint64
	for i := range n {
		if i == 1 {
			before = heap() // after the first run: workers and connections warm
		}
		spec.Seed = uint64(i)
		r, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec, RequestId: fmt.Sprintf("req-%d", i)})
		if err != nil {
			t.Fatalf("start run %d: %v", i, err)
		}
		if i%4 == 3 { // some are stopped rather than finished
			if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: r.RunId}); err != nil {
				t.Fatal(err)
			}
		}
		prog := watch(t, ctx, client, r.RunId)
		if len(prog) == 0 || !prog[len(prog)-1].Done {
			t.Fatalf("run %s ended without a final entry: %v", r.RunId, prog)
		}
		runs = append(runs, ended{r.RunId, prog})
	}
	t.Logf("heap after GC grew %+d bytes per ended run over %d runs (the store's newest version of each run's model included)", (int64(heap())-int64(before))/(n-1), n-1)

	h.svc.mu.Lock()
	scanned, kept := len(h.svc.c.order), len(h.svc.c.runs)
	h.svc.mu.Unlock()
	if scanned != 0 {
		t.Errorf("a lease scans %d runs after %d ended, none live; want 0", scanned, n)
	}
	if kept > keep {
		t.Errorf("%d ended runs kept in memory, want at most MaxEndedRuns = %d", kept, keep)
	}
	if got := len(h.svc.Stats().Runs); got > keep {
		t.Errorf("Stats lists %d runs, want at most %d", got, keep)
	}

	// What clients ask of an ended run, kept or not.
	answers := func(client pb.ARSClient) {
		t.Helper()
		for _, r := range runs {
			got := watch(t, ctx, client, r.id)
			if !slices.EqualFunc(got, r.prog, func(a, b *pb.ARSProgress) bool { return proto.Equal(a, b) }) {
				t.Errorf("run %s: WatchRun after it ended sent %d entries, not the %d it sent while it ran", r.id, len(got), len(r.prog))
			}
			if _, _, err := PullPolicy(ctx, client, r.id, 0); err != nil {
				t.Errorf("run %s: PullPolicy after it ended: %v", r.id, err)
			}
			if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: r.id}); err != nil {
				t.Errorf("run %s: StopRun after it ended: %v", r.id, err)
			}
		}
		again, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec, RequestId: fmt.Sprintf("req-%d", n-1)})
		if err != nil || again.RunId != runs[n-1].id {
			t.Errorf("StartRun retry of the newest ended run: %v %v, want run %s", again, err, runs[n-1].id)
		}
		for _, id := range []string{"run-999", "../" + runs[0].id, "run-01"} {
			if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: id}); status.Code(err) != codes.NotFound {
				t.Errorf("StopRun of %q: %v, want NotFound", id, err)
			}
		}
	}
	answers(client)

	// A late report of a forgotten run is stale, as of a kept ended one.
	w, err := client.Attach(ctx, &pb.ARSAttachRequest{Name: "late"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := client.Report(ctx, &pb.ARSReportRequest{WorkerId: w.WorkerId, RunId: runs[0].id,
		Results: []*pb.ARSTaskResult{{Task: &pb.ARSTask{Kind: pb.ARSTaskKind_ARS_TASK_KIND_DIRECTION}}}})
	if err != nil || rep.Stale != 1 {
		t.Errorf("late report of a forgotten run: %v %v, want 1 stale", rep, err)
	}

	// A restart keeps the newest MaxEndedRuns only, and answers the same.
	stop()
	h.svc.Close()
	s2, err := New(Config{Store: h.store, DataDir: dir, MaxEndedRuns: keep, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	addr := testkit.ServeGRPC(t, nil, s2.Register)
	t.Cleanup(s2.Drain)
	s2.mu.Lock()
	var restored []string
	for id := range s2.c.runs {
		restored = append(restored, id)
	}
	s2.mu.Unlock()
	slices.Sort(restored)
	var want []string
	for _, r := range runs[n-keep:] {
		want = append(want, r.id)
	}
	slices.Sort(want)
	if !slices.Equal(restored, want) {
		t.Errorf("a restart loaded runs %v, want the newest %d ended: %v", restored, keep, want)
	}
	answers(pb.NewARSClient(dial(t, addr)))
}

// TestForgottenRunWithoutDataDir: a hub without --data cannot answer an
// ended run it no longer keeps; it says so (NotFound) instead of
// pretending the run never existed, and still answers the kept one.
func TestForgottenRunWithoutDataDir(t *testing.T) {
	h := startHub(t, Config{MaxEndedRuns: 1})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for range 2 {
		r, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: runSpec()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: r.RunId}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.RunId)
	}
	if prog := watch(t, ctx, client, ids[1]); len(prog) != 1 || prog[0].Reason != "stopped" {
		t.Errorf("the kept ended run's progress: %v", prog)
	}
	stream, err := client.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: ids[0]})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "no longer kept") {
		t.Errorf("WatchRun of a forgotten run without --data: %v, want NotFound saying it is no longer kept", err)
	}
	if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: ids[0]}); status.Code(err) != codes.NotFound {
		t.Errorf("StopRun of a forgotten run without --data: %v, want NotFound", err)
	}
}
