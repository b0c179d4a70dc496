package storerpc

import (
	"context"
	"testing"
	"unsafe"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

type captureStream struct{ msgs []*rlhubv1.StorePullResponse }

func (c *captureStream) Send(m *rlhubv1.StorePullResponse) error {
	c.msgs = append(c.msgs, m)
	return nil
}

// within reports whether inner lies inside outer's memory.
func within(inner, outer []byte) bool {
	if len(inner) == 0 {
		return true
	}
	i, o := uintptr(unsafe.Pointer(&inner[0])), uintptr(unsafe.Pointer(&outer[0]))
	return i >= o && i+uintptr(len(inner)) <= o+uintptr(len(outer))
}

// Every reader is sent slices of the one stored blob: nothing is copied
// or re-encoded per reader on rlhub's side.
func TestPullSendsSlicesOfTheSharedSnapshot(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 3<<20)})
	snap, err := mem.Get(context.Background(), "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := New(Config{Store: mem})
	for reader := range 3 {
		var c captureStream
		if err := svc.send(&c, snap, 0, 0); err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, m := range c.msgs[1:] {
			d := m.GetChunk().GetData()
			if !within(d, snap.Blob) {
				t.Fatalf("reader %d: a chunk is not a slice of the stored blob", reader)
			}
			total += len(d)
		}
		if total != len(snap.Blob) || len(c.msgs) != 1+(len(snap.Blob)+(1<<20)-1)>>20 {
			t.Fatalf("reader %d: %d bytes in %d messages", reader, total, len(c.msgs))
		}
	}
}
