package replica_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
)

// An acknowledgement of a version of a model deleted since (a committed
// push's deferred ack, or Acknowledge, as the reducer retries a step's
// publish) shows nothing of the model pushed again: a version of the new
// life stays hidden until it is acknowledged itself. The late ack made
// the deleted model's version the new life's newest acknowledged one, so
// that every new version up to it was shown before the standbys held it.
func TestFencedAckOfADeletedLifeShowsNothingOfTheNext(t *testing.T) {
	for _, via := range []string{"ack", "Acknowledge"} {
		t.Run(via, func(t *testing.T) {
			x := newFencedFixture(t, nil)
			f, ctx := x.f, context.Background()
			x.pushAcked(5, "m")
			x.setStandbys("s1") // s1 never acknowledges
			var late func(context.Context) error
			if via == "ack" {
				_, ack, err := f.PushCommitted(ctx, x.next("m", 6, 6))
				if err != nil {
					t.Fatal(err)
				}
				late = ack
			} else {
				x.notAcked("push of v6 with s1 silent", x.pushNext("m", 6, 6))
				late = func(ctx context.Context) error { return f.Acknowledge(ctx, "m", 6) }
			}
			x.setStandbys() // s1 left
			if err := f.Delete(ctx, "m"); err != nil {
				t.Fatal(err)
			}
			if err := late(ctx); err != nil {
				t.Fatalf("the deleted model's v6 acknowledged late: %v", err)
			}
			x.setStandbys("s1") // s1 back, silent
			for v := uint64(1); v <= 2; v++ {
				x.notAcked(fmt.Sprintf("push of v%d of the new model with s1 silent", v), x.pushNext("m", v, 10+v))
				if s, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("Get after an unacknowledged push of v%d of the new model: %v %v, want NotFound", v, versionOf(s), err)
				}
				if infos, _ := f.List(ctx); len(infos) != 0 {
					t.Fatalf("List after an unacknowledged push of v%d of the new model: %+v", v, infos)
				}
			}
			x.setStandbys()
			if err := x.pushNext("m", 3, 13); err != nil {
				t.Fatal(err)
			}
			if s, err := f.Get(ctx, "m", 1); err != nil || s.Version != 1 {
				t.Fatalf("v1 after v3 was acknowledged: %v %v", versionOf(s), err)
			}
		})
	}
}

// A push of the deleted model still on its way to the store, refused
// there as stale once the model pushed again passed its version, does
// not show the new model's version of that number, which waits for its
// acknowledgement. Both pushes held the same version: the refused one's
// end took the other's hold with it.
func TestFencedStalePushOfADeletedLifeShowsNothingOfTheNext(t *testing.T) {
	ctx := context.Background()
	x, g := newGatedFixture(t)
	f := x.f
	x.pushAcked(5, "m")
	// The old model's v6 waits in the store while m is deleted and
	// pushed again up to an unacknowledged v6.
	land := x.deleteDuringPush(g, 6, 99)
	for v := uint64(1); v <= 5; v++ {
		if err := x.pushAny(v, 10+v); err != nil {
			t.Fatal(err)
		}
	}
	x.setStandbys("s1")
	x.notAcked("push of the new model's v6 with s1 silent", x.pushAny(6, 16))
	if err := land(); !errors.Is(err, errs.ErrStale) {
		t.Fatalf("the old model's v6 after the new one's: %v, want stale", err)
	}
	if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != 5 {
		t.Fatalf("Get with the new model's v6 unacknowledged: %v %v, want v5", versionOf(s), err)
	}
	if s, err := f.Get(ctx, "m", 6); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Get of the new model's unacknowledged v6: %v %v, want NotFound", versionOf(s), err)
	}
}

// listedWithV4Pending is a fencedFixture over a memory store with cfg
// that counts Lists (inner): versions 1 to 3 of a, m and z acknowledged,
// and m's v4 waiting for its acknowledgement, s1 listed and silent.
func listedWithV4Pending(t *testing.T, cfg store.Config) (*fencedFixture, *listCounter) {
	t.Helper()
	inner := &listCounter{Memory: newMemory(t, cfg)}
	x := newFencedFixture(t, inner)
	x.pushAcked(3, "a", "m", "z")
	x.setStandbys("s1")
	x.notAcked("push of v4 with s1 silent", x.pushNext("m", 4, 4))
	return x, inner
}

// Sync status reads a model's newest on a primary without listing the
// store, while that newest waits for its acknowledgement too: every
// status call and report of a model being published listed every model.
func TestFencedNewestLifeListsNothing(t *testing.T) {
	ctx := context.Background()
	x, inner := listedWithV4Pending(t, store.Config{})
	f := x.f
	_, life, err := inner.NewestLife("m")
	if err != nil {
		t.Fatal(err)
	}
	inner.lists.Store(0)
	if v, l, err := f.NewestLife("m"); err != nil || v != 3 || l != life {
		t.Fatalf("NewestLife with v4 unacknowledged: v%d life %d, %v; want v3 life %d", v, l, err, life)
	}
	if n := inner.lists.Load(); n != 0 {
		t.Fatalf("NewestLife listed the store %d times", n)
	}
	// Deleted, pushed again and unacknowledged: nothing of the new life
	// is acknowledged.
	x.setStandbys()
	if err := f.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	x.setStandbys("s1")
	x.notAcked("push of the new model's v1 with s1 silent", x.pushNext("m", 1, 1))
	if v, l, err := f.NewestLife("m"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("NewestLife with the new model's v1 unacknowledged: v%d life %d, %v; want NotFound", v, l, err)
	}
}

