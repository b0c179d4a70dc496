package replica

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
)

// The mirrored part of a data directory: the durable state issue 14's
// restart path recovers from. Everything else (locks, temporaries, a
// deleted model's trash, the replica's own bookkeeping) stays local.
var mirroredDirs = []string{"aggregator", "ars", "reducer", "store"}

// legacyDirs are what builds before the aggregator's state mirrored (their
// hello names no Dirs).
var legacyDirs = []string{"ars", "reducer", "store"}

// stateDirs are the mirrored directories the reducer, the ARS
// coordinator and the learner aggregator write: their writers name what they change
// (Source.Changed), and a snapshot stats only that (walkState).
var stateDirs = []string{"aggregator", "ars", "reducer"}

// localOnly reports whether a file under a mirrored directory is never
// replicated.
func localOnly(rel string) bool {
	base := filepath.Base(rel)
	if base == "LOCK" || strings.HasSuffix(base, atomicfile.TmpSuffix) {
		return true
	}
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if strings.HasPrefix(part, ".") { // .deleted-*, .replica
			return true
		}
	}
	return false
}

// immutable reports whether a file, once at its name, never changes:
// model versions and optimizer states are named by version. A follower
// that already holds one at the same size is not sent it again.
func immutable(rel string) bool { return strings.HasSuffix(rel, ".safetensors") }

// stamp identifies one content of a file on the primary.
type stamp struct {
	size  int64
	mtime int64
	ino   uint64
}

