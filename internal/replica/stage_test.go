package replica

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestStandbyStagesUnitsInOneDirectory: a standby stages every unit in
// the same directory (stageName), emptied after each, instead of making
// and removing one per unit: across acknowledged publishes its inode
// stays, nothing is left in it, and the versions arrive whole.
func TestStandbyStagesUnitsInOneDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	sc, _ := newNamedClients(t, ctx, p, "staged")
	stage := filepath.Join(p.d.dir, ".replica", stageName)
	ino := func() uint64 {
		t.Helper()
		fi, err := os.Stat(stage)
		if err != nil {
			t.Fatalf("the staging directory: %v", err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	first := ino()
	for v := uint64(1); v <= 4; v++ {
		blob := storeBlob(t, float32(v))
		if _, err := sc.Push(ctx, store.PushRequest{Name: "other", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		p.d.same(t, "other", v, blob) // acknowledged: installed
		if got := ino(); got != first {
			t.Fatalf("after version %d the staging directory is another (inode %d, was %d): one made per unit", v, got, first)
		}
	}
	testkit.Eventually(t, time.Minute, "the staging directory empty between units", func() bool {
		ents, err := os.ReadDir(stage)
		return err == nil && len(ents) == 0
	})
	ents, _ := os.ReadDir(filepath.Join(p.d.dir, ".replica"))
	for _, e := range ents {
		if e.IsDir() && e.Name() != stageName {
			t.Fatalf("another directory under .replica: %s", e.Name())
		}
	}
}
