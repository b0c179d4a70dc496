package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

func openFile(t testing.TB, dir string, cfg store.Config) *store.File {
	t.Helper()
	f, err := store.OpenFile(store.FileConfig{Dir: dir, Store: cfg, Logger: testkit.Logger()})
	if err != nil {
		t.Fatalf("OpenFile(%s): %v", dir, err)
	}
	return f
}

func TestFile(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg store.Config) store.Store {
		return openFile(t, t.TempDir(), cfg)
	})
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestFileRestartRecovers(t *testing.T) {
	dir := t.TempDir()
	cfg := store.Config{Retain: 2}
	s := openFile(t, dir, cfg)
	for v := uint64(1); v <= 5; v++ {
		storetest.MustPush(t, s, store.PushRequest{Name: "team/policy", Version: v, Expect: v - 1, Epoch: v / 2, Blob: storetest.Blob(t, v, 64)})
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "value", Version: 7, Expect: 0, Epoch: 9, Blob: storetest.Blob(t, 70, 8)})
	before := storetest.Capture(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openFile(t, dir, cfg)
	defer s.Close()
	if d := storetest.Capture(t, s).Diff(before); d != "" {
		t.Fatalf("after restart: %s", d)
	}
	// The rules continue where they were: epoch fence, CAS, Seq.
	_, err := s.Push(bg(t), store.PushRequest{Name: "value", Version: 8, Expect: 7, Epoch: 8, Blob: storetest.Blob(t, 80, 8)})
	var se *errs.StaleError
	if !errors.As(err, &se) || se.CurrentVersion != 7 || se.CurrentEpoch != 9 {
		t.Fatalf("old-epoch push after restart = %v, want stale at v7 e9", err)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "team/policy", Version: 6, Expect: 5, Epoch: 2, Blob: storetest.Blob(t, 6, 64)})
	snap, err := s.Get(bg(t), "team/policy", 0)
	if err != nil || snap.Seq != 6 {
		t.Fatalf("Seq after restart = %v, %v; want 6", snap, err)
	}
	// Only the retained versions stay on disk.
	files, _ := filepath.Glob(filepath.Join(dir, "team%2Fpolicy", "*"))
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"MANIFEST.json", "v00000000000000000005.safetensors", "v00000000000000000006.safetensors"}
	if !slices.Equal(names, want) {
		t.Errorf("files on disk %v, want %v", names, want)
	}
}

func TestFileRestartWithSmallerRetain(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{Retain: 4})
	for v := uint64(1); v <= 4; v++ {
		storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 8)})
	}
	s.Close()
	s = openFile(t, dir, store.Config{Retain: 1})
	defer s.Close()
	infos, err := s.List(bg(t))
	if err != nil || len(infos) != 1 || fmt.Sprint(infos[0].Retained) != "[4]" {
		t.Fatalf("List = %v, %v; want m retaining [4]", infos, err)
	}
}

func TestFileDirectoryLocked(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{})
	if _, err := store.OpenFile(store.FileConfig{Dir: dir, Logger: testkit.Logger()}); err == nil {
		t.Fatal("second OpenFile of a directory in use succeeded")
	}
	s.Close()
	s = openFile(t, dir, store.Config{}) // released by Close
	s.Close()
}

