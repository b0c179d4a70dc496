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
// model's directory is gone there, and the model pushed again from v1
// (same sizes, other bytes) arrives whole, no version of the deleted
// model left beside it; the standby's store, opened as an elected hub
// opens it, serves the new model only.
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
	// Its files are gone there (an empty directory may stay: a File store
	// opening it finds no model).
	if left, _ := os.ReadDir(filepath.Join(d.dir, "store", store.ModelDir("m"))); len(left) != 0 {
		t.Fatalf("the deleted model's files on the standby after the Delete was acknowledged: %v", left)
	}
	nu := push(1, 11)
	d.same(t, "m", 1, nu)
	for v := uint64(2); v <= 3; v++ {
		if _, err := os.Stat(filepath.Join(d.dir, "store", store.VersionFile("m", v))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the deleted model's v%d on the standby beside the new v1: %v", v, err)
		}
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
