package replica

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A Delete on the primary, acknowledged, is on its connected standby: the
// model's directory is gone there (not left empty), and the model pushed again from v1
// (same sizes, other bytes) arrives whole, no version of the deleted
// model left beside it; the standby's store, opened as an elected hub
// opens it, serves the new model only, of the primary's life.
func TestStandbyMirrorsADeleteAndTheModelPushedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	d := newDPFollower(t, "", TransportAuto)
	stop := d.followFor(ctx, p.addr)
	push := func(v, seed uint64) []byte {
		t.Helper()
		blob := storetest.Blob(t, seed, 1<<16)
		if _, err := p.fenced.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: bytes.Clone(blob)}); err != nil {
			t.Fatal(err)
		}
		return blob
	}
	for v := uint64(1); v <= 3; v++ {
		d.same(t, "m", v, push(v, v))
	}
	if err := p.fenced.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	// Its directory is gone there, as on the primary: no empty directory
	// stays for each model deleted.
	if left, err := os.ReadDir(filepath.Join(d.dir, "store", store.ModelDir("m"))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deleted model's directory on the standby after the Delete was acknowledged: %v %v", left, err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "store")); err != nil {
		t.Fatalf("the standby's store directory after the Delete: %v", err)
	}
	nu := push(1, 11)
	d.same(t, "m", 1, nu)
	for v := uint64(2); v <= 3; v++ {
		if _, err := os.Stat(filepath.Join(d.dir, "store", store.VersionFile("m", v))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the deleted model's v%d on the standby beside the new v1: %v", v, err)
		}
	}
	_, life, err := p.fenced.NewestLife("m")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(d.dir, "store"), Store: store.Config{Retain: 3}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := st.Get(ctx, "m", 0)
	if err != nil || s.Version != 1 || !bytes.Equal(s.Blob, nu) {
		t.Fatalf("the standby's store serves %v %v, want the new v1", versionOfSnap(s), err)
	}
	if s.Life() != life {
		// The manifest it recovers names the primary's life: a promoted
		// standby's followers go on from the version they hold.
		t.Fatalf("the standby's store names life %d, the primary's %d", s.Life(), life)
	}
	if _, err := st.Get(ctx, "m", 3); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the standby's store serves the deleted model's v3: %v", err)
	}
}

func versionOfSnap(s *store.Snapshot) any {
	if s == nil {
		return "none"
	}
	return s.Version
}

// A directory of the primary that became a file (ars/x/y → ars/x) in one
// unit: the standby installs the file and removes the directory's file,
// and the emptied directory's removal leaves the file in its place.
func TestStandbyKeepsAFileWhereADirectoryWasEmptied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	d := newDPFollower(t, "", TransportAuto)
	stop := d.followFor(ctx, p.addr)
	defer stop()
	x := filepath.Join(p.dir, "ars", "x")
	if err := os.MkdirAll(x, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(x, "y"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.src.Changed(x)
	d.same(t, "a", 1, p.push(t, ctx, "a", 1, 4096))
	if b, err := os.ReadFile(filepath.Join(d.dir, "ars", "x", "y")); err != nil || string(b) != "state" {
		t.Fatalf("ars/x/y on the standby: %q %v", b, err)
	}
	if err := os.RemoveAll(x); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(x, []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.src.Changed(x)
	p.src.Changed(filepath.Join(x, "y"))
	d.same(t, "a", 2, p.push(t, ctx, "a", 2, 4096))
	if b, err := os.ReadFile(filepath.Join(d.dir, "ars", "x")); err != nil || string(b) != "a file" {
		t.Fatalf("ars/x on the standby: %q %v", b, err)
	}
}
