//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A segment larger than the room left where it goes (a container's small
// /dev/shm) is refused with ErrFull naming it, and leaves no file. Before,
// the mapping's pages were touched with nothing to back them, and the
// process died of SIGBUS. One that fits is made as ever, and Room says
// what is left.
func TestCreateOnAFullFileSystem(t *testing.T) {
	dir := testkit.SmallTmpfs(t, "1m")
	path := filepath.Join(dir, "seg")
	room, err := Room(path)
	if err != nil || room <= 0 || room > 1<<20 {
		t.Fatalf("Room of a 1 MiB tmpfs: %d, %v", room, err)
	}
	_, err = Create(Config{Path: path, Name: "m", Capacity: 4 << 20, Slots: 2})
	if !errors.Is(err, errs.ErrFull) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Create of %d bytes on a 1 MiB tmpfs: %v, want ErrFull naming the segment", SegmentSize(4<<20, 2), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused Create left %v", ents)
	}
	w, err := Create(Config{Path: path, Name: "m", Capacity: 64 << 10, Slots: 2})
	if err != nil {
		t.Fatalf("Create of a segment that fits: %v", err)
	}
	defer w.Close()
	if left, err := Room(path); err != nil || left > room-SegmentSize(64<<10, 2) {
		t.Fatalf("Room after a %d-byte segment: %d of %d, %v", SegmentSize(64<<10, 2), left, room, err)
	}
}

// A writer killed inside Create leaves PATH.tmp-PID, which in /dev/shm
// holds its memory until a reboot. The next Create at PATH removes those
// of writers that are gone, and leaves a live one's: an older writer's by
// its pid; one that records livenessLock by its lock, whatever its pid
// says (a writer in another pid namespace).
func TestCreateRemovesOrphanedTemporaries(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	orphan := fmt.Sprintf("%s.tmp-%d", path, dead.Process.Pid)
	live := fmt.Sprintf("%s.tmp-%d", path, os.Getppid())
	other := filepath.Join(dir, "other.tmp-1") // another segment's: not this path's
	for _, p := range []string{orphan, live, other} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Writers that lock: one alive whose pid means no process here, one
	// dead whose pid (1) is a live process here.
	locked := make([]byte, shmPage)
	binary.LittleEndian.PutUint32(locked[offLiveness:], livenessLock)
	lockedLive := fmt.Sprintf("%s.tmp-%d", path, dead.Process.Pid+1<<22)
	lockedDead := fmt.Sprintf("%s.tmp-1", path)
	for _, p := range []string{lockedLive, lockedDead} {
		if err := os.WriteFile(p, locked, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := os.OpenFile(lockedLive, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if ok, err := ofdLock(holder, offLiveness); !ok || err != nil {
		t.Fatalf("lock %s: %v, %v", lockedLive, ok, err)
	}
	w, err := Create(Config{Path: path, Name: "m", Capacity: 4 << 10, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, p := range []string{orphan, lockedDead} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead writer's %s is still there (%v)", p, err)
		}
	}
	for _, p := range []string{live, other, lockedLive} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}
