package replica

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A snapshot holds what changed since the one before (its delta), not the
// tree, and a stream sends a follower the deltas after what it holds (or
// everything from the newest snapshot that walked a part whole). These
// tests drive a Source's snapshots and streams in process, with virtual
// followers that apply the frames they are sent, against a reference:
// the files on the primary's disk when each snapshot was taken.

// recStream is a follower's end of a stream, in memory: it applies every
// unit sent to files.
type recStream struct {
	files   map[string][]byte
	cur     string
	left    int64
	units   int
	appends int // G frames taken
}

func (r *recStream) Context() context.Context { return context.Background() }
func (r *recStream) RecvMsg(any) error        { return fmt.Errorf("recStream: no acks") }

func (r *recStream) SendMsg(m any) error {
	b := m.(*wrapperspb.BytesValue).GetValue()
	if r.left > 0 {
		r.files[r.cur] = append(r.files[r.cur], b...)
		r.left -= int64(len(b))
		return nil
	}
	switch b[0] {
	case kindBegin:
		r.units++
	case kindFile:
		rel, size, err := parsePath(kindFile, b[1:])
		if err != nil {
			return err
		}
		r.cur, r.left = rel, size
		r.files[rel] = []byte{}
	case kindDelete:
		rel, _, err := parsePath(kindDelete, b[1:])
		if err != nil {
			return err
		}
		delete(r.files, rel)
	case kindAppend:
		rel, size, from, err := parseAppend(b[1:])
		if err != nil {
			return err
		}
		held, ok := r.files[rel]
		if !ok || int64(len(held)) < from {
			return fmt.Errorf("recStream: append to %s from %d, holding %d bytes", rel, from, len(held))
		}
		r.cur, r.left = rel, size-from
		r.files[rel] = append(held[:from:from], make([]byte, 0, size-from)...)
		r.appends++
	case kindKeep:
		return fmt.Errorf("recStream: keep without an inventory")
	case kindEnd:
	default:
		return fmt.Errorf("recStream: frame kind %q", b[0])
	}
	return nil
}

// virtualFollower is one follower's stream state on the primary (what
// ship keeps) and its end (rec).
type virtualFollower struct {
	p       *peer
	rec     *recStream
	shipped map[string]stamp
	seen    uint64
	sent    uint64
	appends bool // takes G frames (hello.Appends)
}

// deltaRig is a Source over a temporary data directory, the reference
// (disk content by snapshot) and the followers.
type deltaRig struct {
	t       *testing.T
	dir     string
	src     *Source
	at      map[uint64]map[string][]byte // the mirrored files on disk when snapshot seq was taken
	fs      []*virtualFollower
	writes  int // makes every write's size unique: a stamp never recurs
	cuts    int // units sent from a follower's own cut after its full sync
	deltaOK int // snapshots sent from deltas
}

func newDeltaRig(t *testing.T, followers int) *deltaRig {
	r := &deltaRig{t: t, dir: t.TempDir(), at: map[uint64]map[string][]byte{}}
	var err error
	r.src, err = NewSource(SourceConfig{DataDir: r.dir, Epoch: 1, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	r.src.fullEvery = 24 * time.Hour // the safety net only when a test asks for it (whole)
	for i := range followers {
		f := &virtualFollower{p: &peer{member: fmt.Sprintf("s%d", i)}, rec: &recStream{files: map[string][]byte{}}, shipped: map[string]stamp{}}
		r.src.mu.Lock()
		r.src.followers[f.p] = struct{}{}
		r.src.mu.Unlock()
		r.fs = append(r.fs, f)
	}
	return r
}

// disk reads every mirrored file of the primary's data directory.
func (r *deltaRig) disk() map[string][]byte {
	r.t.Helper()
	es, err := walk(r.dir, mirroredDirs)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(r.dir, e.rel))
		if err != nil {
			r.t.Fatal(err)
		}
		out[e.rel] = b
	}
	return out
}

