package replica

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/store"
)

// TestCutKeepsTheBytesOfVersionsTheStoreRecycles: a full sync's cut opens
// the version files under the freeze and reads them while it sends, long
// after commits went on; meanwhile the primary's store drops those
// versions and writes new ones into the inodes of what it dropped
// (atomicfile.Spares). Each file the cut opened still reads as the
// version it was opened as — the cut's shared lock keeps the pool off it
// — however many versions follow.
func TestCutKeepsTheBytesOfVersionsTheStoreRecycles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	sc, _ := newNamedClients(t, ctx, p, "recycled")
	pushed := map[string][]byte{} // version file (rel) → its bytes
	push := func(v uint64) {
		t.Helper()
		blob := storeBlob(t, float32(v))
		if _, err := sc.Push(ctx, store.PushRequest{Name: "other", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		pushed[filepath.Join("store", store.VersionFile("other", v))] = blob
	}
	for v := uint64(1); v <= 3; v++ {
		push(v)
	}
	files, _, _, err := p.src.cut(map[string]stamp{}, nil, true, keepHeld)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, o := range files {
			if o.f != nil {
				o.f.Close()
			}
		}
	}()
	var held []opened
	for _, o := range files {
		if o.f != nil && strings.Contains(o.rel, "other") {
			held = append(held, o)
		}
	}
	if len(held) == 0 {
		t.Fatal("the cut opened none of other's versions")
	}
	// Enough versions to drop every held one and to cycle the pool.
	for v := uint64(4); v <= 4+2*atomicfile.MaxSpares; v++ {
		push(v)
	}
	for _, o := range held {
		got, err := io.ReadAll(o.f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pushed[o.rel]) {
			t.Fatalf("the cut's %s changed under it: the store wrote another version into its inode", o.rel)
		}
	}
	t.Logf("%d version files held by the cut kept their bytes", len(held))
}

// TestOpenImmutableRefusesAFileNoLongerAsWalked: the reducer retires its
// optimizer states without the freeze, so between a walk (or a cut's
// open) and the shared lock the name may be retired and its inode
// written anew by the spares pool: the file, once locked, must still be
// what the walk saw, or it counts as removed since — never sent under the
// old name with the new bytes.
func TestOpenImmutableRefusesAFileNoLongerAsWalked(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "optim-v1.safetensors")
	if err := os.WriteFile(path, []byte("state of version 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	es, err := walk(dir, []string{"."})
	if err != nil || len(es) != 1 {
		t.Fatalf("walk: %v, %v", es, err)
	}
	walked := es[0].st
	f, err := openImmutable(path, walked)
	if err != nil {
		t.Fatalf("a file as walked: %v", err)
	}
	f.Close()
	time.Sleep(10 * time.Millisecond) // past the file system clock's tick
	// The same inode written anew, as Spares.Create does.
	if err := os.WriteFile(path, []byte("state of version 3"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := openImmutable(path, walked); !errors.Is(err, os.ErrNotExist) {
		if f != nil {
			b, _ := io.ReadAll(f)
			t.Fatalf("opened as walked, read %q (err %v); want it counted removed", b, err)
		}
		t.Fatalf("a file written anew since the walk: %v, want os.ErrNotExist", err)
	}
}
