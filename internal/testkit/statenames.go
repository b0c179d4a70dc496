package testkit

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// StateNames checks a writer's side of the replication contract
// (replica.Source.Changed): every file under Dir that the writer
// created, changed or removed is named — itself or a directory above it
// — by the time Check runs (a component's tests call it where the
// replication would cut a unit: before each store push, and at the
// end). Pass Changed as the component's StateChanged. Files named LOCK
// and *.tmp, and paths with a part that starts with '.', are the
// writer's own and never replicated.
type StateNames struct {
	t   testing.TB
	dir string

	mu     sync.Mutex
	named  map[string]bool          // absolute, cleaned
	last   map[string]stateFileStat // the tree at the last Check
	checks int
}

type stateFileStat struct {
	size, mtime int64
	ino         uint64
}

// NewStateNames starts watching dir (which may not exist yet): its
// current files are the baseline.
func NewStateNames(t testing.TB, dir string) *StateNames {
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := &StateNames{t: t, dir: abs, named: map[string]bool{}}
	n.last = n.tree()
	return n
}

// Changed records a named path; safe for concurrent use.
func (n *StateNames) Changed(path string) {
	abs, err := filepath.Abs(path)
	if err != nil {
		n.t.Errorf("StateChanged(%q): %v", path, err)
		return
	}
	n.mu.Lock()
	n.named[filepath.Clean(abs)] = true
	n.mu.Unlock()
}

// Check fails the test for every file under the directory that changed
// since the last Check (or NewStateNames) and was not named; when says
// where in the test it runs. It then starts over.
func (n *StateNames) Check(when string) {
	n.t.Helper()
	cur := n.tree()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.checks++
	for p, st := range cur {
		if old, ok := n.last[p]; (!ok || old != st) && !n.covered(p) {
			n.t.Errorf("%s: %s was written and not named", when, p)
		}
	}
	for p := range n.last {
		if _, ok := cur[p]; !ok && !n.covered(p) {
			n.t.Errorf("%s: %s was removed and not named", when, p)
		}
	}
	n.last, n.named = cur, map[string]bool{}
}

// Checks is how many times Check ran.
func (n *StateNames) Checks() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.checks
}

// covered reports whether p or a directory above it was named; n.mu is
// held.
func (n *StateNames) covered(p string) bool {
	for ; len(p) >= len(n.dir); p = filepath.Dir(p) {
		if n.named[p] {
			return true
		}
		if p == n.dir {
			break
		}
	}
	return false
}

func (n *StateNames) tree() map[string]stateFileStat {
	out := map[string]stateFileStat{}
	_ = filepath.WalkDir(n.dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() || de.Name() == "LOCK" || strings.HasSuffix(de.Name(), ".tmp") {
			return nil
		}
		// What is never replicated need not be named: a path with a
		// part that starts with '.' (the store's trash and spares, the
		// replica's own files), as internal/replica's localOnly.
		if rel, err := filepath.Rel(n.dir, p); err == nil {
			for _, part := range strings.Split(rel, string(filepath.Separator)) {
				if strings.HasPrefix(part, ".") {
					return nil
				}
			}
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		st := stateFileStat{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.ino = sys.Ino
		}
		out[p] = st
		return nil
	})
	return out
}
