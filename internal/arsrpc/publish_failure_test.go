package arsrpc

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// refusingStore refuses every push while refuse is set, as a store that
// is full or unreachable does.
type refusingStore struct {
	store.Store
	refuse atomic.Bool
}

func (s *refusingStore) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	if s.refuse.Load() {
		return store.Info{}, errors.New("store refuses the push")
	}
	return s.Store.Push(ctx, req)
}

// A run whose new version the store refuses ends at the version the store
// holds: its last progress entry and its state.json name that version,
// not the one that was never published, and a restart finds the ended run
// consistent with the store (nothing logged at ERROR).
func TestRunEndedByAFailedPublishKeepsTheStoresVersion(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st := &refusingStore{Store: mem}
	s1 := newSvc(t, st, dir)
	start, err := s1.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	st.refuse.Store(true)
	drive(t, s1, start.RunId, 1)
	rs := s1.Stats().Runs[0]
	if !rs.Done {
		t.Fatalf("a run whose publish failed goes on: %+v", rs)
	}
	have := newest(t, mem, start.Model).Version
	s1.mu.Lock()
	prog := s1.c.runs[start.RunId].progress
	last := prog[len(prog)-1]
	s1.mu.Unlock()
	if last.Version != have {
		t.Errorf("the ended run's last entry names version %d, the store holds %d", last.Version, have)
	}
	s1.Close()

	st.refuse.Store(false)
	var logs bytes.Buffer
	s2, err := New(Config{Store: st, DataDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if logs.Len() > 0 {
		t.Errorf("restart logged at ERROR:\n%s", logs.String())
	}
	if got := newest(t, mem, start.Model).Version; got != have {
		t.Errorf("restart moved the store from version %d to %d", have, got)
	}
}

// A run whose policy is deleted without the coordinator being told (a
// Delete in process, or a hub killed before it told it) and pushed again
// by another writer at the run's version never publishes over it: its
// publishes land only on a model it still owns, so the next one is
// refused and the run ends saying why. Before, it wrote its next version
// over the new model and claimed it.
func TestRunNeverPublishesOverItsPolicyDeletedAndPushedAgain(t *testing.T) {
	ctx := context.Background()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newSvc(t, store.Owned{Store: mem, Owner: "ars"}, t.TempDir())
	defer s.Close()
	start, err := s.StartRun(ctx, &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, start.RunId, 1)
	snap := newest(t, mem, start.Model)
	v, blob := snap.Version, bytes.Clone(snap.Blob)
	if err := mem.Delete(ctx, start.Model); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Push(ctx, store.PushRequest{Name: start.Model, Version: v, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	drive(t, s, start.RunId, 1)
	if rs := s.Stats().Runs[0]; !rs.Done || !strings.Contains(rs.Reason, "no longer") {
		t.Errorf("the run after its policy was deleted and pushed again: done %v, reason %q; want it ended, saying the model is no longer its", rs.Done, rs.Reason)
	}
	if now := newest(t, mem, start.Model); now.Version != v || !bytes.Equal(now.Blob, blob) {
		t.Fatalf("the model pushed again is at version %d (%d bytes); want version %d as pushed", now.Version, len(now.Blob), v)
	}
}
