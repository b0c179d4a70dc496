//go:build linux

package shm

import (
	"bufio"
	"context"
	"fmt"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
)

// leaseSegment creates a segment of model "m" with 64 KiB slots, closed
// when the test ends.
func leaseSegment(t *testing.T, slots int) (*Writer, string) {
	t.Helper()
	path := wsynctest.ShmPath(t)
	w, err := Create(Config{Path: path, Name: "m", Capacity: 64 << 10, Slots: slots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, path
}

// publishRange publishes versions from..to of model "m", n floats each.
func publishRange(t *testing.T, w *Writer, from, to uint64, n int) {
	t.Helper()
	for v := from; v <= to; v++ {
		if err := w.Publish(context.Background(), wsynctest.Snap(t, "m", v, n)); err != nil {
			t.Fatalf("publish v%d: %v", v, err)
		}
	}
}

// slotOf returns the slot holding version v in the writer's segment, or -1.
func slotOf(w *Writer, v uint64) int {
	for i := range w.geo.slots {
		slot := w.slot(i)
		if s := u64(slot, slotSeq).Load(); s != 0 && s%2 == 0 && u64(slot, slotVersion).Load() == v {
			return i
		}
	}
	return -1
}

// A leasing reader returns versions in place, read-only; the writer keeps
// writing around the leased slot, so the held snapshot never changes; the
// lease moves only when a newer version is returned; Close frees the entry.
func TestShmLeaseReadsInPlace(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 3)
	r, err := Open(ReaderConfig{Path: path, Lease: true, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Leasing() {
		t.Fatal("a reader of a 3-slot segment with a free entry does not lease")
	}
	publishRange(t, w, 1, 1, 1000)
	s1, err := r.GetIfNewer(ctx, 0)
	if err != nil || s1 == nil || s1.Version != 1 {
		t.Fatalf("GetIfNewer = %v, %v", s1, err)
	}
	if !r.InMapping(s1.Blob) || !r.InMapping(s1.Tensors.Get("w").Data) {
		t.Fatal("a leased snapshot's blob or tensor is not a view of the segment")
	}
	leasedSlot := slotOf(w, 1)
	if got := u64(w.mem, leaseOff(0)+leaseSlot).Load(); got != uint64(leasedSlot)+1 {
		t.Fatalf("lease entry names slot %d-1, want %d (which holds v1)", got, leasedSlot)
	}

	// With one slot leased and one holding the newest, the writer has one
	// slot left: it writes every version there, and never the leased one.
	publishRange(t, w, 2, 12, 1000)
	if err := wsynctest.Check(s1); err != nil {
		t.Fatalf("the leased v1 changed while the writer published 11 more: %v", err)
	}
	if slotOf(w, 1) != leasedSlot {
		t.Fatal("the leased slot no longer holds v1")
	}
	// Nothing newer: the lease stays put.
	if s, err := r.GetIfNewer(ctx, 12); s != nil || err != nil {
		t.Fatalf("GetIfNewer(12) = %v, %v", s, err)
	}
	if err := wsynctest.Check(s1); err != nil {
		t.Fatalf("a call that found nothing newer released v1: %v", err)
	}

	// The leased memory is read-only: a write faults.
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if recover() == nil {
				t.Error("writing to a leased snapshot did not fault")
			}
		}()
		s1.Blob[len(s1.Blob)-1] ^= 1
	}()

	s12, err := r.GetIfNewer(ctx, 1)
	if err != nil || s12 == nil || s12.Version != 12 || wsynctest.Check(s12) != nil {
		t.Fatalf("GetIfNewer(1) = %v, %v; want whole v12", s12, err)
	}
	if st := r.Stats(); st.Reads != 2 || st.InPlace != 2 {
		t.Fatalf("stats %+v, want 2 reads, both in place", st)
	}
	// v1's slot is free again: two more versions, and one of them lands
	// there.
	publishRange(t, w, 13, 14, 1000)
	if slotOf(w, 1) >= 0 {
		t.Fatal("the writer never reused the slot the lease moved away from")
	}
	if err := wsynctest.Check(s12); err != nil {
		t.Fatalf("the leased v12 changed: %v", err)
	}

	// Close frees the entry for the next reader.
	r.Close()
	if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); got != 0 {
		t.Fatalf("entry owner after Close = %#x, want 0", got)
	}
	r2, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if !r2.Leasing() {
		t.Fatal("the entry a closed reader freed was not claimed")
	}
}

