//go:build linux

package shm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

func TestShmRoundTripAndRules(t *testing.T) {
	ctx := context.Background()
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := Create(Config{Path: path, Name: "m", Capacity: 1}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("second Create = %v, want ErrExists", err)
	}
	r, err := Open(ReaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if s, err := r.GetIfNewer(ctx, 0); s != nil || err != nil {
		t.Fatalf("empty segment: %v, %v", s, err)
	}
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, 100)); err != nil {
		t.Fatal(err)
	}
	s, err := r.GetIfNewer(ctx, 0)
	if err != nil || s == nil {
		t.Fatalf("GetIfNewer: %v, %v", s, err)
	}
	if err := wsynctest.Check(s); err != nil {
		t.Fatal(err)
	}
	if s, _ := r.GetIfNewer(ctx, 1); s != nil {
		t.Fatal("GetIfNewer returned the version the reader has")
	}

	var se *errs.StaleError
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, 100)); !errors.As(err, &se) {
		t.Fatalf("republish = %v, want StaleError", err)
	}
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 2, 20<<10)); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("oversized = %v, want ErrFull", err)
	}
	if err := w.Publish(ctx, wsynctest.Snap(t, "x", 2, 1)); !errors.Is(err, errs.ErrInvalid) {
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
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 5, 100)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if s := <-got; s == nil || s.Version != 5 || wsynctest.Check(s) != nil {
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
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for v := uint64(1); v <= 2; v++ {
		if err := w.Publish(ctx, wsynctest.Snap(t, "m", v, 64)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Open(ReaderConfig{Path: path})
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
	if err != nil || s == nil || s.Version != 1 || wsynctest.Check(s) != nil {
		t.Fatalf("with slot 1 mid-write got %v (err %v), want whole version 1", s, err)
	}
	if s, _ := r.GetIfNewer(ctx, 1); s != nil {
		t.Fatalf("returned v%d from a slot being written", s.Version)
	}
	// "Finished" with the scribble still there: a verifying reader's CRC
	// catches it; a default reader (seqlock only) does not check bytes.
	seq.Add(1)
	vr, err := Open(ReaderConfig{Path: path, Verify: true})
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
	path := wsynctest.ShmPath(t)
	if _, err := Open(ReaderConfig{Path: path}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing = %v, want ErrNotFound", err)
	}
	w, err := Create(Config{Path: path, Name: "m", Capacity: 4096})
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
		// 2 slots leave no room for a lease: the writer needs one slot
		// for the newest version and one to write.
		{"leases", func(b []byte) []byte { b[offLeases] = 1; return b }},
		{"lease-table", func(b []byte) []byte { b[offLeases] = 113; return b }},
		// A liveness scheme this reader does not know.
		{"liveness", func(b []byte) []byte { b[offLiveness] = 2; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mutil(append([]byte(nil), good...))
			p := wsynctest.ShmPath(t)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := Open(ReaderConfig{Path: p}); !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("Open = %v, want ErrInvalid", err)
			}
		})
	}
	for _, cfg := range []Config{{Name: "m", Capacity: 1}, {Path: path, Capacity: 1}, {Path: path, Name: "m"}, {Path: path, Name: "m", Capacity: 1, Slots: 1}} {
		if _, err := Create(cfg); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("Create(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

// Torn-read test parameters: a fixed number of versions written flat out.
const (
	tornVersions = 1500
	tornWords    = 64 << 10 // 256 KiB per version
	childEnv     = "RLHUB_WSYNC_CHILD"
	// leaseHoldVersions is how many more versions the writer must have
	// published before a leasing reader re-checks the snapshot it holds.
	leaseHoldVersions = 3
)

// tornReader is one reader of TestShmTornReads: whether it verifies CRCs,
// asks for a lease, and whether it must get one (false: it must find the
// lease table full and fall back to copying).
type tornReader struct{ verify, lease, wantLease bool }

// tornSetup is one run of TestShmTornReads.
type tornSetup struct {
	copyWorkers int
	slots       int
	// processes are opened first, in order, then goroutines, so which
	// leasing readers get an entry is fixed.
	processes, goroutines []tornReader
}

// copyReaders is the original mix: 3 reader goroutines and 2 reader
// processes, half of them verifying CRCs, all copying.
var copyReaders = tornSetup{
	slots:      2,
	processes:  []tornReader{{verify: true}, {}},
	goroutines: []tornReader{{verify: true}, {}, {verify: true}},
}

// TestShmTornReads: one writer publishes tornVersions versions as fast as
// it can while reader goroutines and separate reader processes read every
// version they can and check each one word by word (and, for some of them,
// by CRC-32C; the others rely on the seqlock alone); no read may be torn.
// It runs with copying readers on a double buffer, once with the writer
// copying on one goroutine and once with each version split across 3
// copying goroutines (both through the fused copy + CRC kernel, with
// non-temporal stores fenced before each written mark and the commit, which
// the following, verifying readers check); then with leasing readers (3
// lease entries, in 5 slots) next to copying ones: each leasing reader
// holds every snapshot it gets until the writer has published
// leaseHoldVersions more, and checks its bytes and CRC again, which fails
// if the writer ever wrote a leased slot; one more leasing reader than
// there are entries falls back to copying.
func TestShmTornReads(t *testing.T) {
	t.Run("serial-writer", func(t *testing.T) {
		old := ntMin
		ntMin = 0 // copy the small versions with non-temporal stores too
		defer func() { ntMin = old }()
		setup := copyReaders
		setup.copyWorkers = 1
		testShmTornReads(t, setup)
	})
	t.Run("parallel-writer", func(t *testing.T) {
		old, oldFollow, oldNT := minCopyPart, followMin, ntMin
		minCopyPart = 64 << 10 // split the 256 KiB versions too
		followMin = 0          // and follow them (the copying readers' WaitNewer)
		ntMin = 0              // behind non-temporal stores
		defer func() { minCopyPart, followMin, ntMin = old, oldFollow, oldNT }()
		setup := copyReaders
		setup.copyWorkers = 3
		testShmTornReads(t, setup)
	})
	t.Run("leasing-readers", func(t *testing.T) {
		testShmTornReads(t, tornSetup{
			copyWorkers: 1,
			slots:       5,
			processes:   []tornReader{{verify: true, lease: true, wantLease: true}, {}},
			goroutines: []tornReader{
				{verify: true, lease: true, wantLease: true},
				{lease: true, wantLease: true},
				{verify: true, lease: true}, // the table is full: copies
				{},
			},
		})
	})
}

func testShmTornReads(t *testing.T, setup tornSetup) {
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 4*tornWords + 4096, CopyWorkers: setup.copyWorkers, Slots: setup.slots})
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
	for i, rd := range setup.processes {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=shm", "RLHUB_WSYNC_SHM="+path,
			"RLHUB_WSYNC_FINAL="+strconv.Itoa(tornVersions), "RLHUB_WSYNC_VERIFY="+strconv.FormatBool(rd.verify),
			"RLHUB_WSYNC_LEASE="+strconv.FormatBool(rd.lease))
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
		if want := fmt.Sprintf("ready leasing=%v", rd.wantLease); !sc.Scan() || sc.Text() != want {
			t.Fatalf("reader process %d: got %q (%v), want %q", i, sc.Text(), sc.Err(), want)
		}
	}

	type result struct {
		reads, retries, aborts, inPlace, followed uint64
		err                                       error
	}
	results := make([]result, len(setup.goroutines))
	var wg sync.WaitGroup
	for g, rd := range setup.goroutines {
		r, err := Open(ReaderConfig{Path: path, Verify: rd.verify, Lease: rd.lease})
		if err != nil {
			t.Fatal(err)
		}
		if r.Leasing() != rd.wantLease {
			t.Fatalf("goroutine reader %d: Leasing() = %v, want %v", g, r.Leasing(), rd.wantLease)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			res := &results[g]
			res.reads, res.aborts, res.err = readAll(ctx, r, tornVersions)
			res.retries, res.inPlace, res.followed = r.Stats().Retries, r.Stats().InPlace, r.Stats().Followed
		}()
	}

	for v := uint64(1); v <= tornVersions; v++ {
		snap := wsynctest.Snap(t, "m", v, tornWords)
		if err := w.Write(v, 0, snap.Blob); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	for g, res := range results {
		rd := setup.goroutines[g]
		t.Logf("goroutine reader %d (verify=%v lease=%v): %d versions read whole, %d in place, %d followed while written, %d torn copies or lost leases retried, %d reads aborted",
			g, rd.verify, rd.wantLease, res.reads, res.inPlace, res.followed, res.retries, res.aborts)
		if res.err != nil {
			t.Errorf("goroutine reader %d: %v", g, res.err)
		}
		if want := map[bool]uint64{true: res.reads, false: 0}[rd.wantLease]; res.inPlace != want {
			t.Errorf("goroutine reader %d read %d of %d versions in place, want %d", g, res.inPlace, res.reads, want)
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
// A leasing reader also holds each snapshot until the writer has published
// leaseHoldVersions more (or the final one) and checks it again: a slot
// the writer wrote while leased shows up as changed bytes or CRC. It
// returns the number of whole versions read and of aborted reads, and the
// first torn or failed read.
func readAll(ctx context.Context, r *Reader, final uint64) (reads, aborts uint64, err error) {
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
		if err := wsynctest.Check(s); err != nil {
			return reads, aborts, err
		}
		if s.Version <= have {
			return reads, aborts, fmt.Errorf("version went from %d to %d", have, s.Version)
		}
		if r.Leasing() {
			if err := holdLeased(ctx, r, s, min(s.Version+leaseHoldVersions, final)); err != nil {
				return reads, aborts, err
			}
		}
		have = s.Version
		reads++
	}
	return reads, aborts, nil
}

// holdLeased keeps the leased snapshot s while the writer publishes up to
// version `until`, then checks that its bytes are still version s's.
func holdLeased(ctx context.Context, r *Reader, s *store.Snapshot, until uint64) error {
	crc := crc32.Checksum(s.Blob, castagnoli)
	for r.Published() < until {
		if ctx.Err() != nil {
			return fmt.Errorf("holding v%d until v%d is published: %w", s.Version, until, ctx.Err())
		}
		time.Sleep(20 * time.Microsecond)
	}
	if got := crc32.Checksum(s.Blob, castagnoli); got != crc {
		return fmt.Errorf("leased version %d changed while held: CRC-32C %08x, was %08x (the writer wrote a leased slot)", s.Version, got, crc)
	}
	if err := wsynctest.Check(s); err != nil {
		return fmt.Errorf("leased version %d changed while held: %w", s.Version, err)
	}
	return nil
}

// runChild runs this test binary as a helper process: a shm reader of
// TestShmTornReads or a lease holder of TestShmLeaseOfDeadReader.
func runChild() int {
	switch os.Getenv(childEnv) {
	case "shm-lease-hold":
		return runLeaseHolderChild()
	case "shm-ns-writer":
		return runNsWriterChild()
	}
	return runShmReaderChild()
}

// runShmReaderChild is a reader process of TestShmTornReads. It prints
// "ready leasing=<bool>", reads to the final version, prints its counts
// and exits 0, or exits 1 on a torn or failed read.
func runShmReaderChild() int {
	final, _ := strconv.ParseUint(os.Getenv("RLHUB_WSYNC_FINAL"), 10, 64)
	r, err := Open(ReaderConfig{Path: os.Getenv("RLHUB_WSYNC_SHM"), Verify: os.Getenv("RLHUB_WSYNC_VERIFY") == "true",
		Lease: os.Getenv("RLHUB_WSYNC_LEASE") == "true"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer r.Close()
	fmt.Printf("ready leasing=%v\n", r.Leasing())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	reads, aborts, err := readAll(ctx, r, final)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: torn or failed read:", err)
		return 1
	}
	fmt.Printf("%d versions read whole (%d in place), %d torn copies or lost leases retried, %d reads aborted, verify=%v lease=%v\n",
		reads, r.Stats().InPlace, r.Stats().Retries, aborts, r.cfg.Verify, r.Leasing())
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
			got := copyCRCParallel(dst, src[:n], workers, nil)
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
