//go:build linux

package wsync

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

// shmPath returns a fresh segment path in /dev/shm, removed after the test.
func shmPath(t testing.TB) string {
	t.Helper()
	dir := "/dev/shm"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, fmt.Sprintf("rlhub-wsync-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")))
	os.Remove(p)
	t.Cleanup(func() { os.Remove(p) })
	return p
}

func TestShmRoundTripAndRules(t *testing.T) {
	ctx := context.Background()
	path := shmPath(t)
	w, err := CreateShm(ShmConfig{Path: path, Name: "m", Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := CreateShm(ShmConfig{Path: path, Name: "m", Capacity: 1}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("second CreateShm = %v, want ErrExists", err)
	}
	r, err := OpenShm(ShmReaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if s, err := r.GetIfNewer(ctx, 0); s != nil || err != nil {
		t.Fatalf("empty segment: %v, %v", s, err)
	}
	if err := w.Publish(ctx, makeSnap(t, "m", 1, 100)); err != nil {
		t.Fatal(err)
	}
	s, err := r.GetIfNewer(ctx, 0)
	if err != nil || s == nil {
		t.Fatalf("GetIfNewer: %v, %v", s, err)
	}
	if err := checkSnap(s); err != nil {
		t.Fatal(err)
	}
	if s, _ := r.GetIfNewer(ctx, 1); s != nil {
		t.Fatal("GetIfNewer returned the version the reader has")
	}

	var se *errs.StaleError
	if err := w.Publish(ctx, makeSnap(t, "m", 1, 100)); !errors.As(err, &se) {
		t.Fatalf("republish = %v, want StaleError", err)
	}
	if err := w.Publish(ctx, makeSnap(t, "m", 2, 20<<10)); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("oversized = %v, want ErrFull", err)
	}
	if err := w.Publish(ctx, makeSnap(t, "x", 2, 1)); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("other model = %v, want ErrInvalid", err)
	}
	if r.Published() != 1 {
		t.Fatalf("refused writes changed the segment: published %d", r.Published())
	}

	// A waiter is woken by the next publish.
	got := make(chan *store.Snapshot, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := r.WaitNewer(wctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	if err := w.Publish(ctx, makeSnap(t, "m", 5, 100)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if s := <-got; s == nil || s.Version != 5 || checkSnap(s) != nil {
		t.Fatalf("WaitNewer got %+v", s)
	}

	// The writer closes: the reader learns it is gone.
	w.Close()
	w.Close()
	if _, err := r.WaitNewer(ctx, 5); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("WaitNewer after writer Close = %v, want ErrUnavailable", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment file left behind: %v", err)
	}
}

// A slot caught mid-write (odd seq) is never read: the reader gets the
// previous whole version instead.
func TestShmReaderSkipsSlotBeingWritten(t *testing.T) {
	ctx := context.Background()
	path := shmPath(t)
	w, err := CreateShm(ShmConfig{Path: path, Name: "m", Capacity: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for v := uint64(1); v <= 2; v++ {
		if err := w.Publish(ctx, makeSnap(t, "m", v, 64)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := OpenShm(ShmReaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Version 2 went to slot 1. Make it look half-written: odd seq, and
	// scribble on its bytes.
	slot := w.mem[w.geo.slotOff(1):]
	seq := u64(slot, slotSeq)
	seq.Add(1)
	slot[shmPage+200] ^= 0xff
	s, err := r.GetIfNewer(ctx, 0)
	if err != nil || s == nil || s.Version != 1 || checkSnap(s) != nil {
		t.Fatalf("with slot 1 mid-write got %v (err %v), want whole version 1", s, err)
	}
	if s, _ := r.GetIfNewer(ctx, 1); s != nil {
		t.Fatalf("returned v%d from a slot being written", s.Version)
	}
	// "Finished" with the scribble still there: a verifying reader's CRC
	// catches it; a default reader (seqlock only) does not check bytes.
	seq.Add(1)
	vr, err := OpenShm(ShmReaderConfig{Path: path, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer vr.Close()
	if _, err := vr.GetIfNewer(ctx, 1); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("corrupt slot = %v, want CRC ErrInvalid", err)
	}
	if s, err := r.GetIfNewer(ctx, 1); seqlockAlone && (err != nil || s == nil || s.Version != 2) {
		t.Fatalf("default reader on the finished slot: %v, %v; want v2 unverified", s, err)
	}
}

func TestOpenShmRejectsBadSegments(t *testing.T) {
	path := shmPath(t)
	if _, err := OpenShm(ShmReaderConfig{Path: path}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing = %v, want ErrNotFound", err)
	}
	w, err := CreateShm(ShmConfig{Path: path, Name: "m", Capacity: 4096})
	if err != nil {
		t.Fatal(err)
	}
	good := append([]byte(nil), w.mem...)
	w.Close()
	for _, tc := range []struct {
		name  string
		mutil func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:100] }},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }},
		{"layout", func(b []byte) []byte { b[offLayout] = 9; return b }},
		{"slots", func(b []byte) []byte { b[offSlots] = 1; return b }},
		{"capacity", func(b []byte) []byte { b[offCapacity] = 1; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-shmPage] }},
		{"name", func(b []byte) []byte { b[offNameLen+1] = 9; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mutil(append([]byte(nil), good...))
			p := shmPath(t)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := OpenShm(ShmReaderConfig{Path: p}); !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("OpenShm = %v, want ErrInvalid", err)
			}
		})
	}
	for _, cfg := range []ShmConfig{{Name: "m", Capacity: 1}, {Path: path, Capacity: 1}, {Path: path, Name: "m"}, {Path: path, Name: "m", Capacity: 1, Slots: 1}} {
		if _, err := CreateShm(cfg); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("CreateShm(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

// Torn-read test parameters: a fixed number of versions written flat out.
const (
	tornVersions   = 1500
	tornWords      = 64 << 10 // 256 KiB per version
	tornGoroutines = 3
	tornProcesses  = 2
	childEnv       = "RLHUB_WSYNC_CHILD"
)

// TestShmTornReads: one writer publishes tornVersions versions as fast as
// it can into a double buffer while reader goroutines and separate reader
// processes read every version they can and check each one word by word
// (and, for half of them, by CRC-32C; the other half rely on the seqlock
// alone); no read may be torn. It runs once with the writer copying on one
// goroutine and once with each version split across 3 copying goroutines.
func TestShmTornReads(t *testing.T) {
	t.Run("serial-writer", func(t *testing.T) { testShmTornReads(t, 1) })
	t.Run("parallel-writer", func(t *testing.T) {
		old := minCopyPart
		minCopyPart = 64 << 10 // split the 256 KiB versions too
		defer func() { minCopyPart = old }()
		testShmTornReads(t, 3)
	})
}

func testShmTornReads(t *testing.T, copyWorkers int) {
	path := shmPath(t)
	w, err := CreateShm(ShmConfig{Path: path, Name: "m", Capacity: 4*tornWords + 4096, CopyWorkers: copyWorkers})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	// Reader processes: this test binary re-executed in child mode.
	type child struct {
		cmd *exec.Cmd
		out *bufio.Scanner
	}
	var children []child
	for i := range tornProcesses {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=shm", "RLHUB_WSYNC_SHM="+path,
			"RLHUB_WSYNC_FINAL="+strconv.Itoa(tornVersions), "RLHUB_WSYNC_VERIFY="+strconv.FormatBool(i%2 == 0))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		children = append(children, child{cmd, sc})
		if !sc.Scan() || sc.Text() != "ready" {
			t.Fatalf("reader process %d did not get ready: %q %v", i, sc.Text(), sc.Err())
		}
	}

	type result struct {
		reads, retries, aborts uint64
		err                    error
	}
	results := make([]result, tornGoroutines)
	var wg sync.WaitGroup
	for g := range tornGoroutines {
		r, err := OpenShm(ShmReaderConfig{Path: path, Verify: g%2 == 0})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			res := &results[g]
			res.reads, res.aborts, res.err = readAll(ctx, r, tornVersions)
			res.retries = r.Stats().Retries
		}()
	}

	for v := uint64(1); v <= tornVersions; v++ {
		snap := makeSnap(t, "m", v, tornWords)
		if err := w.Write(v, 0, snap.Blob); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	for g, res := range results {
		t.Logf("goroutine reader %d (verify=%v): %d versions read whole, %d torn copies retried, %d reads aborted", g, g%2 == 0, res.reads, res.retries, res.aborts)
		if res.err != nil {
			t.Errorf("goroutine reader %d: %v", g, res.err)
		}
	}
	for i, c := range children {
		var lines []string
		for c.out.Scan() {
			lines = append(lines, c.out.Text())
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("reader process %d: %v; output %q", i, err, lines)
			continue
		}
		t.Logf("reader process %d: %s", i, strings.Join(lines, "; "))
	}
}

// readAll reads until it has version final, checking every version read.
// It returns the number of whole versions read and of aborted reads, and
// the first torn or failed read.
func readAll(ctx context.Context, r *ShmReader, final uint64) (reads, aborts uint64, err error) {
	var have uint64
	for have < final {
		s, err := r.WaitNewer(ctx, have)
		if errors.Is(err, errs.ErrAborted) {
			aborts++
			continue
		}
		if err != nil {
			return reads, aborts, fmt.Errorf("after v%d: %w", have, err)
		}
		if err := checkSnap(s); err != nil {
			return reads, aborts, err
		}
		if s.Version <= have {
			return reads, aborts, fmt.Errorf("version went from %d to %d", have, s.Version)
		}
		have = s.Version
		reads++
	}
	return reads, aborts, nil
}

// runChild runs this test binary as a helper process: a shm reader of
// TestShmTornReads or a relay of TestRelayProcessKilled.
func runChild() int {
	if os.Getenv(childEnv) == "relay" {
		return runRelayChild()
	}
	return runShmReaderChild()
}

// runShmReaderChild is a reader process of TestShmTornReads. It prints
// "ready", reads to the final version, prints its counts and exits 0, or
// exits 1 on a torn or failed read.
func runShmReaderChild() int {
	final, _ := strconv.ParseUint(os.Getenv("RLHUB_WSYNC_FINAL"), 10, 64)
	r, err := OpenShm(ShmReaderConfig{Path: os.Getenv("RLHUB_WSYNC_SHM"), Verify: os.Getenv("RLHUB_WSYNC_VERIFY") == "true"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer r.Close()
	fmt.Println("ready")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	reads, aborts, err := readAll(ctx, r, final)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: torn or failed read:", err)
		return 1
	}
	fmt.Printf("%d versions read whole, %d torn copies retried, %d reads aborted, verify=%v\n", reads, r.Stats().Retries, aborts, r.cfg.Verify)
	return 0
}

// TestCopyCRCParallel checks the split copy and the CRC combination against
// a plain copy and crc32.Checksum on random sizes and splits.
func TestCopyCRCParallel(t *testing.T) {
	old := minCopyPart
	minCopyPart = 1 << 10
	defer func() { minCopyPart = old }()
	rng := rand.New(rand.NewPCG(5, 5))
	src := make([]byte, 3*copyChunk+12345)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for _, n := range []int{0, 1, 7, 4096, copyChunk - 1, copyChunk, copyChunk + 1, 2*copyChunk + 5, len(src)} {
		for _, workers := range []int{1, 2, 3, 4, 8, 9} {
			dst := make([]byte, n)
			got := copyCRCParallel(dst, src[:n], workers)
			if want := crc32.Checksum(src[:n], castagnoli); got != want {
				t.Errorf("%d bytes, %d workers: CRC %08x, want %08x", n, workers, got, want)
			}
			if !bytes.Equal(dst, src[:n]) {
				t.Errorf("%d bytes, %d workers: copy differs", n, workers)
			}
		}
	}
	for range 200 {
		a, b := rng.IntN(5000), rng.IntN(70000)
		ca, cb := crc32.Checksum(src[:a], castagnoli), crc32.Checksum(src[a:a+b], castagnoli)
		if got, want := crc32cCombine(ca, cb, b), crc32.Checksum(src[:a+b], castagnoli); got != want {
			t.Fatalf("combine(%d, %d bytes) = %08x, want %08x", a, b, got, want)
		}
	}
}
