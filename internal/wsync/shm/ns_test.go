//go:build linux

package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// Processes in other pid namespaces (a relay container and collector
// containers sharing a /dev/shm volume, Kubernetes' default): the writer's
// and the leasing readers' liveness is judged through OFD locks on the
// segment file, never through their pids, which mean another process or
// nothing here (docs/shm-layout.md, "Liveness").

// nsHighPid is the pid the "high" namespaces give their process (their
// ns_last_pid + 1): a number no process of this test's namespace is
// likely to have, so that a pid rule judges that process dead while it
// lives. The "init" namespaces run their process as pid 1, which exists
// here too, so that a pid rule judges it alive for ever.
const nsHighPid = 32001

var (
	unshareOnce sync.Once
	unshareArgs []string // nil: no pid namespaces here
	unshareWhy  string
)

// unsharePrefix is how this test makes a pid namespace: unshare(1) as
// root, or inside a user namespace where it maps the caller to root.
func unsharePrefix(t *testing.T) []string {
	t.Helper()
	unshareOnce.Do(func() {
		for _, pre := range [][]string{{"unshare", "--pid", "--fork"}, {"unshare", "--user", "--map-root-user", "--pid", "--fork"}} {
			out, err := exec.Command(pre[0], append(pre[1:], "--mount-proc", "true")...).CombinedOutput()
			if err == nil {
				unshareArgs = pre
				return
			}
			unshareWhy += fmt.Sprintf("%q: %v %s; ", strings.Join(pre, " "), err, out)
		}
	})
	if unshareArgs == nil {
		if os.Getenv("RLHUB_REQUIRE_PIDNS") != "" { // scripts/test.sh as root: CI must show it
			t.Fatalf("no pid namespaces here, and RLHUB_REQUIRE_PIDNS is set: %s", unshareWhy)
		}
		t.Skipf("no pid namespaces here: %s", unshareWhy)
	}
	return unshareArgs
}

// nsChild is this test binary run as a helper (runChild) in a pid
// namespace of its own.
type nsChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	sc    *bufio.Scanner
}

// startNsChild starts the helper `mode` on the segment at path in a new pid
// namespace in which it is pid 1 (high false) or nsHighPid, and returns
// once it has printed its first line, which it returns. The namespace
// dies with the test.
func startNsChild(t *testing.T, mode, path string, high bool) (*nsChild, string) {
	t.Helper()
	args := unsharePrefix(t)
	if high {
		// pid 1 is a shell that sets the namespace's last pid, so that
		// the helper it starts is nsHighPid.
		args = append(args, "--mount-proc", "sh", "-c",
			fmt.Sprintf(`echo %d > /proc/sys/kernel/ns_last_pid; "$0" -test.run='^$'; exit $?`, nsHighPid-1), os.Args[0])
	} else {
		args = append(args, os.Args[0], "-test.run=^$")
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "RLHUB_WSYNC_SHM="+path)
	cmd.Stderr = os.Stderr
	// Its own process group, which kill takes down whole (unshare, the
	// namespace's init and the helper), like a container killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &nsChild{cmd: cmd, stdin: stdin, sc: bufio.NewScanner(stdout)}
	t.Cleanup(c.kill)
	if !c.sc.Scan() {
		t.Fatalf("%s helper in a pid namespace said nothing: %v", mode, c.sc.Err())
	}
	return c, c.sc.Text()
}

// kill SIGKILLs the child's process group and reaps it. Safe to call twice.
func (c *nsChild) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	c.stdin.Close()
	c.cmd.Wait()
}

// runNsWriterChild is the writer of TestShmWriterInAnotherPidNamespace: it
// creates the segment at $RLHUB_WSYNC_SHM, publishes v1, prints
// "ready pid=<its pid>" and keeps the segment until stdin ends.
func runNsWriterChild() int {
	w, err := Create(Config{Path: os.Getenv("RLHUB_WSYNC_SHM"), Name: "m", Capacity: 64 << 10, Slots: 3})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ns writer:", err)
		return 1
	}
	defer w.Close()
	snap, err := wsynctest.Build("m", 1, 100)
	if err == nil {
		err = w.Write(1, 0, snap.Blob)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ns writer:", err)
		return 1
	}
	fmt.Printf("ready pid=%d\n", os.Getpid())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// eventually polls cond for up to 10 s.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A writer in another pid namespace is alive to a reader here while it
