package relay

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

func TestAutoSlots(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		capacity int64
		want     int
	}{
		{0, AutoShmSlots},
		{8 * mib, AutoShmSlots},   // a 4 MiB policy: 8 leases in 80 MiB
		{100 * mib, AutoShmSlots}, // exactly 10 fit in 1 GiB (1000 MiB)
		{103 * mib, 9},
		{256 * mib, 4}, // a 128 MiB model: 2 leases in 1 GiB
		{400 * mib, 2}, // past 256 MiB of model: a double buffer
		{4096 * mib, 2},
	} {
		if got := autoSlots(c.capacity); got != c.want {
			t.Errorf("autoSlots(%d MiB) = %d, want %d", c.capacity/mib, got, c.want)
		}
	}
}

// The automatic slot count shrinks to fit three quarters of the room
// left, down to a double buffer.
func TestFitSlots(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		slots    int
		capacity int64
		room     int64
		want     int
	}{
		{10, 8 * mib, 1 << 40, 10}, // room to spare
		{10, 8 * mib, 64 * mib, 5}, // a container's /dev/shm: 5 × 8 MiB within 48 MiB
		{10, 8 * mib, 8 * mib, 2},  // not even 2: Create says so
		{4, 256 * mib, 64 * mib, 2},
	} {
		got := fitSlots(c.slots, c.capacity, c.room)
		if got != c.want {
			t.Errorf("fitSlots(%d, %d MiB, %d MiB) = %d, want %d", c.slots, c.capacity/mib, c.room/mib, got, c.want)
		}
		if got > 2 && shm.SegmentSize(c.capacity, got) > c.room/4*3 {
			t.Errorf("fitSlots(%d, %d MiB, %d MiB) = %d: %d bytes, over three quarters of the room", c.slots, c.capacity/mib, c.room/mib, got, shm.SegmentSize(c.capacity, got))
		}
	}
}

// A relay's default segment on a container's 64 MiB /dev/shm, for a 4
// MiB policy (10 slots of 8 MiB: 80 MiB), takes fewer slots and serves
// its collectors. Before, the relay died of SIGBUS making it.
func TestRelaySegmentFitsASmallDevShm(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1<<20) // 4 MiB of float32
	path := filepath.Join(testkit.SmallTmpfs(t, "64m"), "rlhub-m")
	runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-small", ShmPath: path, ReportEvery: 10 * time.Millisecond, Logger: quiet()})
	waitSegment(t, path, 1)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 48<<20 {
		t.Fatalf("segment of %d bytes on a 64 MiB /dev/shm; want at most three quarters of it", fi.Size())
	}
	h.push(t, 2, 1<<20)
	waitSegment(t, path, 2)
}

// The relay's default segment (ShmSlots 0) lets the default collector's
// reader lease: a relay started without --shm-slots serves its local
// collectors in place, as many of them as the automatic size has entries,
// and the next one copies and says why.
func TestRelayDefaultSegmentLeasesToLocalCollectors(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1000)
	path := wsynctest.ShmPath(t)
	runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-auto", ShmPath: path, ReportEvery: 10 * time.Millisecond, Logger: quiet()})
	ctx := context.Background()
	waitSegment(t, path, 1)

	var readers []*shm.Reader
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for i := 0; i < AutoShmSlots-2; i++ {
		r, err := shm.Open(shm.ReaderConfig{Path: path, Lease: true})
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
		if !r.Leasing() {
			t.Fatalf("local collector %d copies on the relay's default segment: %s", i, r.CopyReason())
		}
		s, err := r.GetIfNewer(ctx, 0)
		if err != nil || s == nil || s.Version != 1 {
			t.Fatalf("leasing collector %d read %v, %v; want v1", i, s, err)
		}
	}
	extra, err := shm.Open(shm.ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if extra.Leasing() || extra.CopyReason() == "" {
		t.Fatalf("collector %d leases (reason %q); want it to copy and say why, the default segment has %d entries",
			AutoShmSlots-1, extra.CopyReason(), AutoShmSlots-2)
	}
}
