package storerpc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestWatchCountsSkipsAcrossADelete: a watch goes on across a Delete of its
// model, sending the model pushed again once its versions pass the last
// one sent. Its skip count compared Seq (which restarts with the model)
// to the deleted model's: the re-created model's versions that the watch
// never sent were reported as 0 skipped. Across a Delete the count
// restarts with the model: the first version sent of the new model counts
// the new model's versions before it.
func TestWatchCountsSkipsAcrossADelete(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	c := newClient(t, storerpc.ClientConfig{Addr: serve(t, mem), Transport: "grpc"})
	defer c.Close()
	for v := uint64(1); v <= 3; v++ {
		storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 8)})
	}
	got := make(chan [2]uint64, 4)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- c.Watch(ctx, "m", 0, func(s *store.Snapshot, skipped uint64) error {
			got <- [2]uint64{s.Version, skipped}
			if s.Version == 4 {
				return errors.New("done")
			}
			return nil
		})
	}()
	if g := recvWithin(t, got); g != [2]uint64{3, 0} {
		t.Fatalf("first delivery %v, want version 3, 0 skipped", g)
	}
	if err := mem.Delete(ctxT(t), "m"); err != nil {
		t.Fatal(err)
	}
	// Versions 1..3 of the new model are not after the last one sent;
	// version 4 is, and the watch skipped the three before it.
	for v := uint64(1); v <= 4; v++ {
		storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, 10+v, 8)})
	}
	if g := recvWithin(t, got); g != [2]uint64{4, 3} {
		t.Errorf("delivery after the Delete: %v, want version 4, 3 skipped", g)
	}
	if err := recvWithin(t, errc); err == nil || err.Error() != "done" {
		t.Fatalf("Watch returned %v, want the callback's error", err)
	}
}