// write replaces rel as the writers do (a new file renamed into place),
// with content of a size no write made before.
func (r *deltaRig) write(rel string) {
	r.t.Helper()
	r.writes++
	b := bytes.Repeat([]byte{byte(r.writes)}, 100+r.writes)
	path := filepath.Join(r.dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(path+atomicfile.TmpSuffix, b, 0o644); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(path+atomicfile.TmpSuffix, path); err != nil {
		r.t.Fatal(err)
	}
}

// snapshot takes one as a publish (force) or the scan does; whole makes
// it the safety net's (every part walked).
func (r *deltaRig) snapshot(force, whole bool) *snapshot {
	r.t.Helper()
	s := r.src
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if whole {
		s.fullEvery = 0
		defer func() { s.fullEvery = 24 * time.Hour }()
	}
	s.mu.Lock()
	latest := s.latest
	s.mu.Unlock()
	disk := r.disk() // nothing writes meanwhile: what the snapshot sees
	snap, err := s.takeSnapshot(latest, force)
	if err != nil {
		r.t.Fatal(err)
	}
	if snap != nil && snap != latest {
		r.at[snap.seq] = disk
	}
	return snap
}

// join gives f its full sync (its own cut), as a stream does first.
func (r *deltaRig) join(f *virtualFollower) {
	r.t.Helper()
	seen, err := r.src.sendCut(f.rec, f.p, 0, true, f.shipped, nil, true)
	if err != nil {
		r.t.Fatal(err)
	}
	f.seen = seen
	r.check(f, r.disk(), "after its full sync")
}

// ship sends f the newest snapshot as ship does, and checks f holds what
// the disk held when it was taken (or, after its own cut, holds now).
func (r *deltaRig) ship(f *virtualFollower) {
	r.t.Helper()
	s := r.src
	s.mu.Lock()
	snap := s.latest
	s.mu.Unlock()
	if snap == nil || snap.seq <= f.seen {
		return
	}
	unit := max(snap.unit, f.sent)
	ok, err := s.sendSnapshot(f.rec, snap, f.seen, unit, false, f.shipped, false, f.appends)
	if err != nil {
		r.t.Fatal(err)
	}
	want, how := r.at[snap.seq], fmt.Sprintf("snapshot %d (from %d)", snap.seq, f.seen)
	cutSeq := uint64(0)
	if !ok {
		if cutSeq, err = s.sendCut(f.rec, f.p, unit, false, f.shipped, nil, false); err != nil {
			r.t.Fatal(err)
		}
		want, how = r.disk(), fmt.Sprintf("its own cut after snapshot %d (from %d)", snap.seq, f.seen)
		r.cuts++
	} else {
		r.deltaOK++
	}
	f.sent, f.seen = unit, max(snap.seq, cutSeq)
	s.passed(f.p, snap)
	r.check(f, want, how)
}

func (r *deltaRig) check(f *virtualFollower, want map[string][]byte, how string) {
	r.t.Helper()
	for rel, b := range want {
		if got, ok := f.rec.files[rel]; !ok {
			r.t.Fatalf("%s after %s: %s missing", f.p.member, how, rel)
		} else if !bytes.Equal(got, b) {
			r.t.Fatalf("%s after %s: %s holds %d bytes, want %d", f.p.member, how, rel, len(got), len(b))
		}
	}
	for rel := range f.rec.files {
		if _, ok := want[rel]; !ok {
			r.t.Fatalf("%s after %s: %s not removed", f.p.member, how, rel)
		}
	}
}

// TestSnapshotDeltasKeepFollowersExact: random writes, rewrites and
// removals (of files and of whole directories, named by their writers;
// and some by hand, which only the safety net's whole walk finds),
// snapshots taken as publishes and as scans, and three followers shipped
// at different paces (so one applies several snapshots' deltas at once,
// some from a whole walk): after every unit a follower holds exactly
// what the primary's disk held when that snapshot was taken.
func TestSnapshotDeltasKeepFollowersExact(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			r := newDeltaRig(t, 3)
			s := r.src
			state := func() string { // a path under ars/ or reducer/
				return filepath.Join([]string{"ars", "reducer"}[rng.IntN(2)], fmt.Sprintf("r%d", rng.IntN(3)), fmt.Sprintf("f%d", rng.IntN(6)))
			}
			r.write(state())
			r.write(filepath.Join("store", "m0", "MANIFEST.json"))
			r.snapshot(true, false)
			r.fs[0].appends, r.fs[2].appends = true, true // 1 is an older build's
			for _, f := range r.fs {
				r.join(f)
			}
			version, failed := 0, 0
			for range 300 {
				switch op := rng.IntN(26); {
				case op == 25: // a snapshot that fails after taking the names (a named path under a file)
					if rel := state(); fileExists(filepath.Join(r.dir, rel)) {
						// Not walked when the part is walked whole, or
						// with the file when it is named too: taken.
						s.Changed(filepath.Join(r.dir, rel, "under-a-file"))
						disk := r.disk()
						s.snapMu.Lock()
						s.mu.Lock()
						latest := s.latest
						s.mu.Unlock()
						snap, err := s.takeSnapshot(latest, true)
						s.snapMu.Unlock()
						if err != nil {
							failed++
						} else if snap != latest {
							r.at[snap.seq] = disk
						}
					}
				case op >= 23: // a named rewrite in place at the stamp it had (a stamp that recurs)
					r.writes++
					if m := fmt.Sprintf("m%d", rng.IntN(2)); op == 23 {
						rel := filepath.Join("store", m, "MANIFEST.json")
						if _, err := os.Stat(filepath.Join(r.dir, rel)); err == nil {
							if err := s.CommitModel(m, func() error { rewriteAtStamp(t, filepath.Join(r.dir, rel), byte(r.writes)); return nil }); err != nil {
								t.Fatal(err)
							}
						}
					} else if rel := state(); fileExists(filepath.Join(r.dir, rel)) {
						rewriteAtStamp(t, filepath.Join(r.dir, rel), byte(r.writes))
						s.Changed(filepath.Join(r.dir, rel))
					}
				case op >= 20: // a journal appended to (Appended), or started (Changed)
					rel := filepath.Join("reducer", fmt.Sprintf("r%d", rng.IntN(3)), "journal.log")
					if _, err := os.Stat(filepath.Join(r.dir, rel)); err == nil {
						r.appendTo(rel, 1+rng.IntN(64))
					} else {
						r.write(rel)
						s.Changed(filepath.Join(r.dir, rel))
					}
				case op < 6: // a writer's write, named
					rel := state()
					r.write(rel)
					s.Changed(filepath.Join(r.dir, rel))
				case op < 8: // a writer's removal, named
					rel := state()
					if err := os.Remove(filepath.Join(r.dir, rel)); err == nil {
						s.Changed(filepath.Join(r.dir, rel))
					}
				case op < 9: // a directory removed, named as one
					rel := filepath.Dir(state())
					if err := os.RemoveAll(filepath.Join(r.dir, rel)); err != nil {
						t.Fatal(err)
					}
					s.Changed(filepath.Join(r.dir, rel))
				case op < 11: // a store commit: a version and the manifest, an old version dropped
					m := fmt.Sprintf("m%d", rng.IntN(2))
					version++
					if err := s.CommitModel(m, func() error {
						r.write(filepath.Join("store", m, fmt.Sprintf("v%d.safetensors", version)))
						r.write(filepath.Join("store", m, "MANIFEST.json"))
						old := filepath.Join(r.dir, "store", m, fmt.Sprintf("v%d.safetensors", version-4))
						if err := os.Remove(old); err != nil && !os.IsNotExist(err) {
							return err
						}
						return nil
					}); err != nil {
						t.Fatal(err)
					}
				case op < 12: // a change no writer named, then the safety net
					rel := state()
					if rng.IntN(2) == 0 {
						r.write(rel)
					} else {
						os.Remove(filepath.Join(r.dir, rel))
					}
					r.snapshot(rng.IntN(2) == 0, true)
				case op < 15:
					r.snapshot(op < 13, false)
				default: // follower 0 keeps up, 1 lags, 2 lags more
					r.ship(r.fs[[]int{0, 0, 0, 1, 1, 2}[rng.IntN(6)]])
				}
			}
			r.snapshot(true, false)
			for _, f := range r.fs {
				r.ship(f)
			}
			// Every snapshot carries what the one before held for a
			// follower that has not shipped it: none needs its own cut.
			if r.deltaOK == 0 || r.cuts != 0 {
				t.Fatalf("%d snapshots sent from deltas, %d own cuts; want some and none", r.deltaOK, r.cuts)
			}
			if r.fs[0].rec.appends == 0 || r.fs[1].rec.appends != 0 {
				t.Fatalf("G frames taken: %d by a follower that takes them, %d by one that does not", r.fs[0].rec.appends, r.fs[1].rec.appends)
			}
			if failed == 0 {
				t.Fatalf("no snapshot failed")
			}
		})
	}
}