// Readers that cannot lease copy, and still read whole versions: one more
// leasing reader than the table has entries, a reader of a segment whose
// writer predates leases (L = 0), and a double buffer (no room for
// leases).
func TestShmLeaseFallsBackToCopying(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 4)
	var readers []*Reader
	for range 3 {
		r, err := Open(ReaderConfig{Path: path, Lease: true})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		readers = append(readers, r)
	}
	if !readers[0].Leasing() || !readers[1].Leasing() || readers[2].Leasing() {
		t.Fatalf("leasing: %v %v %v; want the 2 entries of 4 slots taken by the first two readers",
			readers[0].Leasing(), readers[1].Leasing(), readers[2].Leasing())
	}
	// An older writer's segment: L = 0 in the header.
	old := wsynctest.ShmPath(t)
	ow, err := Create(Config{Path: old, Name: "m", Capacity: 64 << 10, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Close()
	u32(ow.mem, offLeases).Store(0)
	or, err := Open(ReaderConfig{Path: old, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer or.Close()
	double := wsynctest.ShmPath(t)
	dw, err := Create(Config{Path: double, Name: "m", Capacity: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer dw.Close()
	dr, err := Open(ReaderConfig{Path: double, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dr.Close()
	if or.Leasing() || dr.Leasing() {
		t.Fatalf("leasing with L = 0: %v (older writer), %v (double buffer)", or.Leasing(), dr.Leasing())
	}
	// Each fallback says why; a leasing reader says nothing.
	for _, c := range []struct {
		r    *Reader
		want string
	}{{readers[0], ""}, {readers[2], "every one of the 2 lease entries"}, {or, "has no lease table"}, {dr, "has no lease table (2 slots"}} {
		if got := c.r.CopyReason(); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Fatalf("CopyReason() = %q, want one containing %q", got, c.want)
		}
	}
	if cr, err := Open(ReaderConfig{Path: path}); err != nil || !strings.Contains(cr.CopyReason(), "Lease is off") {
		t.Fatalf("a copying reader's CopyReason: %v, %v", cr, err)
	} else {
		cr.Close()
	}

	held := make([]*store.Snapshot, len(readers))
	for v := uint64(1); v <= 6; v++ {
		publishRange(t, w, v, v, 1000)
		publishRange(t, ow, v, v, 1000)
		publishRange(t, dw, v, v, 1000)
		for i, r := range append(readers, or, dr) {
			s, err := r.GetIfNewer(ctx, v-1)
			if err != nil || s == nil || s.Version != v || wsynctest.Check(s) != nil {
				t.Fatalf("reader %d, v%d: got %v, %v", i, v, s, err)
			}
			if r.InMapping(s.Blob) != r.Leasing() {
				t.Fatalf("reader %d (leasing %v): snapshot in the mapping = %v", i, r.Leasing(), r.InMapping(s.Blob))
			}
			if i < len(held) {
				held[i] = s
			}
		}
		// Both leases name the newest slot; the copying reader copied.
		for i, s := range held {
			if err := wsynctest.Check(s); err != nil {
				t.Fatalf("reader %d's v%d changed: %v", i, v, err)
			}
		}
	}
	if st := readers[2].Stats(); st.InPlace != 0 || st.Reads != 6 {
		t.Fatalf("fallback reader stats %+v, want 6 copied reads", st)
	}
}

// A reader process killed while it holds a lease does not block the writer
// (the slot it held is avoided, another is always free), and the next
// leasing reader takes over its entry, releasing the slot.
func TestShmLeaseOfDeadReader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, path := leaseSegment(t, 3)
	publishRange(t, w, 1, 1, 1000)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=shm-lease-hold", "RLHUB_WSYNC_SHM="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "leased v1" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("lease holder said %q (%v), want \"leased v1\"", sc.Text(), sc.Err())
	}
	owner := u64(w.mem, leaseOff(0)+leaseOwner).Load()
	if int(owner>>32) != cmd.Process.Pid {
		t.Fatalf("entry 0 owner %#x, want the holder's pid %d", owner, cmd.Process.Pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // killed: the error is expected; the pid is gone once reaped

	// The dead reader's lease still names v1's slot: the writer goes
	// around it (Write has no path that waits for a reader; every publish
	// succeeds).
	leased := slotOf(w, 1)
	publishRange(t, w, 2, 20, 1000)
	if slotOf(w, 1) != leased {
		t.Fatal("the writer wrote the slot a dead reader leased before anyone released it")
	}

	r, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Leasing() || r.entry != 0 {
		t.Fatalf("new reader: leasing %v, entry %d; want the dead reader's entry 0", r.Leasing(), r.entry)
	}
	if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); int(got>>32) != os.Getpid() {
		t.Fatalf("entry 0 owner %#x after the take-over, want pid %d", got, os.Getpid())
	}
	s, err := r.GetIfNewer(ctx, 0)
	if err != nil || s == nil || s.Version != 20 || wsynctest.Check(s) != nil {
		t.Fatalf("GetIfNewer = %v, %v; want whole v20", s, err)
	}
	// v1's slot is released: the writer gets it back within two versions.
	publishRange(t, w, 21, 22, 1000)
	if slotOf(w, 1) >= 0 {
		t.Fatal("the dead reader's slot was never reused after the take-over")
	}
	if err := wsynctest.Check(s); err != nil {
		t.Fatalf("the new reader's leased v20 changed: %v", err)
	}
}

// runLeaseHolderChild is the reader process of TestShmLeaseOfDeadReader:
// it leases the newest version, prints "leased v<N>" and waits for stdin
// to end (the parent kills it first).
func runLeaseHolderChild() int {
	r, err := Open(ReaderConfig{Path: os.Getenv("RLHUB_WSYNC_SHM"), Lease: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease holder:", err)
		return 1
	}
	defer r.Close()
	s, err := r.GetIfNewer(context.Background(), 0)
	if err != nil || s == nil || !r.Leasing() {
		fmt.Fprintln(os.Stderr, "lease holder: no lease:", s, err, r.Leasing())
		return 1
	}
	fmt.Println("leased v" + strconv.FormatUint(s.Version, 10))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// A leased read that fails (here a version whose bytes are not
// safetensors) keeps the snapshot held before leased: the writer goes on
// around its slot, so the collector's current weights stay whole.
func TestShmLeaseFailedReadKeepsHeldSnapshot(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 3)
	r, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	publishRange(t, w, 1, 1, 1000)
	s1, err := r.GetIfNewer(ctx, 0)
	if err != nil || s1 == nil || s1.Version != 1 || !r.Leasing() {
		t.Fatalf("GetIfNewer = %v, %v (leasing %v)", s1, err, r.Leasing())
	}
	held := slotOf(w, 1)
	if err := w.Write(2, 0, []byte("this is not safetensors at all")); err != nil {
		t.Fatal(err)
	}
	if s, err := r.GetIfNewer(ctx, 1); err == nil {
		t.Fatalf("reading a corrupt version: %v, want an error", s)
	}
	if got := u64(w.mem, leaseOff(0)+leaseSlot).Load(); got != uint64(held)+1 {
		t.Fatalf("after the failed read the lease names slot %d-1, want v1's slot %d", got, held)
	}
	publishRange(t, w, 3, 10, 1000)
	if err := wsynctest.Check(s1); err != nil {
		t.Fatalf("v1 changed after a failed read and 8 more versions: %v", err)
	}
	s10, err := r.GetIfNewer(ctx, 1)
	if err != nil || s10 == nil || s10.Version != 10 {
		t.Fatalf("GetIfNewer after the writer moved on = %v, %v", s10, err)
	}
}

// TestShmClaimSurvivesALeaseMovingMidPass: with 4 slots and 2 leases, a
// reader that moves its lease from a slot the writer's pass already
// skipped to the one it visits last makes that pass find every slot taken,
// though one is free at every instant (CI met this with leasing readers
// against a writer running flat out). The writer passes again and claims
// the slot the lease left. A table that stays full (impossible with real
// readers) ends in a bounded number of passes instead of hanging.
func TestShmClaimSurvivesALeaseMovingMidPass(t *testing.T) {
	w, _ := leaseSegment(t, 4)
	publishRange(t, w, 1, 3, 16)
	var order []int // the candidates in the order a pass visits them
	for k := range w.geo.slots {
		if i := (w.next + k) % w.geo.slots; i != w.newest {
			order = append(order, i)
		}
	}
	if len(order) != 3 {
		t.Fatalf("%d candidate slots, want 3", len(order))
	}
	a, b := order[0], order[1] // the two readers' leases
	moved := false
	leased := func(i int) bool {
		hit := i == a || i == b
		if i == order[0] && !moved { // reader A moves on once the pass is past its slot
			a, moved = order[2], true
		}
		return hit
	}
	w.mu.Lock()
	i, s, ok := w.claimSlotWith(leased)
	if ok {
		u64(w.slot(i), slotSeq).Store(s) // leave the segment as it was
	}
	w.mu.Unlock()
	if !ok || i != order[0] {
		t.Fatalf("claim: slot %d ok=%v; want slot %d, the one reader A left", i, ok, order[0])
	}

	w.mu.Lock()
	_, _, ok = w.claimSlotWith(func(int) bool { return true })
	w.mu.Unlock()
	if ok {
		t.Fatal("claimed a slot from a table where every slot stays leased")
	}
}

// Release gives the leased slot back at once: the writer then writes into
// it again (the released view changes under it, which is why a released
// snapshot must not be read), while the reader keeps its entry and leases
// the next version. Without the release the writer would keep avoiding
// that slot.
func TestShmReleaseGivesTheSlotBack(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 3)
	r, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	publishRange(t, w, 1, 1, 1000)
	s1, err := r.GetIfNewer(ctx, 0)
	if err != nil || s1 == nil || !r.InMapping(s1.Blob) {
		t.Fatalf("v1: %v, %v; want it leased", s1, err)
	}
	held := slotOf(w, 1)
	r.Release()
	if got := u64(w.mem, leaseOff(0)+leaseSlot).Load(); got != 0 {
		t.Fatalf("lease entry names slot %d after Release, want 0", got)
	}
	// 3 slots: v2 and v3 go to the two others, v4 to the released one.
	publishRange(t, w, 2, 4, 1000)
	if got := slotOf(w, 4); got != held {
		t.Fatalf("v4 went to slot %d, want the released slot %d", got, held)
	}
	s4, err := r.GetIfNewer(ctx, 1)
	if err != nil || s4 == nil || s4.Version != 4 || !r.InMapping(s4.Blob) || wsynctest.Check(s4) != nil {
		t.Fatalf("after Release: %v, %v; want v4 leased", s4, err)
	}
	if st := r.Stats(); st.InPlace != 2 || !r.Leasing() {
		t.Fatalf("stats %+v, leasing %v; want 2 reads in place, still leasing", st, r.Leasing())
	}
	// Without a release the held slot is avoided: v5, v6 and v7 never
	// touch v4's slot.
	held = slotOf(w, 4)
	publishRange(t, w, 5, 7, 1000)
	if err := wsynctest.Check(s4); err != nil || slotOf(w, 4) != held {
		t.Fatalf("the unreleased v4 changed: %v", err)
	}
	// A copying reader's Release does nothing.
	cr, err := Open(ReaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Close()
	cr.Release()
}

// A reader whose lease entry was taken over by another (one that judged
// its process gone) stops writing the entry and copies from then on,
// saying why; what it returns stays whole.
func TestShmLeaseTakenOverFallsBackToCopying(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 3)
	r, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	publishRange(t, w, 1, 1, 1000)
	if s, err := r.GetIfNewer(ctx, 0); err != nil || s == nil || !r.InMapping(s.Blob) {
		t.Fatalf("v1: %v, %v; want it leased", s, err)
	}
	// Another process's reader takes the entry over.
	other := uint64(999999)<<32 | 1
	u64(w.mem, leaseOff(0)+leaseOwner).Store(other)
	u64(w.mem, leaseOff(0)+leaseSlot).Store(0)
	publishRange(t, w, 2, 2, 1000)
	s, err := r.GetIfNewer(ctx, 1)
	if err != nil || s == nil || s.Version != 2 || wsynctest.Check(s) != nil {
		t.Fatalf("v2 after the takeover: %v, %v", s, err)
	}
	if r.Leasing() || r.InMapping(s.Blob) || !strings.Contains(r.CopyReason(), "taken over") {
		t.Fatalf("leasing %v, in mapping %v, reason %q; want a copy and the reason", r.Leasing(), r.InMapping(s.Blob), r.CopyReason())
	}
	if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); got != other {
		t.Fatalf("the entry's owner is %x, want the new owner %x untouched", got, other)
	}
	r.Close()
	if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); got != other {
		t.Fatalf("Close freed an entry it no longer owns (owner %x)", got)
	}
}