func stampOf(fi fs.FileInfo) stamp {
	s := stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// entry is one mirrored file as found by a walk.
type entry struct {
	rel string
	st  stamp
}

// walk lists the mirrored files under dirs of root, sorted by path.
func walk(root string, dirs []string) ([]entry, error) {
	var out []entry
	for _, d := range dirs {
		base := filepath.Join(root, d)
		err := filepath.WalkDir(base, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // a directory removed under the walk, or never made
				}
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if de.IsDir() {
				if p != base && strings.HasPrefix(de.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !de.Type().IsRegular() || localOnly(rel) {
				return nil
			}
			fi, err := de.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			out = append(out, entry{rel: rel, st: stampOf(fi)})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("replica: walk %s: %w", d, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, nil
}

// safeRel checks a path a primary sent: relative, clean, inside one of the
// mirrored directories, and not a local-only file.
func safeRel(rel string) error {
	if rel == "" || len(rel) > 1024 || filepath.IsAbs(rel) || filepath.Clean(rel) != rel || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("replica: bad path in stream (%d bytes)", len(rel))
	}
	top, _, _ := strings.Cut(rel, string(filepath.Separator))
	for _, d := range mirroredDirs {
		if top == d && rel != d && !localOnly(rel) {
			return nil
		}
	}
	return fmt.Errorf("replica: path outside the mirrored directories")
}

// inventory lists a follower's immutable files and their sizes: what a
// full sync need not send again.
func inventory(root string) (map[string]int64, error) {
	es, err := walk(root, mirroredDirs)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range es {
		if immutable(e.rel) {
			out[e.rel] = e.st.size
		}
	}
	return out, nil
}

// install moves a staged file into place (one rename, then the directory
// fsynced by the caller), the file it replaces kept in sp. A staged file
// already moved (a unit rolled forward) is os.ErrNotExist, and then
// nothing at rel is touched: what is there is the unit's.
func install(root, staged, rel string, sp *atomicfile.Spares) error {
	if _, err := os.Lstat(staged); err != nil {
		return err
	}
	dst := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		if !errors.Is(err, syscall.ENOTDIR) && !errors.Is(err, syscall.EEXIST) {
			return err
		}
		// A file where the primary now has a directory (the unit removes
		// it): it goes first.
		for d := filepath.Dir(rel); d != "." && d != string(filepath.Separator); d = filepath.Dir(d) {
			if fi, err := os.Lstat(filepath.Join(root, d)); err == nil && !fi.IsDir() {
				if err := sp.Retire(filepath.Join(root, d)); err != nil {
					return err
				}
			}
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
	}
	if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
		// A directory where the primary now has a file: everything under
		// it is gone on the primary.
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
	}
	sp.KeepReplaced(dst)
	return os.Rename(staged, dst)
}

// change is one file's state in a snapshot's delta: its new stamp, or
// gone (removed).
type change struct {
	st   stamp
	gone bool
	// named: its writer named it (a mutable file), so it is sent even
	// to a follower shipped the same stamp (takeSnapshot).
	named bool
	// appendFrom, when above 0: the file was only appended to since the
	// snapshot before, which saw it at this size (same inode); its first
	// appendFrom bytes are that snapshot's (Source.Appended).
	appendFrom int64
}

// fileTree is every mirrored file the Source knows of, with its stamp, as
// of its newest snapshot: kept from snapshot to snapshot and updated by
// what each one walked (the named paths, the safety net's whole walk), so
// that a snapshot costs what changed rather than the tree. Its owner
// serialises access (Source.snapMu).
type fileTree struct {
	files map[string]stamp // nil until the first snapshot of the term
	// dirs indexes files by parent directory, so that the files under a
	// walked directory are found without a look at every file.
	dirs map[string]map[string]struct{}
}

// start makes the tree known (files not nil), empty if it was unknown.
func (t *fileTree) start() {
	if t.files == nil {
		t.files, t.dirs = map[string]stamp{}, map[string]map[string]struct{}{}
	}
}

func (t *fileTree) set(rel string, st stamp) {
	t.start()
	if _, ok := t.files[rel]; !ok {
		d := filepath.Dir(rel)
		if t.dirs[d] == nil {
			t.dirs[d] = map[string]struct{}{}
		}
		t.dirs[d][rel] = struct{}{}
	}
	t.files[rel] = st
}

func (t *fileTree) remove(rel string) {
	if _, ok := t.files[rel]; !ok {
		return
	}
	delete(t.files, rel)
	d := filepath.Dir(rel)
	if delete(t.dirs[d], rel); len(t.dirs[d]) == 0 {
		delete(t.dirs, d)
	}
}

// under appends to dst the files at p (a file) or anywhere under p (a
// directory).
func (t *fileTree) under(dst []string, p string) []string {
	if _, ok := t.files[p]; ok {
		dst = append(dst, p)
	}
	prefix := p + string(filepath.Separator)
	for d, fs := range t.dirs {
		if d == p || strings.HasPrefix(d, prefix) {
			for rel := range fs {
				dst = append(dst, rel)
			}
		}
	}
	return dst
}

// diff returns what differs between the tree and found, the files a walk
// of scopes (files or directories) found: files new or with another
// stamp, and the tree's files under scopes that the walk did not find
// (gone).
func (t *fileTree) diff(found []entry, scopes []string) map[string]change {
	d := map[string]change{}
	present := make(map[string]struct{}, len(found))
	for _, e := range found {
		present[e.rel] = struct{}{}
		if old, ok := t.files[e.rel]; !ok || old != e.st {
			d[e.rel] = change{st: e.st}
		}
	}
	var had []string
	for _, p := range scopes {
		had = t.under(had[:0], p)
		for _, rel := range had {
			if _, ok := present[rel]; !ok {
				d[rel] = change{gone: true}
			}
		}
	}
	return d
}

// checkCopy checks the immutable files of root's copy that carry a
// checksum — each store version against its model's manifest (size and
// CRC-32C), each optimizer state against the checksum it records — and
// returns every one that fails, or whose manifest cannot be read, with
// why. only, when set, picks what is checked: a model's directory
// ("store/NAME") or a state file, by its path under root. pace, when
// positive, bounds the rate it reads at (bytes/s): it sleeps between
// checks. Files no manifest lists are left to the store, which removes
// them as debris when it opens.
func checkCopy(ctx context.Context, root string, only func(rel string) bool, pace int64) (map[string]error, error) {
	bad := map[string]error{}
	start, read := time.Now(), int64(0)
	paced := func(path string) error {
		if pace <= 0 {
			return ctx.Err()
		}
		read += treeBytes(path)
		if d := time.Until(start.Add(time.Duration(float64(read) / float64(pace) * float64(time.Second)))); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		return ctx.Err()
	}
	models, err := os.ReadDir(filepath.Join(root, "store"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, m := range models {
		if !m.IsDir() || strings.HasPrefix(m.Name(), ".") || only != nil && !only(filepath.Join("store", m.Name())) {
			continue
		}
		dir := filepath.Join(root, "store", m.Name())
		failed, err := store.VerifyModelDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil { // nothing here can be checked: all of it is sent again
			es, rerr := os.ReadDir(dir)
			if rerr != nil {
				return nil, rerr
			}
			failed = map[string]error{}
			for _, e := range es {
				if immutable(e.Name()) {
					failed[e.Name()] = err
				}
			}
		}
		for name, why := range failed {
			bad[filepath.Join("store", m.Name(), name)] = why
		}
		if err := paced(dir); err != nil {
			return nil, err
		}
	}
	states, err := filepath.Glob(filepath.Join(root, "reducer", "*", "optim-v*.safetensors"))
	if err != nil {
		return nil, err
	}
	for _, p := range states {
		rel, _ := filepath.Rel(root, p)
		if only != nil && !only(rel) {
			continue
		}
		if err := reducer.VerifyStateFile(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			bad[rel] = err
		}
		if err := paced(p); err != nil {
			return nil, err
		}
	}
	return bad, nil
}

// treeBytes is the size of the file at path, or of the files in the
// directory at path (not below it): what checking it reads.
func treeBytes(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	es, err := os.ReadDir(path)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range es {
		if i, err := e.Info(); err == nil && !i.IsDir() {
			n += i.Size()
		}
	}
	return n
}

// moveAside moves the files bad names (paths under root) into quarantine,
// at the same paths under it.
func moveAside(root, quarantine string, bad map[string]error) error {
	for rel := range bad {
		dst := filepath.Join(quarantine, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(root, rel), dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
