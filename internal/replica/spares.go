package replica

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// spares is a standby's pool of retired files, kept in
// DataDir/.replica/spare (never mirrored, never read) so that a unit's
// staged files reuse the inodes of the files units removed or replaced
// instead of allocating new ones. Each unit of a steadily training
// cluster adds a version and drops the oldest, and replaces the
// manifest and the reducer's state: without the pool every one of those
// is an inode freed and another allocated, and ext4 without a journal
// (this project's benchmark VM, and some cloud images) scans past every
// inode freed in the last seconds on each allocation — with a pool the
// standbys' CPU per 1 MiB unit fell 3–4× (docs/cluster.md).
//
// What a spare holds is garbage: it is only ever renamed into the
// staging directory and overwritten whole (then cut to its new size), so
// a unit staged in one is the same as one staged in a new file, and a
// crash anywhere leaves at worst a spare too many (kept, bounded) or one
// fewer (a new file). A retired file that would take the pool past
// maxSpares files or maxSpareBytes bytes is removed as before, so the
// pool costs at most that much disk.
type spares struct {
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
	maxSpares     = 16
	maxSpareBytes = 64 << 20
)

// openSpares opens (making when missing) the pool in dir, keeping what a
// previous run left there within the bounds.
func openSpares(dir string) (*spares, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	s := &spares{dir: dir}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		n, nerr := strconv.ParseUint(e.Name(), 10, 64)
		fi, ierr := e.Info()
		if nerr != nil || ierr != nil || !fi.Mode().IsRegular() || links(fi) != 1 || !s.fits(fi.Size()) {
			if err := os.RemoveAll(p); err != nil {
				return nil, fmt.Errorf("replica: %w", err)
			}
			continue
		}
		s.held = append(s.held, spare{name: e.Name(), size: fi.Size()})
		s.bytes += fi.Size()
		s.next = max(s.next, n+1)
	}
	return s, nil
}

func (s *spares) fits(size int64) bool {
	return len(s.held) < maxSpares && s.bytes+size <= maxSpareBytes
}

// retire takes the file at path out of the tree into the pool, or
// removes it when the pool is full (or the rename fails). A missing file
// is not an error: a unit rolled forward removes again what it removed.
func (s *spares) retire(path string) error {
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

// keepReplaced links the file at path into the pool, so that renaming a
// new file over path leaves its inode to be reused rather than freed. It
// does nothing when path is missing or the pool is full; its failures
// are not the caller's (the rename over path frees the inode as it
// would have).
func (s *spares) keepReplaced(path string) {
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

// create opens a file at path to be written from its start: a spare
// renamed there (the smallest at least size, else the largest) or, with
// none, a new file. reused says which: the caller cuts a reused file to
// the size it wrote (it may have been longer). A spare that shares its
// inode with another name (a crash between keepReplaced's link and the
// rename it precedes, or a rename that then failed) is dropped, never
// written: writing it would change the other name's file.
func (s *spares) create(path string, size int64) (f *os.File, reused bool, err error) {
	if name, ok := s.take(size); ok {
		if os.Rename(filepath.Join(s.dir, name), path) != nil {
			os.Remove(filepath.Join(s.dir, name))
		} else {
			if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
				if st, err := f.Stat(); err == nil && links(st) == 1 {
					return f, true, nil
				}
				f.Close()
			}
			// Unlinked, not truncated: the inode may be another name's.
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, false, err
			}
		}
	}
	f, err = os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	return f, false, err
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
func (s *spares) take(size int64) (string, bool) {
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

// count reports the pool's files and bytes (tests).
func (s *spares) count() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held), s.bytes
}