// A reader of a model's newest on a primary lists no store while that
// newest waits for its acknowledgement: Get, GetIfNewer and the loans
// listed every model to find the newest acknowledged version, for each
// pull of a model being published. An acknowledged version that the
// store dropped past Retain for newer unacknowledged ones leaves nothing
// to show, as before.
func TestFencedReadersListNothingWhileTheNewestAwaitsItsAck(t *testing.T) {
	ctx := context.Background()
	x, inner := listedWithV4Pending(t, store.Config{Retain: 2})
	f := x.f
	inner.lists.Store(0)
	if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != 3 {
		t.Fatalf("Get with v4 unacknowledged: %v %v, want v3", versionOf(s), err)
	}
	if s, err := f.GetIfNewer(ctx, "m", 2); err != nil || s == nil || s.Version != 3 {
		t.Fatalf("GetIfNewer(2) with v4 unacknowledged: %v %v, want v3", versionOf(s), err)
	}
	if s, err := f.GetIfNewer(ctx, "m", 3); err != nil || s != nil {
		t.Fatalf("GetIfNewer(3) with v4 unacknowledged: %v %v, want nothing", versionOf(s), err)
	}
	s, release, err := f.LendNewer(ctx, "m", 2)
	if err != nil || s.Version != 3 {
		t.Fatalf("LendNewer(2) with v4 unacknowledged: %v %v, want v3", versionOf(s), err)
	}
	release()
	if n := inner.lists.Load(); n != 0 {
		t.Fatalf("readers listed the store %d times", n)
	}
	// v3 dropped for v4 and v5, neither acknowledged: nothing to show.
	x.notAcked("push of v5 with s1 silent", x.pushNext("m", 5, 5))
	if s, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Get with v3 dropped and v4, v5 unacknowledged: %v %v, want NotFound", versionOf(s), err)
	}
	x.setStandbys()
	if err := x.pushNext("m", 6, 6); err != nil {
		t.Fatal(err)
	}
	if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != 6 {
		t.Fatalf("Get after v6 was acknowledged: %v %v, want v6", versionOf(s), err)
	}
}

// newestLifeIsGets checks that f's NewestLife (sync status) names the
// version and life a reader of the newest gets (want).
func newestLifeIsGets(t *testing.T, f *replica.Fenced, want *store.Snapshot) {
	t.Helper()
	if v, l, err := f.NewestLife("m"); err != nil || v != want.Version || l != want.Life() {
		t.Fatalf("NewestLife: v%d life %d, %v; want v%d life %d, what a reader gets", v, l, err, want.Version, want.Life())
	}
}

// A push begun before a Delete that lands in the model pushed again is
// visible once acknowledged, yet records no acknowledged version (a
// Delete overlapped it): a reader still gets it while a newer version
// waits for its acknowledgement, not an older one nor nothing, and sync
// status (NewestLife) names it too (before, NotFound: the status kept
// showing the deleted model's newest).
func TestFencedPushAcrossADeleteStaysVisibleBelowAPendingOne(t *testing.T) {
	ctx := context.Background()
	x, g := newGatedFixture(t)
	f := x.f
	x.pushAcked(3, "m")
	// The old model's v4 waits on its way to the store while m is
	// deleted; it lands in the new model, and is acknowledged.
	if err := x.deleteDuringPush(g, 4, 4)(); err != nil {
		t.Fatalf("the push across the Delete: %v", err)
	}
	if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != 4 {
		t.Fatalf("Get after the push across the Delete: %v %v, want v4", versionOf(s), err)
	}
	x.setStandbys("s1")
	x.notAcked("push of v5 with s1 silent", x.pushAny(5, 5))
	s, err := f.Get(ctx, "m", 0)
	if err != nil || s.Version != 4 {
		t.Fatalf("Get with v5 unacknowledged: %v %v, want v4", versionOf(s), err)
	}
	newestLifeIsGets(t, f, s)
}

// failedDeletes is a memory store whose Delete fails, changing nothing.
type failedDeletes struct{ *store.Memory }

func (failedDeletes) Delete(context.Context, string) error { return errors.New("disk on fire") }

// A Delete that failed forgets the model's acknowledged version, yet the
// store still holds it: a reader still gets it while a newer version
// waits for its acknowledgement, and sync status (NewestLife) names it
// too (before, NotFound).
func TestFencedFailedDeleteKeepsTheAcknowledgedVersionVisible(t *testing.T) {
	ctx := context.Background()
	x := newFencedFixture(t, failedDeletes{newMemory(t, store.Config{})})
	f := x.f
	x.pushAcked(3, "m")
	if err := f.Delete(ctx, "m"); err == nil {
		t.Fatal("Delete on a store that cannot delete succeeded")
	}
	x.setStandbys("s1")
	x.notAcked("push of v4 with s1 silent", x.pushNext("m", 4, 4))
	s, err := f.Get(ctx, "m", 0)
	if err != nil || s.Version != 3 {
		t.Fatalf("Get with v4 unacknowledged after a failed Delete: %v %v, want v3", versionOf(s), err)
	}
	newestLifeIsGets(t, f, s)
}