func TestFileCorruptionFailsOpen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, modelDir string)
	}{
		{"manifest not JSON", func(t *testing.T, d string) { write(t, filepath.Join(d, "MANIFEST.json"), []byte("{nope")) }},
		{"blob bit flip", func(t *testing.T, d string) {
			p := filepath.Join(d, "v00000000000000000001.safetensors")
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1
			write(t, p, b)
		}},
		{"blob truncated", func(t *testing.T, d string) {
			p := filepath.Join(d, "v00000000000000000001.safetensors")
			b, _ := os.ReadFile(p)
			write(t, p, b[:len(b)-4])
		}},
		{"blob missing", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "v00000000000000000001.safetensors")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openFile(t, dir, store.Config{})
			storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 8)})
			s.Close()
			md := filepath.Join(dir, "m")
			if bad, err := store.VerifyModelDir(md); err != nil || len(bad) != 0 {
				t.Fatalf("VerifyModelDir before the damage: %v %v", bad, err)
			}
			tc.damage(t, md)
			if s, err := store.OpenFile(store.FileConfig{Dir: dir, Logger: testkit.Logger()}); err == nil {
				s.Close()
				t.Fatal("OpenFile over a damaged checkpoint succeeded")
			}
			// The standby's scrub finds the same damage without opening.
			bad, err := store.VerifyModelDir(md)
			if strings.HasPrefix(tc.name, "manifest") {
				if err == nil {
					t.Fatalf("VerifyModelDir over a damaged manifest: %v, want an error", bad)
				}
			} else if err != nil || bad["v00000000000000000001.safetensors"] == nil || len(bad) != 1 {
				t.Fatalf("VerifyModelDir = %v %v, want version 1's file failing", bad, err)
			}
		})
	}
	if _, err := store.VerifyModelDir(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("VerifyModelDir of a directory without a manifest: %v, want ErrNotExist", err)
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The kill -9 test. The child (this test binary re-executed, dispatched in
// TestMain) opens the store in a directory and pushes consecutive versions
// of a 4 MiB model, printing "pushed V" after each push returns. In
// "stage" mode its checkpoint hook prints "at STAGE" and hangs at the named
// point of the next push's write; the parent then kills it with SIGKILL,
// reopens the directory and checks that the store holds the last committed
// version, byte for byte, with the debris gone.

const (
	crashChildEnv = "RLHUB_STORE_CRASH_CHILD" // directory
	crashStageEnv = "RLHUB_STORE_CRASH_STAGE" // stage to hang at, or "" to loop
	crashFloats   = 1 << 20
)

func crashChild() {
	dir, stage := os.Getenv(crashChildEnv), os.Getenv(crashStageEnv)
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	var pushing uint64
	var start uint64
	cfg := store.FileConfig{Dir: dir, Store: store.Config{Retain: 2}, Logger: testkit.Logger()}
	store.SetFileHook(&cfg, func(s string) {
		if s == stage && (pushing == start+2 || strings.HasPrefix(s, "delete")) {
			say("at %s", s)
			select {} // hang here until killed
		}
	})
	s, err := store.OpenFile(cfg)
	if err != nil {
		say("error %v", err)
		os.Exit(2)
	}
	if snap, err := s.Get(context.Background(), "crash", 0); err == nil {
		start = snap.Version
	}
	if strings.HasPrefix(stage, "delete") {
		// Delete mode: one model, claimed, then deleted; the hook hangs
		// after the rename that commits the delete.
		if _, err := s.Push(context.Background(), store.PushRequest{Name: "doomed", Version: 1, Blob: storetest.Blob(nopTB{}, 1, 4)}); err != nil {
			say("error %v", err)
			os.Exit(2)
		}
		if err := s.Claim(context.Background(), "doomed", "reducer"); err != nil {
			say("error %v", err)
			os.Exit(2)
		}
		say("pushed 1")
		err := s.Delete(context.Background(), "doomed")
		say("error delete returned %v", err)
		os.Exit(2)
	}
	for pushing = start + 1; ; pushing++ {
		blob := storetest.Blob(nopTB{}, pushing, crashFloats)
		if _, err := s.Push(context.Background(), store.PushRequest{Name: "crash", Version: pushing, Expect: pushing - 1, Blob: blob}); err != nil {
			say("error %v", err)
			os.Exit(2)
		}
		say("pushed %d", pushing)
	}
}

// nopTB satisfies testing.TB for storetest.Blob in the child, which has no
// *testing.T; Blob only fails on impossible encoding errors.
type nopTB struct{ testing.TB }

func (nopTB) Helper()                   {}
func (nopTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (nopTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// runChild starts the child and returns its output lines; kill stops it.
func runChild(t *testing.T, dir, stage string) (lines <-chan string, kill func()) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashStageEnv+"="+stage)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1024)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ch)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ch <- sc.Text()
		}
	})
	var once sync.Once
	kill = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGKILL)
			wg.Wait()
			cmd.Wait()
		})
	}
	t.Cleanup(kill)
	return ch, kill
}

