package store_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestFileNamesEveryFileItChanges: with FileConfig.Changed, every file the
// store writes or removes under its directory (a version, the manifest,
// a version dropped past Retain, an owner recorded, a model deleted,
// debris removed at open) is named by the time the call that changed it
// returns (a replication unit is cut after the commit), and NamesFiles
// says so.
func TestFileNamesEveryFileItChanges(t *testing.T) {
	dir := t.TempDir()
	names := testkit.NewStateNames(t, dir)
	open := func(retain int) *store.File {
		f, err := store.OpenFile(store.FileConfig{Dir: dir, Store: store.Config{Retain: retain}, Logger: testkit.Logger(), Changed: names.Changed})
		if err != nil {
			t.Fatal(err)
		}
		if !f.NamesFiles() {
			t.Fatal("NamesFiles is false with Changed set")
		}
		return f
	}
	s := open(2)
	for v := uint64(1); v <= 4; v++ { // v3 and v4 drop v1 and v2
		storetest.MustPush(t, s, store.PushRequest{Name: "team/policy", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 64)})
		names.Check("after a push")
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "other", Version: 1, Blob: storetest.Blob(t, 9, 8)})
	names.Check("after another model's push")
	if err := s.Claim(bg(t), "team/policy", "alice"); err != nil {
		t.Fatal(err)
	}
	names.Check("after Claim")
	if err := s.Release(bg(t), "team/policy", "alice"); err != nil {
		t.Fatal(err)
	}
	names.Check("after Release")
	if err := s.Delete(bg(t), "other"); err != nil {
		t.Fatal(err)
	}
	names.Check("after Delete")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Debris of a crash, removed when the store opens.
	debris := filepath.Join(dir, "team%2Fpolicy", "v00000000000000000009.safetensors")
	if err := os.WriteFile(debris, []byte("debris"), 0o644); err != nil {
		t.Fatal(err)
	}
	names.Changed(debris) // the test's own write
	names.Check("the debris written")
	s = open(1)
	defer s.Close()
	names.Check("after the restart")

	plain, err := store.OpenFile(store.FileConfig{Dir: t.TempDir(), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if plain.NamesFiles() {
		t.Fatal("NamesFiles is true with no Changed")
	}
}
