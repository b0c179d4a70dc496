package atomicfile

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A retired file's inode is what the next create writes; a spare still
// linked to a live file (a crash between keepReplaced's link and its
// rename, or a rename that failed) is dropped, never written, and the
// live file keeps its bytes.
func TestSparesNeverWriteAFileStillInTheTree(t *testing.T) {
	dir := t.TempDir()
	sp, err := OpenSpares(filepath.Join(dir, "spare"))
	if err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old")
	writeFile(t, old, bytes.Repeat([]byte{1}, 4096))
	ino := inode(t, old)
	if err := sp.Retire(old); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("a retired file is still at its name: %v", err)
	}
	f, err := sp.Create(filepath.Join(dir, "new"), 9) // the 4096-byte spare, cut to 9
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("new bytes"))
	f.Close()
	if inode(t, filepath.Join(dir, "new")) != ino {
		t.Fatal("create did not reuse the retired file")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "new")); string(got) != "new bytes" {
		t.Fatalf("the reused file holds %q", got)
	}

	live := filepath.Join(dir, "live")
	writeFile(t, live, []byte("the tree's bytes"))
	liveIno := inode(t, live)
	sp.KeepReplaced(live) // and then no rename over it
	if n, _ := sp.Count(); n != 1 {
		t.Fatalf("the pool holds %d files, want the one link", n)
	}
	f, err = sp.Create(filepath.Join(dir, "staged"), 16)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("staged bytes...."))
	f.Close()
	if inode(t, filepath.Join(dir, "staged")) == liveIno {
		t.Fatal("a spare linked to a live file was reused")
	}
	if got, _ := os.ReadFile(live); string(got) != "the tree's bytes" {
		t.Fatalf("the live file now holds %q", got)
	}
	if n, _ := sp.Count(); n != 0 {
		t.Fatalf("the linked spare is still pooled (%d)", n)
	}
}

// openSpares keeps what a previous run left within the bounds and drops
// what is linked elsewhere, not a number or not a file; retiring past the
// bounds removes.
func TestSparesAreBounded(t *testing.T) {
	dir := t.TempDir()
	pool := filepath.Join(dir, "spare")
	if err := os.MkdirAll(filepath.Join(pool, "7"), 0o755); err != nil { // a directory
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(pool, "3"), []byte("kept"))
	writeFile(t, filepath.Join(pool, "junk"), []byte("x"))
	writeFile(t, filepath.Join(dir, "live"), []byte("live"))
	if err := os.Link(filepath.Join(dir, "live"), filepath.Join(pool, "4")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(pool, "5"), make([]byte, MaxSpareBytes+1))
	sp, err := OpenSpares(pool)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(pool)
	if len(ents) != 1 || ents[0].Name() != "3" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the pool kept %v, want [3]", names)
	}
	if sp.next != 4 {
		t.Fatalf("next spare name %d, want 4", sp.next)
	}
	for i := range MaxSpares + 3 {
		p := filepath.Join(dir, "f")
		writeFile(t, p, []byte{byte(i)})
		if err := sp.Retire(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("retired file %d still there", i)
		}
	}
	if n, _ := sp.Count(); n != MaxSpares {
		t.Fatalf("the pool holds %d files, want %d", n, MaxSpares)
	}
	if ents, _ := os.ReadDir(pool); len(ents) != MaxSpares {
		t.Fatalf("the pool's directory holds %d files, want %d", len(ents), MaxSpares)
	}
	if err := sp.Retire(filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("retiring a missing file: %v", err)
	}
}
