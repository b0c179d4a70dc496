//go:build linux

package shm

import (
	"errors"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
)

// TestShmSegmentMode: a segment is created 0600 whatever the umask (a
// umask of 0 would have left a 0666 request world-readable), 0660 in the
// group the operator names, and a mode granting others access is refused.
func TestShmSegmentMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	stat := func(path string) (os.FileMode, uint32) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid
	}
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if mode, _ := stat(path); mode != 0o600 {
		t.Fatalf("segment mode %#o, want 0600", mode)
	}
	w.Close()

	gid := os.Getgid()
	path = wsynctest.ShmPath(t)
	w, err = Create(Config{Path: path, Name: "m", Capacity: 4096, Group: strconv.Itoa(gid)})
	if err != nil {
		t.Fatal(err)
	}
	if mode, g := stat(path); mode != 0o660 || g != uint32(gid) {
		t.Fatalf("segment with a group: mode %#o gid %d, want 0660 gid %d", mode, g, gid)
	}
	w.Close()

	for _, mode := range []os.FileMode{0o644, 0o666, 0o604, 0o601} {
		path = wsynctest.ShmPath(t)
		if _, err := Create(Config{Path: path, Name: "m", Capacity: 4096, Mode: mode}); !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("mode %#o: %v, want ErrInvalid", mode, err)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("a refused mode %#o left a segment", mode)
		}
	}
	if _, err := Create(Config{Path: wsynctest.ShmPath(t), Name: "m", Capacity: 4096, Group: "no-such-group-rlhub"}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("unknown group: %v, want ErrInvalid", err)
	}
}
