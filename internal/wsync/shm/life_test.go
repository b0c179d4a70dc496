//go:build linux

package shm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A segment names the life of its versions (docs/shm-layout.md, "Lives"):
// its readers' snapshots carry it, WaitNewerLife returns the newest at
// once to a follower of another life (the model deleted and pushed again)
// though it is not newer, and the writer refuses a version of another
// life. A segment of an older writer (offset 328 zero) names none: the
// older rule holds.
func TestShmSegmentNamesItsLife(t *testing.T) {
	for _, life := range []uint64{7, 0} {
		path := wsynctest.ShmPath(t)
		w, err := Create(Config{Path: path, Name: "m", Capacity: 64 << 10, Life: life})
		if err != nil {
			t.Fatal(err)
		}
		snap := store.WithLife(wsynctest.Snap(t, "m", 5, 100), life)
		snap.Version = 5
		if err := w.Publish(context.Background(), snap); err != nil {
			t.Fatal(err)
		}
		r, err := Open(ReaderConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		if r.Life() != life || w.Life() != life {
			t.Fatalf("life %d: reader says %d, writer %d", life, r.Life(), w.Life())
		}
		got, err := r.GetIfNewer(context.Background(), 0)
		if err != nil || got == nil || got.Life() != life {
			t.Fatalf("life %d: read %v, %v; want v5 of life %d", life, got, err, life)
		}
		// A follower at v5 of life 9: another life's v5 at once, unless
		// the segment names no life.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		got, err = r.WaitNewerLife(ctx, 5, 9)
		cancel()
		if life != 0 && (err != nil || got == nil || got.Version != 5) {
			t.Fatalf("life %d: WaitNewerLife(5, life 9) = %v, %v; want v5 at once", life, got, err)
		}
		if life == 0 && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a segment of no life: WaitNewerLife(5, life 9) = %v, %v; want nothing newer", got, err)
		}
		// A follower of the segment's own life waits for a newer version.
		ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
		got, err = r.WaitNewerLife(ctx, 5, life)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("life %d: WaitNewerLife(5, its own life) = %v, %v; want nothing newer", life, got, err)
		}
		other := store.WithLife(wsynctest.Snap(t, "m", 6, 100), 9)
		other.Version = 6
		err = w.Publish(context.Background(), other)
		if life != 0 && !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("life %d: a version of life 9 published: %v, want errs.ErrInvalid", life, err)
		}
		if life == 0 && err != nil {
			t.Fatalf("a segment of no life refused a version of life 9: %v", err)
		}
		r.Close()
		w.Close()
	}
}
