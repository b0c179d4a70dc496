//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
)

// FuzzParseShmHeader feeds arbitrary header pages, of arbitrary segment
// sizes, to the shared-memory header parser a reader runs on a segment
// another process wrote: it must never panic, must fail with ErrInvalid,
// and a header it accepts describes exactly the segment's size, a slot
// count in [2, 64], a lease table that fits the header page and leaves
// the writer two slots, and a name that round-trips through putShmHeader.
func FuzzParseShmHeader(f *testing.F) {
	seed := func(g shmGeometry, extra int) []byte {
		b := make([]byte, shmPage+extra)
		putShmHeader(b, g, 1234)
		return b
	}
	g := shmGeometry{slots: 2, capacity: shmPage, stride: 2 * shmPage, name: "policy"}
	f.Add(seed(g, 0), int64(g.size()))
	g3 := shmGeometry{slots: 4, capacity: 2 * shmPage, stride: 3 * shmPage, name: "ars/run-1", leases: 2}
	f.Add(seed(g3, 0), int64(g3.size()))
	bad := seed(g3, 0)
	binary.LittleEndian.PutUint32(bad[offLeases:], 3)
	f.Add(bad, int64(g3.size()))
	f.Add(make([]byte, shmPage), int64(shmPage))
	f.Fuzz(func(t *testing.T, header []byte, size int64) {
		// The parser sees a mapping: the header page, then slots. Only the
		// header page's bytes matter to it; the size is the file's.
		if size < 0 || size > 64<<20 {
			size = int64(len(header))
		}
		b := make([]byte, max(size, int64(len(header))))
		copy(b, header)
		got, err := parseShmHeader(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		switch {
		case got.size() != int64(len(b)):
			t.Fatalf("accepted a header of %d bytes for a %d-byte segment", got.size(), len(b))
		case got.slots < 2 || got.slots > 64:
			t.Fatalf("accepted %d slots", got.slots)
		case got.leases > got.slots-2 || leaseOff(got.leases) > shmPage:
			t.Fatalf("accepted %d lease entries for %d slots", got.leases, got.slots)
		case got.capacity <= 0 || got.capacity%shmPage != 0 || got.stride != shmPage+got.capacity:
			t.Fatalf("accepted capacity %d stride %d", got.capacity, got.stride)
		case len(got.name) > shmMaxName:
			t.Fatalf("accepted a name of %d bytes", len(got.name))
		}
		again := make([]byte, len(b))
		putShmHeader(again, got, 1)
		back, err := parseShmHeader(again)
		if err != nil || back != got {
			t.Fatalf("accepted geometry %+v does not round-trip: %+v, %v", got, back, err)
		}
	})
}