// lives, whatever its pid means here, and gone once it is SIGKILLed: as
// pid 1 of its namespace (a pid rule would find this namespace's init and
// call it alive for ever) and as a pid no process here has (a pid rule
// would call it dead from the start).
func TestShmWriterInAnotherPidNamespace(t *testing.T) {
	for _, high := range []bool{false, true} {
		name := map[bool]string{false: "writer-is-pid-1", true: fmt.Sprintf("writer-is-pid-%d", nsHighPid)}[high]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			path := wsynctest.ShmPath(t)
			child, line := startNsChild(t, "shm-ns-writer", path, high)
			if !strings.HasPrefix(line, "ready ") {
				t.Fatalf("ns writer said %q", line)
			}
			r, err := Open(ReaderConfig{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			recorded := int(u64(r.mem, offPID).Load())
			t.Logf("writer %s; the header's pid %d is, in this namespace, %s", line, recorded,
				map[bool]string{true: "a live process", false: "no process"}[syscall.Kill(recorded, 0) != syscall.ESRCH])
			if line != fmt.Sprintf("ready pid=%d", recorded) {
				t.Fatalf("ns writer said %q, its header records pid %d", line, recorded)
			}

			if !r.WriterAlive() {
				t.Fatal("WriterAlive() = false while the writer in another pid namespace lives")
			}
			s, err := r.GetIfNewer(ctx, 0)
			if err != nil || s == nil || s.Version != 1 || wsynctest.Check(s) != nil {
				t.Fatalf("GetIfNewer(0) = %v, %v; want whole v1", s, err)
			}
			if s, err := r.GetIfNewer(ctx, 1); s != nil || err != nil {
				t.Fatalf("GetIfNewer(1) with the writer alive = %v, %v; want nil, nil", s, err)
			}

			child.kill()
			if !eventually(func() bool { return !r.WriterAlive() }) {
				t.Fatal("WriterAlive() still true 10 s after the writer's namespace was SIGKILLed")
			}
			if _, err := r.GetIfNewer(ctx, 1); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "writer of") {
				t.Fatalf("GetIfNewer(1) after the writer was killed = %v, want ErrUnavailable: the writer is gone", err)
			}
			// What it wrote is still there to read.
			if s, err := r.GetIfNewer(ctx, 0); err != nil || s == nil || s.Version != 1 {
				t.Fatalf("GetIfNewer(0) after the kill = %v, %v; want v1", s, err)
			}
		})
	}
}

// Two leasing readers hold the two entries of a 4-slot segment, one of
// them in another pid namespace; a third finds no free entry while both
// live (whatever the other namespace's pid means here), and takes the
// entry of the one in the other namespace once that is SIGKILLed.
func TestShmLeaseAcrossPidNamespaces(t *testing.T) {
	for _, high := range []bool{false, true} {
		name := map[bool]string{false: "holder-is-pid-1", true: fmt.Sprintf("holder-is-pid-%d", nsHighPid)}[high]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			w, path := leaseSegment(t, 4)
			publishRange(t, w, 1, 1, 1000)
			a, err := Open(ReaderConfig{Path: path, Lease: true})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if !a.Leasing() || a.entry != 0 {
				t.Fatalf("reader A: leasing %v, entry %d; want entry 0", a.Leasing(), a.entry)
			}
			child, line := startNsChild(t, "shm-lease-hold", path, high)
			if line != "leased v1" {
				t.Fatalf("the lease holder in a pid namespace said %q, want \"leased v1\"", line)
			}
			if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); got != a.token {
				t.Fatalf("entry 0's owner is %#x, not reader A's %#x: the holder in the other namespace took over a live reader's entry", got, a.token)
			}
			owner := u64(w.mem, leaseOff(1)+leaseOwner).Load()
			t.Logf("entry 1's owner %#x: pid %d, of the holder's namespace", owner, owner>>32)
			if owner == 0 {
				t.Fatal("the holder in the pid namespace owns no entry")
			}

			c, err := Open(ReaderConfig{Path: path, Lease: true})
			if err != nil {
				t.Fatal(err)
			}
			if c.Leasing() || !strings.Contains(c.CopyReason(), "every one of the 2 lease entries") {
				t.Fatalf("reader C with both entries held by live readers: leasing %v (entry %d), reason %q",
					c.Leasing(), c.entry, c.CopyReason())
			}
			c.Close()
			if got := u64(w.mem, leaseOff(1)+leaseOwner).Load(); got != owner {
				t.Fatalf("entry 1's owner changed from %#x to %#x while its holder lived", owner, got)
			}

			child.kill()
			var d *Reader
			if !eventually(func() bool {
				if d != nil {
					d.Close()
				}
				d, err = Open(ReaderConfig{Path: path, Lease: true})
				return err == nil && d.Leasing()
			}) {
				t.Fatalf("no leasing reader could take the entry of the killed holder within 10 s: %v, %q", err, d.CopyReason())
			}
			defer d.Close()
			if d.entry != 1 {
				t.Fatalf("reader D took entry %d, want the killed holder's 1", d.entry)
			}
			publishRange(t, w, 2, 2, 1000)
			for _, r := range []*Reader{a, d} {
				s, err := r.GetIfNewer(ctx, 1)
				if err != nil || s == nil || s.Version != 2 || !r.InMapping(s.Blob) || wsynctest.Check(s) != nil {
					t.Fatalf("entry %d: GetIfNewer(1) = %v, %v; want v2 in place", r.entry, s, err)
				}
			}
		})
	}
}

