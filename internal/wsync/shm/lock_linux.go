//go:build linux

package shm

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Liveness across pid namespaces (docs/shm-layout.md, "Liveness"). Open
// file description (OFD) locks belong to the open file, not to a process:
// they work between processes of any pid namespace that open the same
// file (a /dev/shm volume two containers share), conflict between two
// opens of the file in one process too, and the kernel drops them when
// the last descriptor of the open file closes, as when its process dies
// of SIGKILL. POSIX record locks (F_SETLK) would be dropped when any
// descriptor of the file closes in the owning process, and say nothing
// about a lock holder in another namespace but its pid.

// ofdLock takes an OFD write lock on byte off of f without waiting: false
// (and no error) when another open file description holds a lock there.
// f must be open for writing.
func ofdLock(f *os.File, off int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: off, Len: 1}
	switch err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
		return false, nil
	default:
		return false, err
	}
}

// ofdUnlock drops f's OFD lock on byte off (closing f's last descriptor
// does too).
func ofdUnlock(f *os.File, off int64) error {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart, Start: off, Len: 1}
	return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// ofdLocked reports whether an open file description other than f's holds
// a lock on byte off of the file (f may be read-only).
func ofdLocked(f *os.File, off int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: off, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}
