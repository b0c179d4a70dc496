package storerpc_test

import (
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestGetIfNewerLifeFollowsAModelDeletedAndPushedAgain: a model deleted
// and pushed again from version 1, polled with a pull "if newer" over
// gRPC and the data plane. Asked after the deleted model's v5 and its
// life, GetIfNewerLife returns the new model's v1 at once, and its v5
// once the new model caught up with the old version ("not modified" by
// number alone); GetIfNewer still waits for a version past 5. Asked
// after the version of the life the hub runs, it answers "not modified"
// with one request, and a life change costs one more. Before, a store
// client had no life-aware "if newer" and such a poll kept the deleted
// model's weights until the new model's versions passed them.
func TestGetIfNewerLifeFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	for _, transport := range []string{"grpc", "auto"} {
		t.Run(transport, func(t *testing.T) {
			mem, _ := store.NewMemory(store.Config{})
			defer mem.Close()
			addr, _, b := serveBoth(t, mem, false)
			c := newClient(t, storerpc.ClientConfig{Addr: addr, Transport: transport})
			defer c.Close()
			ctx := ctxT(t)
			for v := uint64(1); v <= 5; v++ {
				storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 8)})
			}
			old, err := c.Get(ctx, "m", 0)
			if err != nil || old.Version != 5 || old.Life() == 0 {
				t.Fatalf("Get: %v, %v; want version 5 of a known life", old, err)
			}
			// requests counts the data-plane requests fn makes (0 over gRPC).
			requests := func(fn func()) uint64 {
				before := b.Requests()
				fn()
				return b.Requests() - before
			}
			// poll expects GetIfNewerLife(than, life) to return version
			// want (0: not modified) of a life other than old's when
			// newLife, and the data plane to see n requests.
			poll := func(than, life, want uint64, newLife bool, n uint64) *store.Snapshot {
				t.Helper()
				var s *store.Snapshot
				var err error
				if got := requests(func() { s, err = c.GetIfNewerLife(ctx, "m", than, life) }); transport == "auto" && got != n {
					t.Errorf("GetIfNewerLife(%d, %d): %d data-plane requests, want %d", than, life, got, n)
				}
				switch {
				case err != nil:
					t.Fatalf("GetIfNewerLife(%d, %d): %v", than, life, err)
				case want == 0 && s != nil:
					t.Fatalf("GetIfNewerLife(%d, %d): version %d of life %d, want not modified", than, life, s.Version, s.Life())
				case want == 0:
				case s == nil || s.Version != want || (s.Life() != old.Life()) == !newLife || s.Life() == 0:
					t.Fatalf("GetIfNewerLife(%d, %d): %v, want version %d (a new life: %v)", than, life, s, want, newLife)
				}
				return s
			}
			poll(5, old.Life(), 0, false, 1)
			poll(4, old.Life(), 5, false, 1)

			if err := mem.Delete(ctx, "m"); err != nil {
				t.Fatal(err)
			}
			fresh := storetest.Blob(t, 100, 8)
			storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: fresh})
			if s := poll(5, old.Life(), 1, true, 2); string(s.Blob) != string(fresh) {
				t.Fatal("the new model's v1 came with other bytes")
			}
			poll(5, 0, 0, false, 1) // life unknown: versions only grow
			if s, err := c.GetIfNewer(ctx, "m", 5); s != nil || err != nil {
				t.Fatalf("GetIfNewer(5): %v, %v; want not modified (the older rule)", s, err)
			}
			// The new model catches up with the deleted one's version.
			for v := uint64(2); v <= 5; v++ {
				storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, 100+v, 8)})
			}
			caught := poll(5, old.Life(), 5, true, 2)
			if string(caught.Blob) != string(storetest.Blob(t, 105, 8)) {
				t.Fatal("the new model's v5 came with other bytes")
			}
			poll(5, caught.Life(), 0, false, 1)
			storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 6, Expect: 5, Blob: storetest.Blob(t, 106, 8)})
			poll(5, old.Life(), 6, true, 1)
			poll(5, caught.Life(), 6, true, 1)
		})
	}
}