// await reads lines until one starts with prefix, returning the last
// "pushed" version seen.
func await(t *testing.T, lines <-chan string, prefix string, lastPushed *uint64) {
	t.Helper()
	timeout := time.NewTimer(60 * time.Second) // a hang guard, not a measurement
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited before %q", prefix)
			}
			if v, found := strings.CutPrefix(l, "pushed "); found {
				*lastPushed, _ = strconv.ParseUint(v, 10, 64)
			}
			if strings.HasPrefix(l, "error") {
				t.Fatalf("child: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout.C:
			t.Fatalf("child never printed %q", prefix)
		}
	}
}

func checkRecovered(t *testing.T, dir string, want ...uint64) uint64 {
	t.Helper()
	s := openFile(t, dir, store.Config{Retain: 2})
	defer s.Close()
	snap, err := s.Get(bg(t), "crash", 0)
	if err != nil {
		t.Fatalf("after kill -9: %v", err)
	}
	if !slices.Contains(want, snap.Version) {
		t.Fatalf("after kill -9 the store is at version %d, want one of %v", snap.Version, want)
	}
	if !bytes.Equal(snap.Blob, storetest.Blob(t, snap.Version, crashFloats)) {
		t.Fatalf("after kill -9 version %d's bytes are torn", snap.Version)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "crash", "*"))
	if len(files) > 3 { // manifest + Retain blobs
		t.Errorf("debris left after recovery: %v", files)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".tmp") {
			t.Errorf("temp file left after recovery: %s", f)
		}
	}
	return snap.Version
}

func TestFileKill9MidCheckpoint(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		stage     string
		committed bool // the interrupted push had committed
	}{
		{"blob-partial", false},
		{"blob-renamed", false},
		{"manifest-partial", false},
		{"manifest-renamed", true},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			lines, kill := runChild(t, dir, tc.stage)
			var last uint64
			await(t, lines, "at "+tc.stage, &last)
			kill()
			want := last
			if tc.committed {
				want = last + 1
			}
			checkRecovered(t, dir, want)
		})
	}
	// Kills at arbitrary points of a push loop: the store is at the last
	// version the child reported or, if the kill landed after the commit
	// but before the report, the next one.
	t.Run("loop", func(t *testing.T) {
		for range 2 {
			lines, kill := runChild(t, dir, "")
			var last uint64
			await(t, lines, "pushed", &last)
			await(t, lines, "pushed", &last)
			kill()
			for l := range lines { // drain what it printed before dying
				if v, ok := strings.CutPrefix(l, "pushed "); ok {
					last, _ = strconv.ParseUint(v, 10, 64)
				}
			}
			checkRecovered(t, dir, last, last+1)
		}
	})
}

