package storerpc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestWatchLivesFollowsAModelDeletedAndPushedAgain: a model deleted and
// pushed again from version 1 (a training run restarted under the same
// name). A watch that follows lives gets the new model's version 1 at
// once, its life told apart from the deleted model's; a watch that does
// not (an older client) still waits for a version past the last one it
// was sent, as before. Before lives were on the wire every watch kept the
// deleted model's weights until the new model's versions passed them.
func TestWatchLivesFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	for _, transport := range []string{"grpc"} {
		t.Run(transport, func(t *testing.T) {
			mem, _ := store.NewMemory(store.Config{})
			defer mem.Close()
			c := newClient(t, storerpc.ClientConfig{Addr: serve(t, mem), Transport: transport})
			defer c.Close()
			for v := uint64(1); v <= 5; v++ {
				storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 8)})
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			type got struct {
				v, life uint64
				blob    string
			}
			lives, plain := make(chan got, 8), make(chan got, 8)
			errc := make(chan error, 2)
			var old got
			for _, w := range []struct {
				out    chan got
				follow bool
			}{{lives, true}, {plain, false}} {
				go func() {
					fn := func(s *store.Snapshot, _ uint64) error {
						w.out <- got{s.Version, s.Life(), string(s.Blob)}
						if s.Version == 6 || (w.follow && s.Version == 1) {
							return errors.New("done")
						}
						return nil
					}
					if w.follow {
						errc <- c.WatchLives(ctx, "m", 0, 0, fn)
					} else {
						errc <- c.Watch(ctx, "m", 0, fn)
					}
				}()
				old = recvWithin(t, w.out)
				if old.v != 5 || old.life == 0 {
					t.Fatalf("first delivery: version %d of life %d, want version 5 of a known life", old.v, old.life)
				}
			}
			if err := mem.Delete(ctxT(t), "m"); err != nil {
				t.Fatal(err)
			}
			fresh := storetest.Blob(t, 100, 8)
			storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: fresh})
			g := recvWithin(t, lives)
			if g.v != 1 || g.life == old.life || g.life == 0 || g.blob != string(fresh) {
				t.Fatalf("after the Delete and a push of v1: version %d of life %d (the deleted model's: %d), new bytes %v; want the new model's version 1",
					g.v, g.life, old.life, g.blob == string(fresh))
			}
			s, err := c.WaitNewerLife(ctx, "m", 5, old.life)
			if err != nil || s.Version != 1 || s.Life() != g.life {
				t.Fatalf("WaitNewerLife after 5 of the deleted life: %v, %v; want the new model's version 1", s, err)
			}
			// The watch that does not follow lives sends nothing until a
			// version passes 5.
			for v := uint64(2); v <= 6; v++ {
				storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, 100+v, 8)})
			}
			if g := recvWithin(t, plain); g.v != 6 {
				t.Fatalf("a watch not following lives was sent version %d after the Delete, want 6", g.v)
			}
			for range 2 {
				if err := recvWithin(t, errc); err == nil || err.Error() != "done" {
					t.Fatalf("watch returned %v, want the callback's error", err)
				}
			}
		})
	}
}