// TestSnapshotHoldsWhatChanged: with many state files, a snapshot after
// one named write holds that file alone (its delta; no copy of the tree),
// and a follower one snapshot behind is sent that one file; a whole walk
// (the safety net) holds every file (full).
func TestSnapshotHoldsWhatChanged(t *testing.T) {
	r := newDeltaRig(t, 1)
	for i := range 200 {
		r.write(filepath.Join("reducer", fmt.Sprintf("m%d", i%10), fmt.Sprintf("f%d", i)))
	}
	r.snapshot(true, false)
	f := r.fs[0]
	r.join(f)
	for i := range 5 {
		rel := filepath.Join("reducer", "m3", fmt.Sprintf("f%d", 3+10*i))
		r.write(rel)
		r.src.Changed(filepath.Join(r.dir, rel))
		snap := r.snapshot(false, false)
		if got := slices.Collect(maps.Keys(snap.delta)); !slices.Equal(got, []string{rel}) || snap.full != nil {
			t.Fatalf("snapshot after writing %s: delta %v, full %d files; want that file alone, no full", rel, got, len(snap.full))
		}
		units := f.rec.units
		shipped := maps.Clone(f.shipped)
		r.ship(f)
		if f.rec.units != units+1 {
			t.Fatalf("%d units sent, want 1", f.rec.units-units)
		}
		for p, st := range f.shipped {
			if p != rel && shipped[p] != st {
				t.Fatalf("%s was sent again", p)
			}
		}
	}
	rel := filepath.Join("reducer", "m4", "f4")
	r.write(rel) // by hand: no name
	snap := r.snapshot(false, true)
	if len(snap.full) != 200 || len(snap.delta) != 1 {
		t.Fatalf("the safety net's snapshot: %d files in full, %d in delta; want 200 and 1", len(snap.full), len(snap.delta))
	}
	r.ship(f)
	if r.cuts != 0 {
		t.Fatalf("%d own cuts; want none", r.cuts)
	}
}