// TestFileKill9MidDelete: a Delete killed after its commit (the rename of
// the model's directory) leaves the model gone and its files removed at the
// next start; the owner recorded by Claim survived restarts until then.
func TestFileKill9MidDelete(t *testing.T) {
	dir := t.TempDir()
	lines, kill := runChild(t, dir, "delete-renamed")
	var last uint64
	await(t, lines, "at delete-renamed", &last)
	kill()
	s := openFile(t, dir, store.Config{})
	defer s.Close()
	if _, err := s.Get(bg(t), "doomed", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("after a kill mid-delete: Get = %v, want ErrNotFound", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "LOCK" && e.Name() != ".spare" { // the pool of spares, made at open
			t.Errorf("left on disk after recovery: %s", e.Name())
		}
	}
	// A fresh model of that name takes anyone's push: the owner went too.
	if _, err := s.Push(bg(t), store.PushRequest{Name: "doomed", Version: 1, Blob: storetest.Blob(t, 1, 4)}); err != nil {
		t.Fatal(err)
	}
}

// TestFileOwnerAndDeleteSurviveRestart: owners are in the manifest, a
// claim of a model never pushed included, and a Delete is on disk.
func TestFileOwnerAndDeleteSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{})
	storetest.MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 4)})
	storetest.MustPush(t, s, store.PushRequest{Name: "gone", Version: 1, Blob: storetest.Blob(t, 1, 4)})
	if err := s.Claim(bg(t), "m", "reducer"); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim(bg(t), "reserved", "ars"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(bg(t), "gone"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openFile(t, dir, store.Config{})
	defer s.Close()
	for name, owner := range map[string]string{"m": "reducer", "reserved": "ars"} {
		_, err := s.Push(bg(t), store.PushRequest{Name: name, Version: 2, Expect: store.ExpectAny, Blob: storetest.Blob(t, 2, 4)})
		if !errors.Is(err, errs.ErrPermission) {
			t.Fatalf("after restart an anonymous push to %s (owned by %s): %v", name, owner, err)
		}
		if _, err := s.Push(bg(t), store.PushRequest{Name: name, Version: 2, Expect: store.ExpectAny, Owner: owner, Blob: storetest.Blob(t, 2, 4)}); err != nil {
			t.Fatalf("after restart %s's push to %s: %v", owner, name, err)
		}
	}
	if _, err := s.Get(bg(t), "gone", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("deleted model after restart: %v", err)
	}
}

// TestReleasedClaimOfAModelNeverPushedLeavesTheStoreOpenable: a claim
// given up on a model that never had a version left a manifest with no
// versions and no owner, which the next open refused — the whole store,
// and on a cluster every standby it replicated to. It is nothing now: the
// store opens without it, and the name can be pushed and claimed again.
func TestReleasedClaimOfAModelNeverPushedLeavesTheStoreOpenable(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{})
	if err := s.Claim(bg(t), "m", "reducer"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bg(t), "m", "reducer"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openFile(t, dir, store.Config{})
	defer s.Close()
	if infos, err := s.List(bg(t)); err != nil || len(infos) != 0 {
		t.Fatalf("models after the released claim and a reopen: %v, %v", infos, err)
	}
	if err := s.Claim(bg(t), "m", "other"); err != nil {
		t.Fatalf("claim again: %v", err)
	}
	if _, err := s.Push(bg(t), store.PushRequest{Name: "m", Version: 1, Owner: "other", Blob: storetest.Blob(t, 1, 8)}); err != nil {
		t.Fatalf("push after: %v", err)
	}
}

// TestTightenedNameRulesKeepExistingModels: a store reopened with a
// tighter --max-name-bytes (or --name-pattern) than a model it holds was
// made under used to refuse to open at all ("does not belong in this
// directory"), so the hub did not start. The rules bound new models'
// names; a model the store holds stays readable, writable and deletable.
func TestTightenedNameRulesKeepExistingModels(t *testing.T) {
	dir := t.TempDir()
	s := openFile(t, dir, store.Config{})
	storetest.MustPush(t, s, store.PushRequest{Name: "team/policy", Version: 1, Blob: storetest.Blob(t, 1, 8)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openFile(t, dir, store.Config{MaxNameBytes: 8})
	defer s.Close()
	ctx := bg(t)
	if snap, err := s.Get(ctx, "team/policy", 0); err != nil || snap.Version != 1 {
		t.Fatalf("Get after reopening: %v %v", snap, err)
	}
	storetest.MustPush(t, s, store.PushRequest{Name: "team/policy", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 8)})
	if _, err := s.Push(ctx, store.PushRequest{Name: "team/other", Version: 1, Blob: storetest.Blob(t, 3, 8)}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("a new model breaking the rules: %v, want ErrInvalid", err)
	}
	if err := s.Delete(ctx, "team/policy"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.Push(ctx, store.PushRequest{Name: "team/policy", Version: 3, Blob: storetest.Blob(t, 4, 8)}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("the deleted model made again: %v, want ErrInvalid (it is new now)", err)
	}
}
