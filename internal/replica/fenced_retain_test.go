package replica_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// fileListCounter is a File store that counts its listings.
type fileListCounter struct {
	*store.File
	lists atomic.Int64
}

func (l *fileListCounter) List(ctx context.Context) ([]store.Info, error) {
	l.lists.Add(1)
	return l.File.List(ctx)
}

// Sync status (NewestLife) names what a reader of the newest gets once
// the newest acknowledged version is dropped past Retain for newer
// unacknowledged ones: nothing. Before, it named that version from
// Fenced's record without asking whether the store still held it, so the
// status showed a version no reader could get (Get: NotFound). While the
// store holds it, NewestLife still lists nothing.
func TestFencedNewestLifeOfAVersionDroppedPastRetain(t *testing.T) {
	ctx := context.Background()
	fs, err := store.OpenFile(store.FileConfig{Dir: t.TempDir(), Store: store.Config{Retain: 2}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	inner := &fileListCounter{File: fs}
	_, src, standbys := stuckStandby(t, 200*time.Millisecond)
	f := &replica.Fenced{Store: inner, Epoch: 7, Source: src}
	setStandbys := func(s ...string) {
		t.Helper()
		standbys.Store(s)
		if err := src.RefreshStandbys(ctx); err != nil {
			t.Fatal(err)
		}
	}
	push := func(v uint64) error {
		_, err := f.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 8)})
		return err
	}
	setStandbys()
	for v := uint64(1); v <= 3; v++ {
		if err := push(v); err != nil {
			t.Fatal(err)
		}
	}
	_, life, err := fs.NewestLife("m")
	if err != nil {
		t.Fatal(err)
	}
	setStandbys("s1") // s1 never acknowledges
	if err := push(4); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("push of v4 with s1 silent: %v, want not acknowledged", err)
	}
	// v3 is still held (Retain 2: v3, v4): named without a listing.
	inner.lists.Store(0)
	if v, l, err := f.NewestLife("m"); err != nil || v != 3 || l != life {
		t.Fatalf("NewestLife with v4 unacknowledged: v%d life %d, %v; want v3 life %d", v, l, err, life)
	}
	if n := inner.lists.Load(); n != 0 {
		t.Fatalf("NewestLife listed the store %d times while v3 is held", n)
	}

	// v3 dropped for v4 and v5, neither acknowledged: readers get
	// nothing, and so the status names nothing.
	if err := push(5); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("push of v5 with s1 silent: %v, want not acknowledged", err)
	}
	if s, err := fs.Get(ctx, "m", 3); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the store's v3 with v4, v5 pushed at Retain 2: %v %v, want dropped", versionOf(s), err)
	}
	if s, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Get with v3 dropped and v4, v5 unacknowledged: %v %v, want NotFound", versionOf(s), err)
	}
	if v, l, err := f.NewestLife("m"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("NewestLife with v3 dropped and v4, v5 unacknowledged: v%d life %d, %v; want NotFound, as Get", v, l, err)
	}

	// v6 acknowledged: named again, without a listing.
	setStandbys()
	if err := push(6); err != nil {
		t.Fatal(err)
	}
	inner.lists.Store(0)
	if v, l, err := f.NewestLife("m"); err != nil || v != 6 || l != life {
		t.Fatalf("NewestLife after v6 was acknowledged: v%d life %d, %v; want v6 life %d", v, l, err, life)
	}
	if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != 6 {
		t.Fatalf("Get after v6 was acknowledged: %v %v, want v6", versionOf(s), err)
	}
	if n := inner.lists.Load(); n != 0 {
		t.Fatalf("NewestLife and Get listed the store %d times after v6 was acknowledged", n)
	}
}
