package hub

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestARSRunWhosePolicyIsDeletedEndsSayingSo: an ARS run's policy model
// deleted by an administrator (`rlhub model rm`) mid-run, and pushed
// again by another writer at the run's version: the run went on, leasing
// tasks on the new model's weights and publishing its next version over
// it (claiming it). It now ends when the Delete returns, failed, saying
// its policy was deleted; the new model is left as pushed, and the
// worker carries on (it is not wedged).
func TestARSRunWhosePolicyIsDeletedEndsSayingSo(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	spec := &rlhubv1.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: 2, Top: 1, EvalEvery: 1 << 30, MaxIterations: 1000}
	run, err := rlhubv1.NewARSClient(conn).StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	// worker runs a real worker until the returned stop is called (once
	// or more: each returns the worker's error).
	worker := func() (stop func() error) {
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := arsrpc.RunWorker(wctx, arsrpc.WorkerConfig{Conn: conn, Name: "w", Wait: 50 * time.Millisecond})
			done <- err
		}()
		return sync.OnceValue(func() error { wcancel(); return <-done })
	}
	stop := worker()
	if _, err := sc.WaitNewer(ctx, run.Model, 2); err != nil {
		stop()
		t.Fatal(err)
	}
	if err := stop(); err != nil { // the run idles at its version
		t.Fatal(err)
	}
	snap, err := sc.Get(ctx, run.Model, 0)
	if err != nil {
		t.Fatal(err)
	}
	v, blob := snap.Version, bytes.Clone(snap.Blob)

	if err := sc.Delete(ctx, run.Model); err != nil {
		t.Fatal(err)
	}
	var rs arsrpc.RunStats
	for _, r := range h.ars.Stats().Runs {
		if r.ID == run.RunId {
			rs = r
		}
	}
	if !rs.Done || !strings.Contains(rs.Reason, "deleted from the store") {
		t.Errorf("the run when the Delete of its policy returned: done %v, reason %q; want it ended, saying its policy was deleted", rs.Done, rs.Reason)
	}
	if _, err := sc.Push(ctx, store.PushRequest{Name: run.Model, Version: v, Expect: 0, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	// A worker finds nothing of the run to do; were the run still going,
	// it would publish its next version over the model pushed again.
	stop = worker()
	defer stop()
	testkit.Eventually(t, time.Minute, "the run to end", func() bool {
		if now, err := sc.Get(ctx, run.Model, 0); err == nil && now.Version > v {
			t.Fatalf("the run published version %d over its policy deleted and pushed again at version %d", now.Version, v)
		}
		for _, r := range h.ars.Stats().Runs {
			if r.ID == run.RunId {
				rs = r
			}
		}
		return rs.Done
	})
	if now, err := sc.Get(ctx, run.Model, 0); err != nil || now.Version != v || !bytes.Equal(now.Blob, blob) {
		t.Fatalf("the model pushed again after the run ended: %v; want version %d as pushed", err, v)
	}
	if err := stop(); err != nil {
		t.Fatalf("the worker: %v", err)
	}
}
