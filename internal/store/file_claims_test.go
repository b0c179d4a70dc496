package store_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestClaimsOfModelsNeverPushedLeaveNoDirectories: a claim released on a
// model that never had a version, or a claim that failed, left the
// model's directory behind (and a restart left it too), one per name
// ever claimed. What is left of such a model now is nothing.
func TestClaimsOfModelsNeverPushedLeaveNoDirectories(t *testing.T) {
	disk := testkit.SmallTmpfs(t, "1m")
	dir := filepath.Join(disk, "store")
	s := openFile(t, dir, store.Config{})
	defer s.Close()
	base := entries(t, dir) // LOCK, the pool of spares
	for _, name := range []string{"a", "b", "team/c"} {
		if err := s.Claim(bg(t), name, "reducer"); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(bg(t), name, "reducer"); err != nil {
			t.Fatal(err)
		}
	}
	if got := entries(t, dir); !slices.Equal(got, base) {
		t.Errorf("store directory after claims released: %v, want %v", got, base)
	}

	fillDisk(t, filepath.Join(disk, "filler"))
	if err := s.Claim(bg(t), "d", "reducer"); err == nil {
		t.Fatal("a claim whose manifest could not be written succeeded")
	}
	if got := entries(t, dir); !slices.Equal(got, base) {
		t.Errorf("store directory after a failed claim: %v, want %v", got, base)
	}
	os.Remove(filepath.Join(disk, "filler"))

	// A claimed model with no versions stays what it is: claimed.
	if err := s.Claim(bg(t), "kept", "reducer"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// What an earlier store left: an empty model directory.
	if err := os.Mkdir(filepath.Join(dir, "left"), 0o755); err != nil {
		t.Fatal(err)
	}
	s = openFile(t, dir, store.Config{})
	defer s.Close()
	if got, want := entries(t, dir), append(slices.Clone(base), "kept"); !slices.Equal(got, want) {
		t.Errorf("store directory after a reopen: %v, want %v", got, want)
	}
}
