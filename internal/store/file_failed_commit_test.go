package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// fillDisk writes path until the file system it is on is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := fh.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", path, err)
			}
			return
		}
	}
}

// entries lists dir's names, sorted (nil when dir does not exist).
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestFailedCommitLeavesNoVersionFile: a push whose version file was
// written but whose manifest commit then failed (here the disk filled up
// between the two) left the version file on disk until the next restart,
// and the first push of a model its directory too. The failed push now
// removes what it wrote, never a committed version, and the model takes
// the version once there is room again.
func TestFailedCommitLeavesNoVersionFile(t *testing.T) {
	disk := testkit.SmallTmpfs(t, "1m")
	dir := filepath.Join(disk, "store")
	filler := filepath.Join(disk, "filler")
	var full atomic.Bool
	cfg := store.FileConfig{Dir: dir, Logger: testkit.Logger()}
	store.SetFileHook(&cfg, func(stage string) {
		if stage == "blob-renamed" && full.Load() {
			fillDisk(t, filler) // the manifest commit comes next
		}
	})
	s, err := store.OpenFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 1024)})

	full.Store(true)
	if _, err := s.Push(bg(t), store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 1024)}); err == nil {
		t.Fatal("a push whose manifest could not be written succeeded")
	}
	if got, want := entries(t, filepath.Join(dir, "m")), []string{"MANIFEST.json", "v00000000000000000001.safetensors"}; !slices.Equal(got, want) {
		t.Errorf("model directory after the failed commit: %v, want %v", got, want)
	}
	os.Remove(filler)
	if _, err := s.Push(bg(t), store.PushRequest{Name: "new", Version: 1, Blob: storetest.Blob(t, 3, 1024)}); err == nil {
		t.Fatal("the first push of a model whose manifest could not be written succeeded")
	}
	if got := entries(t, filepath.Join(dir, "new")); got != nil {
		t.Errorf("directory of a model whose first push failed: %v, want none", got)
	}
	os.Remove(filler)
	full.Store(false)

	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 1024)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openFile(t, dir, store.Config{})
	defer s.Close()
	if snap, err := s.Get(bg(t), "m", 0); err != nil || snap.Version != 2 {
		t.Fatalf("after a reopen: %v, %v; want version 2", snap, err)
	}
}