// rewriteAtStamp rewrites path in place with fill bytes, at its size,
// and sets its mtime back: new content under the stamp it had.
func rewriteAtStamp(t *testing.T, path string, fill byte) {
	t.Helper()
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{fill}, int(before.Size())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); stampOf(after) != stampOf(before) {
		t.Fatalf("%s: the stamp did not recur (%v, was %v)", path, stampOf(after), stampOf(before))
	}
}

// TestNamedFileIsSentWhenItsStampRecurs: a file its writer names is sent
// even when its stamp (inode, size, mtime) is the one the snapshot before
// saw — what a name written again can look like when the file system
// gives it back an inode it had within one tick of its clock. The test
// rewrites the file in place at its size and sets its mtime back.
func TestNamedFileIsSentWhenItsStampRecurs(t *testing.T) {
	r := newDeltaRig(t, 1)
	rel := filepath.Join("store", "m", "MANIFEST.json")
	r.write(rel)
	r.write(filepath.Join("reducer", "m", "registration.json"))
	r.snapshot(true, false)
	f := r.fs[0]
	r.join(f)
	for i, rel := range []string{rel, filepath.Join("reducer", "m", "registration.json")} {
		path := filepath.Join(r.dir, rel)
		rewriteAtStamp(t, path, byte(0xE0+i))
		r.src.Changed(path)
		r.src.mu.Lock()
		prev := r.src.latest
		r.src.mu.Unlock()
		snap := r.snapshot(false, false)
		if snap == prev {
			t.Fatalf("%s, named with its stamp unchanged: no snapshot taken", rel)
		}
		if _, ok := snap.delta[rel]; !ok {
			t.Fatalf("%s, named with its stamp unchanged, is not in the snapshot's delta", rel)
		}
		r.ship(f) // checks the follower holds the new bytes
	}
}

// TestOwnCutSendsMutableFilesWhateverTheirStamp: a follower that needs
// its own cut (its snapshots are gone) gets every mutable file, even one
// whose stamp recurred since it was shipped — a manifest rewritten at its
// size into an inode it had, within one tick of the clock — where the
// immutable versions it holds are not sent again.
func TestOwnCutSendsMutableFilesWhateverTheirStamp(t *testing.T) {
	r := newDeltaRig(t, 1)
	manifest := filepath.Join("store", "m", "MANIFEST.json")
	version := filepath.Join("store", "m", "v1.safetensors")
	state := filepath.Join("reducer", "m", "registration.json")
	for _, rel := range []string{manifest, version, state} {
		r.write(rel)
	}
	r.snapshot(true, false)
	f := r.fs[0]
	r.join(f)
	for i, rel := range []string{manifest, state} {
		rewriteAtStamp(t, filepath.Join(r.dir, rel), byte(0xD0+i))
	}
	rec := &recStream{files: map[string][]byte{}}
	if _, err := r.src.sendCut(rec, f.p, 2, false, f.shipped, nil, false); err != nil {
		t.Fatal(err)
	}
	disk := r.disk()
	for _, rel := range []string{manifest, state} {
		if got, ok := rec.files[rel]; !ok {
			t.Errorf("own cut: %s, rewritten with its stamp unchanged, not sent", rel)
		} else if !bytes.Equal(got, disk[rel]) {
			t.Errorf("own cut: %s sent as %d bytes, not what the disk holds", rel, len(got))
		}
	}
	if _, ok := rec.files[version]; ok {
		t.Errorf("own cut: %s, unchanged and immutable, sent again", version)
	}
}

// appendTo appends n bytes to rel in place (as the reducer's journal
// grows) and names the append as its writer does; it returns the size
// the file had.
func (r *deltaRig) appendTo(rel string, n int) int64 {
	r.t.Helper()
	r.writes++
	path := filepath.Join(r.dir, rel)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte{byte(r.writes)}, n)); err != nil {
		r.t.Fatal(err)
	}
	r.src.Appended(path, fi.Size())
	return fi.Size()
}

