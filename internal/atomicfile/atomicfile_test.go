package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestWriteReplacesWholeAndLeavesNoTemp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new "), []byte("one")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new one" {
		t.Fatalf("file holds %q, want %q", b, "new one")
	}
	if _, err := os.Stat(path + TmpSuffix); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
}

func TestWriteFailureKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory where the temporary file must go makes the write fail.
	if err := os.Mkdir(path+TmpSuffix, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new")); err == nil {
		t.Fatal("Write over an unwritable temporary name succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("a failed write changed the file to %q", b)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("SyncDir of a missing directory succeeded")
	}
}

// TestWriteWithHooks: Written runs after each piece, before the rename
// (the target still holds the old contents), and Renamed once the new
// file is in place.
func TestWriteWithHooks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	var seen []string
	h := Hooks{
		Written: func(i int) {
			b, _ := os.ReadFile(path)
			seen = append(seen, fmt.Sprintf("written %d, target %q", i, b))
		},
		Renamed: func() {
			b, _ := os.ReadFile(path)
			seen = append(seen, fmt.Sprintf("renamed, target %q", b))
		},
	}
	if err := WriteWith(path, h, []byte("ne"), []byte("w")); err != nil {
		t.Fatal(err)
	}
	want := []string{`written 0, target "old"`, `written 1, target "old"`, `renamed, target "new"`}
	if !slices.Equal(seen, want) {
		t.Fatalf("hooks saw %q, want %q", seen, want)
	}
}

// MkdirAll makes the directories missing on the way (and fsyncs each
// one's parent, which a kill -9 cannot show), accepts a directory that is
// there, and refuses a path that is a file.
func TestMkdirAll(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b", "c")
	if err := MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(deep); err != nil || !fi.IsDir() {
		t.Fatalf("%s after MkdirAll: %v", deep, err)
	}
	if err := MkdirAll(deep, 0o755); err != nil {
		t.Fatalf("again: %v", err)
	}
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(file, 0o755); err == nil {
		t.Fatal("a file taken for a directory")
	}
	if err := MkdirAll(filepath.Join(file, "under"), 0o755); err == nil {
		t.Fatal("a directory made under a file")
	}
}
