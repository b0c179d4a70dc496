package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Spares is a pool of retired files, kept in a directory of their own
// on the same file system, so that new files reuse the inodes of files
// removed or replaced instead of allocating new ones. A store that adds
// a version and drops the oldest otherwise frees and allocates an inode
// per version (a standby also per manifest and state file it replaces),
// and ext4 without a journal (this project's benchmark VM, and some cloud
// images) scans past every inode freed in the last seconds on each
// allocation: with a pool a standby's CPU per 1 MiB unit fell 3–4×, and
// a file store's per 1 MiB push by a third
// (docs/benchlog/2026-12-04-s28-lead.md).
//
// What a spare holds is garbage: it is only ever renamed to a temporary
// name and overwritten whole (then cut to its new size) before it is
// renamed into place, so a file written in one is the same as one written
// new, and a crash anywhere leaves at worst a spare too many (kept,
// bounded) or one fewer (a new file). A retired file that would take the
// pool past MaxSpares files or MaxSpareBytes bytes is removed as before,
// so the pool costs at most that much disk.
//
// A reader that opened a file and reads it after the file may have been
// retired (the replication stream's deferred reads of immutable files)
// holds a shared flock on it (LockShared): Create never writes a spare
// someone holds locked, or one still linked to another name.
type Spares struct {
	dir string

	mu    sync.Mutex
	held  []spare // oldest first
	bytes int64
	next  uint64 // the next spare's name
}

type spare struct {
	name string
	size int64
}

// The pool's bounds: enough for a unit's files (a version, its optimizer
// state, the manifests and state records it replaces), and small files
// only — a spare of a large model saves nothing worth its disk (the
// inode's cost is the same, its bytes' is far larger).
const (
	MaxSpares     = 16
	MaxSpareBytes = 64 << 20
)

// OpenSpares opens (making when missing) the pool in dir, keeping what a
// previous run left there within the bounds.
func OpenSpares(dir string) (*Spares, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	s := &Spares{dir: dir}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		n, nerr := strconv.ParseUint(e.Name(), 10, 64)
		fi, ierr := e.Info()
		if nerr != nil || ierr != nil || !fi.Mode().IsRegular() || links(fi) != 1 || !s.fits(fi.Size()) {
			if err := os.RemoveAll(p); err != nil {
				return nil, err
			}
			continue
		}
		s.held = append(s.held, spare{name: e.Name(), size: fi.Size()})
		s.bytes += fi.Size()
		s.next = max(s.next, n+1)
	}
	return s, nil
}

func (s *Spares) fits(size int64) bool {
	return len(s.held) < MaxSpares && s.bytes+size <= MaxSpareBytes
}

// Retire takes the file at path out of the tree into the pool, or
// removes it when the pool is full (or the rename fails). A missing file
// is not an error: a unit rolled forward removes again what it removed.
func (s *Spares) Retire(path string) error {
	if s == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil && fi.Mode().IsRegular() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.fits(fi.Size()) {
			name := strconv.FormatUint(s.next, 10)
			if os.Rename(path, filepath.Join(s.dir, name)) == nil {
				s.next++
				s.held = append(s.held, spare{name: name, size: fi.Size()})
				s.bytes += fi.Size()
				return nil
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// KeepReplaced links the file at path into the pool, so that renaming a
// new file over path leaves its inode to be reused rather than freed. It
// does nothing when path is missing or the pool is full; its failures
// are not the caller's (the rename over path frees the inode as it
// would have). Only for a tree no one watches by (inode, size, mtime): a
// name written again could get back an inode it had, unchanged to such a
// watcher (a standby's mirror is read by nothing of the kind; a
// primary's store is, by the replication's walk, and does not use it).
func (s *Spares) KeepReplaced(path string) {
	if s == nil {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fits(fi.Size()) {
		return
	}
	name := strconv.FormatUint(s.next, 10)
	if os.Link(path, filepath.Join(s.dir, name)) != nil {
		return
	}
	s.next++
	s.held = append(s.held, spare{name: name, size: fi.Size()})
	s.bytes += fi.Size()
}

// Create opens a file at path to be written from its start with size
// bytes: a spare renamed there (the smallest at least size, else the
// largest; cut to size when longer) or, with none, a new file. A spare is
// written only
// when this holds its only link and an exclusive flock on it (kept until
// the file is closed): one shared with another name (a crash between
// KeepReplaced's link and the rename it precedes, or a rename that then
// failed) or held by a reader (LockShared) is unlinked, never written —
// the other name, or the reader, keeps its bytes. A nil pool creates.
func (s *Spares) Create(path string, size int64) (*os.File, error) {
	if s != nil {
		if name, ok := s.take(size); ok {
			if os.Rename(filepath.Join(s.dir, name), path) != nil {
				os.Remove(filepath.Join(s.dir, name))
			} else {
				if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
					if st, ok := sole(f); ok && (st.Size() <= size || f.Truncate(size) == nil) {
						return f, nil
					}
					f.Close()
				}
				// Unlinked, not truncated: the inode may be another's.
				if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
					return nil, err
				}
			}
		}
	}
	return os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
}

// sole reports whether f is its inode's only name and no one else holds
// a flock on it, with its stat; it leaves f locked exclusively.
func sole(f *os.File) (os.FileInfo, bool) {
	st, err := f.Stat()
	if err != nil || links(st) != 1 {
		return nil, false
	}
	return st, flock(f, syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

// LockShared takes a shared flock on f, held until f is closed: while it
// is held no pool's Create writes f's inode, should f's name be retired
// meanwhile. A reader that opens a file and reads it later, the name
// perhaps retired in between, takes it right after the open, under
// whatever keeps the name from being retired meanwhile.
func LockShared(f *os.File) error { return flock(f, syscall.LOCK_SH) }

func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Flock(int(fd), how)
			if ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}

// links is a file's hard-link count (1 where the platform does not say).
func links(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// take removes from the pool the spare best fitted to size: the smallest
// at least size, else the largest.
func (s *Spares) take(size int64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	best := -1
	for i, sp := range s.held {
		switch {
		case best < 0:
			best = i
		case sp.size >= size && (s.held[best].size < size || sp.size < s.held[best].size):
			best = i
		case s.held[best].size < size && sp.size > s.held[best].size:
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	sp := s.held[best]
	s.held = append(s.held[:best], s.held[best+1:]...)
	s.bytes -= sp.size
	return sp.name, true
}

// Count reports the pool's files and bytes.
func (s *Spares) Count() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held), s.bytes
}