// TestAppendsShipTheNewBytesOnly: a file its writer only appends to
// (Appended) reaches a follower that takes appends as its new bytes —
// one G frame per unit, however many snapshots the unit spans — and
// every other follower whole; a rewrite (in place or not), an append
// named from past what the snapshot before read, or a follower that
// holds less makes it whole again, and a name that comes after the
// snapshot that read its bytes changes nothing. After every unit each
// follower holds what the disk held (ship checks).
func TestAppendsShipTheNewBytesOnly(t *testing.T) {
	r := newDeltaRig(t, 2)
	journal := filepath.Join("reducer", "m", "journal.log")
	r.write(journal)
	r.write(filepath.Join("reducer", "m", "registration.json"))
	r.snapshot(true, false)
	withG, without := r.fs[0], r.fs[1]
	withG.appends = true
	r.join(withG)
	r.join(without)
	shipAll := func() {
		for _, f := range r.fs {
			r.ship(f)
		}
	}
	expect := func(step string, appends int) {
		t.Helper()
		if withG.rec.appends != appends {
			t.Fatalf("%s: %d G frames taken, want %d", step, withG.rec.appends, appends)
		}
		if without.rec.appends != 0 {
			t.Fatalf("%s: a follower without appends took %d G frames", step, without.rec.appends)
		}
	}

	r.appendTo(journal, 40)
	r.snapshot(true, false)
	shipAll()
	expect("one append", 1)

	// Two snapshots' appends, shipped as one unit: one G frame from
	// where the follower's copy ends.
	r.appendTo(journal, 30)
	r.snapshot(true, false)
	r.appendTo(journal, 20)
	r.snapshot(true, false)
	shipAll()
	expect("two snapshots' appends in one unit", 2)

	// Rewritten (compacted: a new file renamed in) and appended to
	// within one snapshot: whole.
	r.write(journal)
	r.src.Changed(filepath.Join(r.dir, journal))
	r.appendTo(journal, 10)
	r.snapshot(true, false)
	shipAll()
	expect("a rewrite then an append", 2)

	// An append named from past what the snapshot before saw (bytes
	// between written unnamed): whole.
	f, err := os.OpenFile(filepath.Join(r.dir, journal), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("unnamed")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r.appendTo(journal, 10)
	r.snapshot(true, false)
	shipAll()
	expect("an append past what the snapshot before saw", 2)

	// An append named after the snapshot that read its bytes (writers
	// append outside the freeze): nothing new for it; the next append
	// goes as one again.
	r.appendTo(journal, 10)
	f, err = os.OpenFile(filepath.Join(r.dir, journal), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("named late")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r.snapshot(true, false) // reads the second append's bytes too
	shipAll()
	expect("an append with a second one unnamed yet", 3)
	r.src.mu.Lock()
	before := r.src.latest
	r.src.mu.Unlock()
	r.src.Appended(filepath.Join(r.dir, journal), fi.Size())
	if snap := r.snapshot(false, false); snap != before {
		if _, ok := snap.delta[journal]; ok {
			t.Fatalf("an append the snapshot before read is in the next one's delta: %+v", snap.delta[journal])
		}
	}
	shipAll()
	expect("a late name", 3)

	// Appends again from there on.
	r.appendTo(journal, 10)
	r.snapshot(true, false)
	shipAll()
	expect("appends after the whole one", 4)

	// A follower whose copy ends before the first append of its span
	// (shipped as of an older state): whole.
	old := withG.shipped[journal]
	old.size--
	withG.shipped[journal] = old
	r.appendTo(journal, 10)
	r.snapshot(true, false)
	shipAll()
	expect("a follower holding less", 4)

	// Cut back in place and written again (a failed append's truncate:
	// the same inode, named whole), then appended to, while the follower
	// lags across both snapshots: whole, though the append's offset lies
	// within what the follower holds.
	path := filepath.Join(r.dir, journal)
	fi, err = os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	r.appendTo(journal, 5)
	r.src.Changed(path)
	r.snapshot(true, false)
	r.ship(without)
	r.appendTo(journal, int(fi.Size())) // past what the follower holds
	r.snapshot(true, false)
	shipAll()
	expect("an append after a rewrite in place", 4)

	// The other way round: appended to, then cut back in place and
	// written past what the follower holds (named whole), while the
	// follower lags across both: whole.
	r.appendTo(journal, 10)
	r.snapshot(true, false)
	r.ship(without)
	if fi, err = os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	r.appendTo(journal, int(fi.Size()))
	r.src.Changed(path)
	r.snapshot(true, false)
	shipAll()
	expect("a rewrite in place after an append", 4)
	if n := r.src.appendsSent.Load(); n != 4 {
		t.Fatalf("the source counts %d appends sent, want 4", n)
	}
}

// TestSnapshotsReadOnlyWhatWasAppended: a snapshot reads of a file only
// appended to since the snapshot before the bytes past what that one
// read, not the file again, and every follower — taking appends or the
// file whole — still ends with it exact.
func TestSnapshotsReadOnlyWhatWasAppended(t *testing.T) {
	r := newDeltaRig(t, 2)
	journal := filepath.Join("reducer", "m", "journal.log")
	path := filepath.Join(r.dir, journal)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{7}, 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	r.snapshot(true, false) // the base: reads nothing
	r.fs[0].appends = true
	for _, f := range r.fs {
		r.join(f)
	}
	r.appendTo(journal, 100)
	r.snapshot(true, false) // the snapshot before read nothing: whole
	if n := r.src.mutableRead.Load(); n < 256<<10 {
		t.Fatalf("the first append's snapshot read %d bytes, want the whole file", n)
	}
	before, appended := r.src.mutableRead.Load(), 0
	for i := range 40 {
		appended += 50 + i
		r.appendTo(journal, 50+i)
		r.snapshot(true, false)
		if i%3 == 0 { // units spanning snapshots too
			for _, f := range r.fs {
				r.ship(f)
			}
		}
	}
	for _, f := range r.fs {
		r.ship(f)
	}
	if n := r.src.mutableRead.Load() - before; n != uint64(appended) {
		t.Fatalf("40 appends of %d bytes in all: the snapshots read %d bytes", appended, n)
	}
	if r.fs[0].rec.appends == 0 || r.fs[1].rec.appends != 0 {
		t.Fatalf("G frames: %d to the follower taking them, %d to the other", r.fs[0].rec.appends, r.fs[1].rec.appends)
	}

	// Rewritten (a new file renamed in, named whole): read whole again.
	r.write(journal)
	r.src.Changed(path)
	before = r.src.mutableRead.Load()
	r.snapshot(true, false)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.src.mutableRead.Load() - before; n != uint64(fi.Size()) {
		t.Fatalf("a rewrite's snapshot read %d bytes, want the file's %d", n, fi.Size())
	}
	for _, f := range r.fs {
		r.ship(f)
	}
}

// TestReadAsWalkedNeverWritesOverAnotherContentsBytes: the bytes past a
// content's go into its spare capacity for one later content only; a
// second one read on the same base (the file cut back in place and
// written again) copies, and the first keeps what it read.
func TestReadAsWalkedNeverWritesOverAnotherContentsBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	stampNow := func() stamp {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return stampOf(fi)
	}
	if err := os.WriteFile(path, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := &content{st: stampNow(), size: 3, raw: append(make([]byte, 0, 64), "abc"...)}
	appendFile := func(s string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	appendFile("def")
	first, n, err := readAsWalked(path, stampNow(), base)
	if err != nil || string(first) != "abcdef" || n != 3 {
		t.Fatalf("first read on the base: %q, %d bytes read, %v; want \"abcdef\", 3", first, n, err)
	}
	if err := os.Truncate(path, 3); err != nil {
		t.Fatal(err)
	}
	appendFile("XYZW")
	second, n, err := readAsWalked(path, stampNow(), base)
	if err != nil || string(second) != "abcXYZW" || n != 4 {
		t.Fatalf("second read on the base: %q, %d bytes read, %v; want \"abcXYZW\", 4", second, n, err)
	}
	if string(first) != "abcdef" || string(base.raw) != "abc" {
		t.Fatalf("after a second read on the base: the first holds %q, the base %q", first, base.raw)
	}
	// A content read on the base's spare capacity takes its own next.
	next := &content{st: stampNow(), size: int64(len(second)), raw: second}
	appendFile("!")
	third, n, err := readAsWalked(path, stampNow(), next)
	if err != nil || string(third) != "abcXYZW!" || n != 1 {
		t.Fatalf("a read on the second: %q, %d bytes read, %v", third, n, err)
	}
	// Not the inode walked, or shorter than walked: nothing read.
	st := stampNow()
	st.ino++
	if b, _, err := readAsWalked(path, st, next); b != nil || err != nil {
		t.Fatalf("another inode: %q, %v", b, err)
	}
}

// TestLostNamesSendEveryMutableFile: when the names writers gave are
// lost — taken by a snapshot that failed, or more than maxNamed between
// two snapshots — the next snapshot walks the part whole and sends every
// mutable file in it whatever its stamp, so a file named and rewritten
// at a stamp that recurs still reaches the followers.
func TestLostNamesSendEveryMutableFile(t *testing.T) {
	r := newDeltaRig(t, 1)
	manifest := filepath.Join("store", "m", "MANIFEST.json")
	record := filepath.Join("ars", "run", "state.json")
	other := filepath.Join("ars", "run", "other.json")
	r.write(manifest)
	r.write(record)
	r.write(other)
	r.snapshot(true, false)
	r.join(r.fs[0])
	// Both files rewritten in place at the stamps they had, and named.
	rewriteNamed := func(fill byte) {
		for _, rel := range []string{manifest, record} {
			rewriteAtStamp(t, filepath.Join(r.dir, rel), fill)
			r.src.Changed(filepath.Join(r.dir, rel))
		}
	}

	// A snapshot fails after taking the names (a named path it cannot
	// stat: under a file).
	rewriteNamed('a')
	r.src.Changed(filepath.Join(r.dir, other, "under-a-file"))
	r.src.snapMu.Lock()
	r.src.mu.Lock()
	latest := r.src.latest
	r.src.mu.Unlock()
	_, err := r.src.takeSnapshot(latest, true)
	r.src.snapMu.Unlock()
	if err == nil {
		t.Fatal("a snapshot walking a path under a file did not fail")
	}
	r.snapshot(true, false)
	r.ship(r.fs[0]) // checks the follower holds the disk as the snapshot saw it

	// More names than kept, in both parts.
	rewriteNamed('b')
	for i := range maxNamed + 1 {
		r.src.Changed(filepath.Join(r.dir, "store", fmt.Sprintf("gone-%d", i), "MANIFEST.json"))
		r.src.Changed(filepath.Join(r.dir, "ars", fmt.Sprintf("gone-%d", i)))
	}
	r.snapshot(true, false)
	r.ship(r.fs[0])

	// Named in the safety net's whole walk.
	rewriteNamed('c')
	r.snapshot(true, true)
	r.ship(r.fs[0])

	// Named in a snapshot the follower has not shipped when the next is
	// the safety net's.
	rewriteNamed('d')
	r.snapshot(true, false)
	r.snapshot(true, true)
	r.ship(r.fs[0])
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestAppendedContentsKeptAreBounded: the contents a Source keeps for
// appended files' next reads stay within their bound (Source.tailsMax);
// a file that does not fit is read whole at every append, and still
// reaches the followers exact.
func TestAppendedContentsKeptAreBounded(t *testing.T) {
	r := newDeltaRig(t, 1)
	r.src.tailsMax = 4 << 10
	small, big := filepath.Join("reducer", "a", "journal.log"), filepath.Join("reducer", "b", "journal.log")
	for rel, n := range map[string]int{small: 512, big: 8 << 10} {
		path := filepath.Join(r.dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, bytes.Repeat([]byte{1}, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.snapshot(true, false)
	r.fs[0].appends = true
	r.join(r.fs[0])
	r.appendTo(small, 10)
	r.appendTo(big, 10)
	r.snapshot(true, false) // both whole: nothing kept yet
	for i := range 5 {
		before := r.src.mutableRead.Load()
		r.appendTo(small, 10)
		r.appendTo(big, 10)
		r.snapshot(true, false)
		r.ship(r.fs[0])
		fi, err := os.Stat(filepath.Join(r.dir, big))
		if err != nil {
			t.Fatal(err)
		}
		if n, want := r.src.mutableRead.Load()-before, uint64(10+fi.Size()); n != want {
			t.Fatalf("append %d: read %d bytes, want %d (the small file's new bytes, the big one whole)", i, n, want)
		}
		r.src.snapMu.Lock()
		kept, held := r.src.tailBytes, len(r.src.tails)
		r.src.snapMu.Unlock()
		if kept > r.src.tailsMax || held != 1 {
			t.Fatalf("append %d: %d contents kept, %d bytes; want the small one within %d", i, held, kept, r.src.tailsMax)
		}
	}
}

// TestFullSyncSendsTheTermsFilesToAStandbyNewToIt: a full sync keeps an
// immutable file the standby holds at the primary's size only when the
// primary did not write it in its own term, or the standby already took
// a unit of that term. A standby that followed the primary before may
// hold a version (or an optimizer state) of a step that primary
// committed, shipped to it alone and died before anyone acknowledged;
// the new term makes that version again from other gradients, at the
// same name and size. Kept by size, the standby held the old bytes
// under the new term's manifest. The term's files are told by their
// stamps against the files present when the term began, not by a clock:
// one written in the term with an mtime an hour before it (a wall clock
// stepped back) is the term's too. And a standby whose copy is of
// another lineage than the primary's — it led a term the primary's copy
// never followed (and may have made a version of the same name there),
// or it missed one — keeps nothing.
func TestFullSyncSendsTheTermsFilesToAStandbyNewToIt(t *testing.T) {
	r := newDeltaRig(t, 0)
	older := filepath.Join("store", "m", "v1.safetensors")   // replicated before this term
	redone := filepath.Join("store", "m", "v2.safetensors")  // present then, written again in this term
	made := filepath.Join("store", "m", "v3.safetensors")    // written in this term
	stepped := filepath.Join("store", "m", "v4.safetensors") // the same, under a clock stepped back
	r.write(older)
	r.write(redone)
	// The term begins; its copy descends from term 5.
	src, err := NewSource(SourceConfig{DataDir: r.dir, Epoch: 7, Lineage: 5, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	// redone again at its size, as a new file renamed in (the writers'
	// way): its name and size are as before the term.
	path := filepath.Join(r.dir, redone)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+atomicfile.TmpSuffix, bytes.Repeat([]byte{0xee}, len(b)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+atomicfile.TmpSuffix, path); err != nil {
		t.Fatal(err)
	}
	r.write(made)
	r.write(stepped)
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(r.dir, stepped), hour, hour); err != nil {
		t.Fatal(err)
	}
	all := []string{older, redone, made, stepped}
	have := map[string]int64{}
	for _, rel := range all {
		fi, err := os.Stat(filepath.Join(r.dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		have[rel] = fi.Size()
	}
	for _, tc := range []struct {
		term, led uint64
		kept      []string
	}{
		{5, 0, []string{older}}, // a unit of the lineage's term
		{4, 5, []string{older}}, // it led the lineage's term
		{5, 6, nil},             // it led a term after it, which this copy never followed
		{3, 0, nil},             // it missed the lineage's term
		{0, 0, nil},             // an older build's hello, or no unit yet
		{7, 0, all},             // a unit of this term
	} {
		rec := &recStream{files: map[string][]byte{}}
		kept := keptBy(t, src, &peer{member: "s", term: tc.term, led: tc.led}, have, rec)
		if want := slices.Sorted(slices.Values(tc.kept)); !slices.Equal(kept, want) {
			t.Errorf("a standby whose newest unit is of epoch %d, that led %d (the primary's term %d, lineage %d): kept %v, want %v",
				tc.term, tc.led, src.cfg.Epoch, src.cfg.Lineage, kept, want)
		}
		for _, rel := range all {
			if _, sent := rec.files[rel]; sent == slices.Contains(tc.kept, rel) {
				t.Errorf("epoch %d, led %d: %s sent %v, want it kept %v", tc.term, tc.led, rel, sent, slices.Contains(tc.kept, rel))
			}
		}
	}
}

// keptBy sends p a full sync over rec and returns the files it kept
// (keep frames), sorted.
func keptBy(t *testing.T, s *Source, p *peer, have map[string]int64, rec *recStream) []string {
	t.Helper()
	kept := &keepRecorder{recStream: rec}
	if _, err := s.sendCut(kept, p, 0, true, map[string]stamp{}, have, true); err != nil {
		t.Fatal(err)
	}
	slices.Sort(kept.kept)
	return kept.kept
}

// keepRecorder is a recStream that takes keep frames (a full sync
// against an inventory) and records them.
type keepRecorder struct {
	*recStream
	kept []string
}

func (k *keepRecorder) SendMsg(m any) error {
	if b, ok := m.(*wrapperspb.BytesValue); ok && k.left == 0 && len(b.Value) > 0 && b.Value[0] == kindKeep {
		rel, _, err := parsePath(kindKeep, b.Value[1:])
		if err != nil {
			return err
		}
		k.kept = append(k.kept, rel)
		return nil
	}
	return k.recStream.SendMsg(m)
}

// TestFirstSnapshotNamesEveryMutableFile: a follower whose full sync (its
// own cut) came before the term's first snapshot, and a manifest and a
// state record rewritten between the two at a recurring stamp and named.
// The first snapshot took the names and shipped its files by stamp alone:
// the follower kept the old bytes. (Found by an audit, 2026-12-05.)
func TestFirstSnapshotNamesEveryMutableFile(t *testing.T) {
	r := newDeltaRig(t, 1)
	manifest := filepath.Join("store", "m", "MANIFEST.json")
	state := filepath.Join("reducer", "m", "registration.json")
	r.write(manifest)
	r.write(state)
	f := r.fs[0]
	r.join(f) // its full sync, before any snapshot
	if err := r.src.CommitModel("m", func() error { rewriteAtStamp(t, filepath.Join(r.dir, manifest), 0xab); return nil }); err != nil {
		t.Fatal(err)
	}
	rewriteAtStamp(t, filepath.Join(r.dir, state), 0xcd)
	r.src.Changed(state)
	r.snapshot(true, false) // the term's first (a publish's)
	r.ship(f)               // f must hold the disk as of it
}
