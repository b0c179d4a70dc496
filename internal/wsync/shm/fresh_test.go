//go:build linux

package shm

import (
	"bytes"
	"context"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A Fresh reader gives each version a buffer of its own, so a snapshot
// stays whole after the reader has read two newer ones; a default reader
// reuses its two buffers, so the same snapshot is overwritten.
func TestShmFreshReaderKeepsSnapshots(t *testing.T) {
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, fresh := range []bool{true, false} {
		r, err := Open(ReaderConfig{Path: path, Fresh: fresh})
		if err != nil {
			t.Fatal(err)
		}
		var first *store.Snapshot
		var want []byte
		for i := range 3 {
			v := w.published + 1
			snap := wsynctest.Snap(t, "m", v, 1000)
			if err := w.Write(v, 0, snap.Blob); err != nil {
				t.Fatal(err)
			}
			got, err := r.GetIfNewer(context.Background(), v-1)
			if err != nil || got == nil || got.Version != v {
				t.Fatalf("fresh=%v: read %v, %v; want version %d", fresh, got, err, v)
			}
			if i == 0 {
				first, want = got, bytes.Clone(got.Blob)
			}
		}
		if same := bytes.Equal(first.Blob, want); same != fresh {
			t.Fatalf("fresh=%v: the first snapshot is whole after two newer reads: %v", fresh, same)
		}
		if fresh {
			if err := wsynctest.Check(first); err != nil {
				t.Fatal(err)
			}
		}
		r.Close()
	}
}
