package store_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// newestLife is the life of name's newest version in s.
func newestLife(t *testing.T, s store.LifeReader, name string) uint64 {
	t.Helper()
	_, life, err := s.NewestLife(name)
	if err != nil || life == 0 {
		t.Fatalf("NewestLife(%s) = %d, %v", name, life, err)
	}
	return life
}

// A File store opened again names each model's life as before: a restart
// (or a standby's copy opened by a promoted hub) does not start a life,
// only a Delete does, and the life of the model pushed again is kept too.
// The versions read carry it, and a claimed model never pushed keeps its
// life for its first push.
func TestFileKeepsLivesAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := store.Config{Retain: 2}
	s := openFile(t, dir, cfg)
	for v := uint64(1); v <= 3; v++ {
		storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 64)})
	}
	if err := s.Claim(bg(t), "claimed", "alice"); err != nil {
		t.Fatal(err)
	}
	first := newestLife(t, s, "m")
	s.Close()

	s = openFile(t, dir, cfg)
	if got := newestLife(t, s, "m"); got != first {
		t.Fatalf("life %d after the store opened again, want %d (no Delete)", got, first)
	}
	if snap, err := s.Get(bg(t), "m", 2); err != nil || snap.Life() != first {
		t.Fatalf("v2 after the store opened again: life %d, %v; want %d", snap.Life(), err, first)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "claimed", Version: 1, Owner: "alice", Blob: storetest.Blob(t, 9, 64)})
	claimed := newestLife(t, s, "claimed")
	if err := s.Delete(bg(t), "m"); err != nil {
		t.Fatal(err)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 11, 64)})
	second := newestLife(t, s, "m")
	if second <= first {
		t.Fatalf("the model pushed again after a Delete has life %d, want one greater than %d", second, first)
	}
	s.Close()

	s = openFile(t, dir, cfg)
	defer s.Close()
	if got := newestLife(t, s, "m"); got != second {
		t.Fatalf("life %d after the store opened again, want %d (the model pushed again)", got, second)
	}
	if got := newestLife(t, s, "claimed"); got != claimed {
		t.Fatalf("the claimed model's life %d after the store opened again, want %d", got, claimed)
	}
}

// A manifest written before lives were recorded (no "life") opens with a
// new life, recorded by the next push so that it is kept from then on;
// the next Delete's life is greater than any restored one, whatever the
// clock said when the process started.
func TestFileManifestWithoutLife(t *testing.T) {
	dir := t.TempDir()
	cfg := store.Config{Retain: 2}
	s := openFile(t, dir, cfg)
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 64)})
	storetest.MustPush(t, s, store.PushRequest{Name: "high", Version: 1, Blob: storetest.Blob(t, 2, 64)})
	// A life above anything this process's counter has reached (another
	// hub's, whose clock was ahead).
	high := newestLife(t, s, "high") + 1<<40
	s.Close()
	editManifest(t, dir, "m", func(m map[string]any) { delete(m, "life") })
	editManifest(t, dir, "high", func(m map[string]any) { m["life"] = high })

	s = openFile(t, dir, cfg)
	old := newestLife(t, s, "m")
	if got := newestLife(t, s, "high"); got != high {
		t.Fatalf("life %d restored, want %d", got, high)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 3, 64)})
	if err := s.Delete(bg(t), "high"); err != nil {
		t.Fatal(err)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "high", Version: 1, Blob: storetest.Blob(t, 4, 64)})
	if got := newestLife(t, s, "high"); got <= high {
		t.Fatalf("life %d after a Delete, want one greater than the restored %d", got, high)
	}
	s.Close()

	s = openFile(t, dir, cfg)
	defer s.Close()
	if got := newestLife(t, s, "m"); got != old {
		t.Fatalf("life %d after the store opened again, want %d (recorded by the push)", got, old)
	}
}

// A manifest naming a life no store numbers makes the open fail, as other
// corruption does, and says why.
func TestFileManifestLifeOutOfRange(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{Retain: 2})
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 64)})
	s.Close()
	editManifest(t, dir, "m", func(m map[string]any) { m["life"] = uint64(1<<64 - 1) })
	_, err := store.OpenFile(store.FileConfig{Dir: dir, Store: store.Config{Retain: 2}})
	if err == nil || !strings.Contains(err.Error(), "life 18446744073709551615 is out of range") {
		t.Fatalf("OpenFile with a manifest's life out of range: %v", err)
	}
}

// editManifest rewrites model name's manifest in dir through edit.
func editManifest(t *testing.T, dir, name string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, store.ModelDir(name), "MANIFEST.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["life"]; !ok {
		t.Fatalf("%s has no life: %s", path, raw)
	}
	edit(m)
	if raw, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}