// deadPid is the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != syscall.ESRCH {
		t.Skipf("pid %d of an exited process is in use again (%v)", cmd.Process.Pid, err)
	}
	return cmd.Process.Pid
}

// The writer's liveness: a segment that records livenessLock is alive
// while its writer holds the lock, whatever its pid says; one of an older
// writer (liveness 0, no lock: simulated here) still goes by the pid.
func TestShmWriterLivenessByLockOrByPid(t *testing.T) {
	ctx := context.Background()
	w, path := leaseSegment(t, 3)
	publishRange(t, w, 1, 1, 100)
	if got := u32(w.mem, offLiveness).Load(); got != livenessLock {
		t.Fatalf("a new segment's liveness field is %d, want %d", got, livenessLock)
	}
	if held, err := ofdLocked(w.f, offLiveness); err != nil || held {
		t.Fatalf("probing through the writer's own file: held %v, %v; want false (its own lock)", held, err)
	}
	dead := deadPid(t)
	open := func() *Reader {
		t.Helper()
		r, err := Open(ReaderConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}

	// The lock decides: a dead pid in the header changes nothing while
	// the lock is held; with the lock gone the writer is gone.
	u64(w.mem, offPID).Store(uint64(dead))
	r := open()
	if !r.WriterAlive() {
		t.Fatal("WriterAlive() = false with the liveness lock held (the recorded pid is dead)")
	}
	if err := ofdUnlock(w.f, offLiveness); err != nil {
		t.Fatal(err)
	}
	if r.WriterAlive() {
		t.Fatal("WriterAlive() = true with the liveness lock dropped")
	}
	if _, err := r.GetIfNewer(ctx, 1); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("GetIfNewer(1) without the lock = %v, want ErrUnavailable", err)
	}

	// An older writer: liveness 0 and no lock; the pid decides.
	u32(w.mem, offLiveness).Store(livenessPID)
	u64(w.mem, offPID).Store(uint64(os.Getpid()))
	r = open()
	if !r.WriterAlive() {
		t.Fatal("liveness 0, live pid: WriterAlive() = false (the lock must not be consulted)")
	}
	if s, err := r.GetIfNewer(ctx, 1); s != nil || err != nil {
		t.Fatalf("liveness 0, live pid: GetIfNewer(1) = %v, %v; want nil, nil", s, err)
	}
	u64(w.mem, offPID).Store(uint64(dead))
	r = open()
	if r.WriterAlive() {
		t.Fatal("liveness 0, dead pid: WriterAlive() = true")
	}
	if _, err := r.GetIfNewer(ctx, 1); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("liveness 0, dead pid: GetIfNewer(1) = %v, want ErrUnavailable: the writer is gone", err)
	}
	// Closing is seen either way.
	u64(w.mem, offPID).Store(uint64(os.Getpid()))
	w.Close()
	if r.WriterAlive() {
		t.Fatal("WriterAlive() = true after the writer closed the segment")
	}
}

// Lease entries of older readers, which hold no lock and whose tokens lack
// leaseLocked, are still judged by their owner's pid: a new reader takes
// a dead one's entry, never a live one's, though it can lock both.
func TestShmLeaseOfOlderReadersGoesByPid(t *testing.T) {
	w, path := leaseSegment(t, 4)
	live, dead := uint64(os.Getppid())<<32|1, uint64(deadPid(t))<<32|1
	u64(w.mem, leaseOff(0)+leaseOwner).Store(live)
	u64(w.mem, leaseOff(0)+leaseSlot).Store(1)
	u64(w.mem, leaseOff(1)+leaseOwner).Store(dead)
	u64(w.mem, leaseOff(1)+leaseSlot).Store(2)
	r, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Leasing() || r.entry != 1 || r.token&leaseLocked == 0 {
		t.Fatalf("leasing %v, entry %d, token %#x; want the dead older reader's entry 1, with a locked token", r.Leasing(), r.entry, r.token)
	}
	if got := u64(w.mem, leaseOff(1)+leaseSlot).Load(); got != 0 {
		t.Fatalf("the dead reader's slot is still named (%d) after the take-over", got)
	}
	if got := u64(w.mem, leaseOff(0)+leaseOwner).Load(); got != live {
		t.Fatalf("entry 0 of a live older reader now owned by %#x", got)
	}
	r2, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if r2.Leasing() {
		t.Fatalf("a second reader took entry %d: one is a live older reader's, the other locked by a live reader", r2.entry)
	}
	// Closing frees the entry and its lock: the next reader takes it.
	r.Close()
	r3, err := Open(ReaderConfig{Path: path, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	if !r3.Leasing() || r3.entry != 1 {
		t.Fatalf("after Close: leasing %v, entry %d; want entry 1", r3.Leasing(), r3.entry)
	}
}
