package store_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

func statOf(t *testing.T, f *os.File) *syscall.Stat_t {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// versionInodes maps the inode of each version file of model m in dir to
// its version file's name.
func versionInodes(t *testing.T, dir, m string) map[uint64]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, store.ModelDir(m), "v*.safetensors"))
	out := map[uint64]string{}
	for _, p := range files {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		out[fi.Sys().(*syscall.Stat_t).Ino] = filepath.Base(p)
	}
	return out
}

// A version the store drops is not unlinked but kept as a spare, and a
// later version is written into its inode; a restart recovers every
// retained version byte for byte. The test holds the dropped version's
// file open: unlinked, its link count would be 0.
func TestFileReusesTheInodesOfDroppedVersions(t *testing.T) {
	dir := t.TempDir()
	cfg := store.Config{Retain: 2}
	s := openFile(t, dir, cfg)
	push := func(v uint64) {
		storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 4096)})
	}
	push(1)
	held, err := os.Open(filepath.Join(dir, store.VersionFile("m", 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ino := statOf(t, held).Ino
	manifest, err := os.Open(filepath.Join(dir, store.ModelDir("m"), "MANIFEST.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer manifest.Close()
	push(2)
	push(3) // version 1 dropped
	if n := statOf(t, held).Nlink; n != 1 {
		t.Fatalf("version 1's file, dropped, has %d links: unlinked, not kept as a spare", n)
	}
	// The manifest is not kept: its name repeats, and an inode it had
	// coming back could look unchanged to the replication's walk.
	if n := statOf(t, manifest).Nlink; n != 0 {
		t.Fatalf("the manifest version 1 wrote, replaced, has %d links: kept for reuse", n)
	}
	push(4)
	push(5)
	if name, ok := versionInodes(t, dir, "m")[ino]; !ok {
		t.Fatalf("version 1's inode is no version file after 4 more versions: never reused")
	} else {
		t.Logf("version 1's inode reused as %s", name)
	}
	before := storetest.Capture(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openFile(t, dir, cfg)
	defer s.Close()
	if d := storetest.Capture(t, s).Diff(before); d != "" {
		t.Fatalf("after restart: %s", d)
	}
	for v := uint64(4); v <= 5; v++ {
		got, err := os.ReadFile(filepath.Join(dir, store.VersionFile("m", v)))
		if err != nil || !bytes.Equal(got, storetest.Blob(t, v, 4096)) {
			t.Fatalf("version %d on disk: %d bytes, %v; not the blob pushed", v, len(got), err)
		}
	}
}

// A reader holding a shared lock on a version's file (what the
// replication stream does with a file it reads after the freeze) keeps
// its bytes however many versions follow: the pool writes no spare a
// reader holds.
func TestFileNeverRewritesAVersionAReaderHolds(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{Retain: 1})
	defer s.Close()
	want := storetest.Blob(t, 1, 4096)
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: want})
	held, err := os.Open(filepath.Join(dir, store.VersionFile("m", 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := atomicfile.LockShared(held); err != nil {
		t.Fatal(err)
	}
	ino := statOf(t, held).Ino
	for v := uint64(2); v <= 3*atomicfile.MaxSpares; v++ {
		storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 4096)})
		if name, ok := versionInodes(t, dir, "m")[ino]; ok {
			t.Fatalf("version 1's inode, locked by a reader, was written as %s", name)
		}
	}
	got, err := io.ReadAll(held)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the held version 1 changed under its reader (%d bytes)", len(got))
	}
}

// BenchmarkFilePushInodes: consecutive 1 MiB versions pushed into the
// file store (Retain 3: each push also drops a version and replaces the
// manifest), with the pool of spares and, in the same run, without it
// (NoSpares: every file new, every dropped one unlinked). cpu_us/push is
// this process's user+system CPU per push (the store's fsyncs included).
func BenchmarkFilePushInodes(b *testing.B) {
	blob := storetest.Blob(b, 1, 1<<20/4)
	for _, spares := range []bool{false, true} {
		b.Run(fmt.Sprintf("size=1MiB/spares=%v", spares), func(b *testing.B) {
			s := openFile(b, b.TempDir(), store.Config{Retain: 3})
			defer s.Close()
			if !spares {
				store.NoSpares(s)
			}
			ctx := context.Background()
			if _, err := s.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(blob)))
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				v := uint64(i) + 2
				if _, err := s.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blob}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu_us/push")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
