package arsrpc

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/store"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// watched is a WatchRun stream that keeps what it is sent.
type watched struct {
	grpc.ServerStream
	ctx context.Context
	got []*pb.ARSProgress
}

func (w *watched) Context() context.Context     { return w.ctx }
func (w *watched) Send(p *pb.ARSProgress) error { w.got = append(w.got, p); return nil }

// TestFailedSaveLogsItsEntriesOnce: a save that fails after appending
// the run's new progress entries (state.json cannot be written) left them
// in progress.log while counting them unlogged; the next save appended
// them again. A restart then read the iteration twice and lost the run's
// done entry, and WatchRun of the ended run never ended. The log is now
// cut back when the save fails, and each entry is logged once.
func TestFailedSaveLogsItsEntriesOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s1 := newSvc(t, st, dir)
	start, err := s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, start.RunId, "progress.log")
	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, start.RunId, "state.json.tmp")
	if err := os.Mkdir(blocker, 0o755); err != nil { // the next state.json cannot be written
		t.Fatal(err)
	}
	drive(t, s1, start.RunId, 1)
	if rs := s1.Stats().Runs[0]; !rs.Done {
		t.Fatalf("a run whose state could not be written goes on: %+v", rs)
	}
	if after, err := os.ReadFile(logPath); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("progress.log after the failed save: %d bytes, %v (want its %d bytes before)", len(after), err, len(before))
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.StopRun(ctx, &pb.ARSStopRunRequest{RunId: start.RunId}); err != nil {
		t.Fatal(err)
	}
	s1.Close()

	s2 := newSvc(t, st, dir)
	defer s2.Close()
	s2.mu.Lock()
	r := s2.c.runs[start.RunId]
	var iters []int64
	var done bool
	for _, p := range r.progress {
		if p.Done {
			done = true
		} else {
			iters = append(iters, int64(p.Iteration))
		}
	}
	s2.mu.Unlock()
	for i := 1; i < len(iters); i++ {
		if iters[i] <= iters[i-1] {
			t.Fatalf("restored progress logs iterations %v: one twice", iters)
		}
	}
	if !done {
		t.Fatal("the restored run has no done entry")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s2.WatchRun(&pb.ARSWatchRunRequest{RunId: start.RunId}, &watched{ctx: wctx}); err != nil {
		t.Fatalf("WatchRun of the ended run: %v", err)
	}
}

// StopRun is acknowledged only once the stopped state is written: with
// state.json unwritable it fails Unavailable (a restart would resume the
// run from the state on disk), and succeeds once it can be written.
func TestStopRunIsAcknowledgedOnlyWhenWritten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newSvc(t, st, dir)
	defer s.Close()
	start, err := s.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, start.RunId, "state.json.tmp")
	if err := os.Mkdir(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StopRun(ctx, &pb.ARSStopRunRequest{RunId: start.RunId}); status.Code(err) != codes.Unavailable {
		t.Fatalf("StopRun with its state unwritable: %v, want Unavailable", err)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StopRun(ctx, &pb.ARSStopRunRequest{RunId: start.RunId}); err != nil {
		t.Fatalf("StopRun asked again: %v", err)
	}
}
