// Package atomicfile replaces files so that a crash at any moment leaves
// either the old file or the whole new one: write a temporary file beside
// it, fsync it, rename it over the target, fsync the directory (without
// that last step the rename itself may not survive a power cut).
//
// The store, the reducer's state, ARS runs and run outputs all need this;
// it lives once, here.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// TmpSuffix ends the temporary file's name (path + TmpSuffix). A reader
// that finds one at start-up may remove it: it is a write that never
// completed.
const TmpSuffix = ".tmp"

// Write replaces path with the concatenation of pieces.
func Write(path string, pieces ...[]byte) error { return WriteWith(path, Hooks{}, pieces...) }

// Hooks are called at points of a write, so a test can stop it there as a
// crash would. Nil hooks are skipped.
type Hooks struct {
	// Written is called after piece i is written to the temporary file
	// (not yet fsynced or renamed).
	Written func(i int)
	// Renamed is called once the new file has replaced path and the
	// directory is fsynced.
	Renamed func()
}

// WriteWith is Write with hooks.
func WriteWith(path string, h Hooks, pieces ...[]byte) error {
	return (*Spares)(nil).WriteWith(path, h, pieces...)
}

// WriteWith is the package's WriteWith with the temporary file taken from
// the pool (Create) when it holds one. A nil pool writes a new file. The
// file path replaces is freed as before, not kept: a name written again
// and again (a manifest) could otherwise get back an inode it had, at the
// same size within one tick of the file system's clock, and a reader
// that tells changes by (inode, size, mtime) — the replication's walk —
// would miss the change.
func (s *Spares) WriteWith(path string, h Hooks, pieces ...[]byte) error {
	tmp := path + TmpSuffix
	size := int64(0)
	for _, p := range pieces {
		size += int64(len(p))
	}
	f, err := s.Create(tmp, size)
	if err != nil {
		return err
	}
	for i, p := range pieces {
		if _, err = f.Write(p); err != nil {
			break
		}
		if h.Written != nil {
			h.Written(i)
		}
	}
	if err = errors.Join(err, f.Sync(), f.Close()); err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = SyncDir(filepath.Dir(path))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if h.Renamed != nil {
		h.Renamed()
	}
	return nil
}

// SyncDir fsyncs a directory, making renames and removals in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// MkdirAll is os.MkdirAll that makes each directory it creates durable:
// it fsyncs the parent of every directory it creates, which os.MkdirAll
// does not do, so a power cut could lose a new directory with everything
// written under it, acknowledged or not (a kill -9 cannot show this).
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // made meanwhile by another
		}
		return err
	}
	return SyncDir(filepath.Dir(dir))
}
