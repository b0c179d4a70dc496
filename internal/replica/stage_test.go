package replica

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
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
		if e.IsDir() && e.Name() != stageName && e.Name() != spareName {
			t.Fatalf("another directory under .replica: %s", e.Name())
		}
	}
}

// TestStandbyReusesTheInodesOfWhatUnitsRemove: a version a unit drops
// and a manifest a unit replaces on a standby are not unlinked but kept
// in the pool of spares, and a later unit's staged file is written into
// that same inode — while every version still arrives byte for byte.
// The test holds the dropped version's and the replaced manifest's
// files open: removed, their link count would be 0.
func TestStandbyReusesTheInodesOfWhatUnitsRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	sc, _ := newNamedClients(t, ctx, p, "staged")
	push := func(v uint64) {
		t.Helper()
		blob := storeBlob(t, float32(v))
		if _, err := sc.Push(ctx, store.PushRequest{Name: "other", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		p.d.same(t, "other", v, blob) // acknowledged: installed
	}
	open := func(rel string) (*os.File, uint64) {
		t.Helper()
		f, err := os.Open(filepath.Join(p.d.dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return f, fi.Sys().(*syscall.Stat_t).Ino
	}
	nlink := func(f *os.File) uint64 {
		t.Helper()
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return uint64(fi.Sys().(*syscall.Stat_t).Nlink)
	}
	push(1)
	first := filepath.Join("store", store.VersionFile("other", 1))
	v1, v1ino := open(first)
	manifest, _ := open(filepath.Join("store", store.ModelDir("other"), "MANIFEST.json"))
	v := uint64(1)
	for {
		v++
		push(v)
		if _, err := os.Stat(filepath.Join(p.d.dir, first)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if v > 64 {
			t.Fatal("version 1 never dropped from the standby's copy")
		}
	}
	if n := nlink(v1); n != 1 {
		t.Fatalf("version 1's file, dropped, has %d links: unlinked, not kept as a spare", n)
	}
	if n := nlink(manifest); n != 1 {
		t.Fatalf("the manifest version 1 left, replaced, has %d links: unlinked, not kept as a spare", n)
	}
	// The next units stage their versions in spares: version 1's inode
	// comes back as a version file.
	reused := uint64(0)
	for end := v + 8; v < end && reused == 0; {
		v++
		push(v)
		for w := uint64(1); w <= v; w++ {
			fi, err := os.Stat(filepath.Join(p.d.dir, "store", store.VersionFile("other", w)))
			if err == nil && fi.Sys().(*syscall.Stat_t).Ino == v1ino {
				reused = w
			}
		}
	}
	if reused == 0 {
		t.Fatalf("version 1's inode was never reused for a later version (up to %d)", v)
	}
	if n := nlink(v1); n != 1 {
		t.Fatalf("version 1's inode, reused as version %d, has %d links", reused, n)
	}
	n, bytes := p.d.f.spares.Count()
	if n > atomicfile.MaxSpares || bytes > atomicfile.MaxSpareBytes {
		t.Fatalf("the pool holds %d files, %d bytes: past its bounds", n, bytes)
	}
	t.Logf("version 1's inode reused as version %d; pool %d files, %d bytes", reused, n, bytes)
}

// TestStandbySavesItsPositionWithTheMarker: a standby saves its position
// by renaming each installed unit's commit marker to .replica/position,
// not by writing a position file of its own per unit: after each
// acknowledged publish the saved position is a marker (it names the
// unit's moves) carrying the position the standby answers with, no
// temporary file is left beside it, and the staging directory holds no
// marker.
func TestStandbySavesItsPositionWithTheMarker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	sc, _ := newNamedClients(t, ctx, p, "marked")
	dir := filepath.Join(p.d.dir, ".replica")
	for v := uint64(1); v <= 3; v++ {
		blob := storeBlob(t, float32(v))
		if _, err := sc.Push(ctx, store.PushRequest{Name: "other", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		p.d.same(t, "other", v, blob) // acknowledged: installed, its position saved
		b, err := os.ReadFile(filepath.Join(dir, positionName))
		if err != nil {
			t.Fatalf("after version %d: no saved position: %v", v, err)
		}
		var mk unitMarker
		if err := json.Unmarshal(b, &mk); err != nil {
			t.Fatalf("after version %d: the saved position %q: %v", v, b, err)
		}
		if len(mk.Files) == 0 || mk.Epoch != 5 || mk.Unit == 0 {
			t.Fatalf("after version %d: the saved position %s is not a unit's marker with its position", v, b)
		}
		// The position answered is at least the saved one (a later unit, a
		// ping's, may have been applied since the read).
		if got, saved := p.d.f.position(), (position{Epoch: mk.Epoch, Unit: mk.Unit}); got != saved && !got.ahead(saved) {
			t.Fatalf("after version %d: the standby answers %+v, behind its saved %d/%d", v, got, mk.Epoch, mk.Unit)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, positionName+atomicfile.TmpSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a temporary position file after the units: %v, want none", err)
	}
	// Between units (a later one, if any, ends too) the marker is gone.
	testkit.Eventually(t, time.Minute, "no commit marker in the staging directory", func() bool {
		_, err := os.Stat(filepath.Join(dir, stageName, markerName))
		return errors.Is(err, os.ErrNotExist)
	})
}
