//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Config configures a shared-memory segment writer.
type Config struct {
	// Path of the segment, normally under /dev/shm. Required.
	Path string
	// Name is the model name recorded in the header; Publish refuses
	// snapshots of other models. Required, at most 256 bytes.
	Name string
	// Capacity is the largest blob a version may have, in bytes; it is
	// rounded up to a whole page. Required.
	Capacity int64
	// Slots is the number of version slots (double buffer = 2); 0 means 2.
	// More slots give a reader more time to copy a version before the
	// writer comes back to its slot, and S − 2 of them can be leased by
	// readers that read in place (ReaderConfig.Lease): the segment has
	// a lease entry for each, so 2 + n slots let n readers lease.
	Slots int
	// Replace removes an existing file at Path first; false makes
	// Create fail with errs.ErrExists when one exists.
	Replace bool
	// Mode is the file mode; 0 means 0600 (0660 with Group). It is set
	// exactly, whatever the umask; a mode that grants anything to others
	// (world-readable or writable) is refused: the segment holds the
	// policy's weights.
	Mode os.FileMode
	// Group, when set, is the group (a name or a numeric id) the segment
	// belongs to, so that collectors of another user in that group can
	// read it; "" leaves the creator's group.
	Group string
	// Now stamps versions; nil means time.Now.
	Now func() time.Time
	// CopyWorkers is how many goroutines copy (and checksum) a version
	// into its slot at once, each a contiguous part of at least 2 MiB;
	// 0 means min(GOMAXPROCS, 4), 1 copies on the calling goroutine only.
	CopyWorkers int
	// Life is the life of every version the segment will hold
	// (store.Snapshot.Life, docs/weight-sync.md "Lives"), recorded in the
	// header so that readers name it; 0: unknown. Publish refuses a
	// snapshot of another known life: the model deleted and pushed again
	// goes to a new segment (its versions start afresh, below this one's).
	Life uint64
}

func (c *Config) validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("%w: wsync: Config.Path is empty", errs.ErrInvalid)
	case c.Name == "" || len(c.Name) > shmMaxName:
		return fmt.Errorf("%w: wsync: Config.Name %q must be 1..%d bytes", errs.ErrInvalid, c.Name, shmMaxName)
	case c.Capacity <= 0 || c.Capacity > 1<<40:
		return fmt.Errorf("%w: wsync: Config.Capacity %d outside (0, 1 TiB]", errs.ErrInvalid, c.Capacity)
	case c.Slots < 0 || c.Slots == 1 || c.Slots > 64:
		return fmt.Errorf("%w: wsync: Config.Slots %d outside [2, 64]", errs.ErrInvalid, c.Slots)
	case c.CopyWorkers < 0:
		return fmt.Errorf("%w: wsync: Config.CopyWorkers %d is negative", errs.ErrInvalid, c.CopyWorkers)
	}
	if c.CopyWorkers == 0 {
		c.CopyWorkers = min(runtime.GOMAXPROCS(0), 4)
	}
	if c.Slots == 0 {
		c.Slots = 2
	}
	if c.Mode == 0 {
		c.Mode = 0o600
		if c.Group != "" {
			c.Mode = 0o660
		}
	}
	if c.Mode&^os.ModePerm != 0 || c.Mode&0o007 != 0 {
		return fmt.Errorf("%w: wsync: shm mode %#o grants access to every user; use 0600, or 0660 with a group", errs.ErrInvalid, uint32(c.Mode))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Writer publishes versions of one model into a shared-memory segment.
// It is the only writer of its segment. Publish and Close are safe for
// concurrent use.
type Writer struct {
	cfg Config
	geo shmGeometry

	file os.FileInfo // the segment's identity, so Close removes only its own file
	// f is the segment's open file, kept for the writer's lifetime: its
	// OFD write lock on the byte at offLiveness tells readers (in any pid
	// namespace) that the writer lives, until Close closes f or the
	// kernel does as the process dies.
	f *os.File

	mu        sync.Mutex // serializes writes; guards the fields below
	mem       []byte     // the mapping; nil after Close
	next      int        // slot the round robin tries first for the next version
	newest    int        // slot holding the newest version; -1 before the first
	published uint64
}

// Create creates, sizes, maps and pre-faults a segment (every page is
// touched at creation, so publishing never pays for first-touch faults).
// The segment is built under a temporary name and appears at Path only
// once its header is complete, so readers never open a half-made segment;
// with Replace it atomically takes the place of an existing file (whose
// readers keep their mapping of the old one).
func Create(cfg Config) (*Writer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	geo := shmGeometry{slots: cfg.Slots, capacity: roundPage(cfg.Capacity), name: cfg.Name, leases: cfg.Slots - 2, life: cfg.Life}
	geo.stride = shmPage + geo.capacity
	if !cfg.Replace {
		if _, err := os.Lstat(cfg.Path); err == nil {
			return nil, fmt.Errorf("%w: wsync: shm segment %s", errs.ErrExists, cfg.Path)
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", cfg.Path, os.Getpid())
	removeOrphans(cfg.Path)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("wsync: create shm segment: %w", err)
	}
	var mem []byte
	fail := func(err error) (*Writer, error) {
		if mem != nil {
			unix.Munmap(mem)
		}
		f.Close() // and with it the liveness lock
		os.Remove(tmp)
		return nil, err
	}
	// The liveness lock is taken before the header says readers should
	// look for it, and before the segment appears at its path; the writer
	// holds it until Close (docs/shm-layout.md, "Liveness").
	geo.liveness = livenessLock
	if ok, err := ofdLock(f, offLiveness); errors.Is(err, unix.EINVAL) {
		geo.liveness = livenessPID // a kernel without OFD locks (before 3.15): readers go by the pid
	} else if err != nil {
		return fail(fmt.Errorf("wsync: lock shm segment %s for its writer: %w", errs.Quote(tmp), err))
	} else if !ok {
		return fail(fmt.Errorf("wsync: shm segment %s was locked by another process while it was made", errs.Quote(tmp)))
	}
	if err := setShmAccess(f, cfg.Mode, cfg.Group); err != nil {
		return fail(err)
	}
	if err := f.Truncate(geo.size()); err != nil {
		return fail(fmt.Errorf("wsync: size shm segment to %d bytes: %w", geo.size(), err))
	}
	// The pages are reserved before they are mapped: a file system without
	// room for them (a container's 64 MiB /dev/shm) answers ENOSPC here,
	// where touching a mapped page it cannot back would kill the process
	// with SIGBUS.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, geo.size()); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fail(fmt.Errorf("%w: wsync: reserve %d bytes for shm segment %s: %v", errs.ErrFull, geo.size(), errs.Quote(cfg.Path), err))
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, int(geo.size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		mem = nil
		return fail(fmt.Errorf("wsync: map shm segment: %w", err))
	}
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); errors.Is(err, unix.EINVAL) {
		// Kernels before 5.14: touch every page instead.
		for i := 0; i < len(mem); i += shmPage {
			mem[i] = 0
		}
	} else if err != nil {
		return fail(fmt.Errorf("%w: wsync: fault in shm segment %s: %v", errs.ErrFull, errs.Quote(cfg.Path), err))
	}
	putShmHeader(mem, geo, os.Getpid())
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("wsync: stat shm segment: %w", err))
	}
	if cfg.Replace {
		err = os.Rename(tmp, cfg.Path)
	} else if err = os.Link(tmp, cfg.Path); err == nil { // fails if Path exists
		os.Remove(tmp)
	}
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fail(fmt.Errorf("%w: wsync: shm segment %s", errs.ErrExists, cfg.Path))
		}
		return fail(fmt.Errorf("wsync: publish shm segment: %w", err))
	}
	return &Writer{cfg: cfg, geo: geo, mem: mem, file: fi, f: f, newest: -1}, nil
}

// removeOrphans removes the temporary files of segments at path that a
// writer killed in Create left (PATH.tmp-PID): in /dev/shm each holds its
// memory until a reboot. A live writer's is left alone (orphaned).
func removeOrphans(path string) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+".tmp-"
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		pid, err := strconv.Atoi(rest)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if p := filepath.Join(dir, e.Name()); orphaned(p, pid) {
			os.Remove(p)
		}
	}
}

// orphaned reports whether the writer that made the temporary segment file
// p (named after its pid) is gone. This process's own is (a predecessor's
// with the same pid). A writer holds the liveness lock from just after it
// creates the file, in whatever pid namespace it runs: a file locked is a
// live writer's, and one unlocked that records livenessLock a dead one's.
// Otherwise (an older writer's, or one made an instant ago) the pid
// decides: gone when no process has it.
func orphaned(p string, pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	// O_NONBLOCK: a FIFO of a temporary's name would hold open(2).
	if f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
		defer f.Close()
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return false
		}
		if held, err := ofdLocked(f, offLiveness); err == nil {
			if held {
				return false
			}
			var b [4]byte
			if n, _ := f.ReadAt(b[:], offLiveness); n == len(b) && binary.LittleEndian.Uint32(b[:]) == livenessLock {
				return true
			}
		}
	}
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// Room is the free space of the file system that would hold a segment at
// path (its directory's): what Create can reserve there, less what other
// writers take meanwhile.
func Room(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, fmt.Errorf("wsync: free space for shm segment %s: %w", errs.Quote(path), err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Path is the segment's file.
func (w *Writer) Path() string { return w.cfg.Path }

// Capacity is the largest blob the segment holds.
func (w *Writer) Capacity() int64 { return w.geo.capacity }

// Life is the life of the segment's versions (Config.Life; 0: unknown).
func (w *Writer) Life() uint64 { return w.geo.life }

// Publish implements Publisher: it writes snap.Blob as a new version. A
// snapshot of another life than the segment's (both known) is refused
// with errs.ErrInvalid: it belongs in a new segment (Config.Life).
func (w *Writer) Publish(_ context.Context, snap *store.Snapshot) error {
	if snap.Name != w.cfg.Name {
		return errWrongModel(w.cfg.Name, snap.Name)
	}
	if store.OtherLife(snap.Life(), w.geo.life) {
		return fmt.Errorf("%w: wsync: version %d of %s is of another life than shm segment %s: it needs a new segment",
			errs.ErrInvalid, snap.Version, errs.Quote(snap.Name), errs.Quote(w.cfg.Path))
	}
	return w.Write(snap.Version, snap.Epoch, snap.Blob)
}

// Write publishes blob (a safetensors encoding) as version, which must be
// newer than the last one written (*errs.StaleError otherwise). A blob
// over the capacity fails with errs.ErrFull. Nothing changes on error.
//
// The seqlock: the slot's seq becomes odd, the fields and bytes are
// written, the CRC-32C is stored, seq becomes even, then `published` and
// the futex word move and waiters are woken. The bytes are copied and
// checksummed in one pass, by up to CopyWorkers goroutines (Config).
// The slot is the next one round robin that holds neither the newest
// version nor a reader's lease (claimSlot); one always exists, so readers
// never make Write wait.
func (w *Writer) Write(version, epoch uint64, blob []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mem == nil {
		return errClosed("shm writer")
	}
	if version <= w.published {
		return staleErr(w.cfg.Name, w.published, version)
	}
	if int64(len(blob)) > w.geo.capacity {
		return fmt.Errorf("%w: wsync: blob of %d bytes exceeds the shm slot capacity %d", errs.ErrFull, len(blob), w.geo.capacity)
	}
	i, s, ok := w.claimSlot()
	if !ok {
		// Unreachable in practice while the table has at most S − 2
		// entries (checked at creation): at most S − 2 slots are leased
		// and one holds the newest version, so one is free at every
		// instant; only readers moving leases through claimPasses passes
		// in a row get here.
		return fmt.Errorf("%w: wsync: every shm slot of %s is leased or holds the newest version", errs.ErrAborted, w.cfg.Path)
	}
	slot := w.slot(i)
	seq := u64(slot, slotSeq)
	startSlot(slot, version, epoch, len(blob))
	crc := copyCRCParallel(slot[shmPage:shmPage+len(blob)], blob, w.cfg.CopyWorkers, u64(slot, slotWritten))
	u32(slot, slotCRC).Store(crc)
	u64(slot, slotCreated).Store(uint64(w.cfg.Now().UnixNano()))
	seq.Store(s + 2)

	w.published = version
	w.newest = i
	u64(w.mem, offPublished).Store(version)
	u32(w.mem, offNotify).Add(1)
	futexWake(u32(w.mem, offNotify))
	w.next = (i + 1) % w.geo.slots
	return nil
}

// startSlot fills a claimed slot's header for a version of n bytes, none
// written yet. The version goes last: a reader that sees it (following the
// write, docs/shm-layout.md) sees this write's length and written count.
func startSlot(slot []byte, version, epoch uint64, n int) {
	u64(slot, slotLength).Store(uint64(n))
	u64(slot, slotEpoch).Store(epoch)
	u64(slot, slotWritten).Store(0)
	u64(slot, slotVersion).Store(version)
}

// claimSlot picks the slot the next version goes to and makes its seq odd
// (s+1, returning s): the first slot round robin from w.next that does not
// hold the newest version and that no lease entry names.
//
// Leases and the writer meet like Dekker's two flags: the writer stores
// seq odd, then loads the lease table; a reader stores its lease, then
// loads seq. Go's atomics are sequentially consistent (an amd64 Store is
// an XCHG, a full fence), so at least one side sees the other's store:
// either the writer sees the lease and restores seq to s — it wrote
// nothing, so copy readers that saw s are still right — and tries the next
// slot, or the reader sees seq moved and leases another slot. A slot that
// is already leased is skipped without touching its seq, which spares
// copy readers a retry.
//
// A free slot exists at every instant, but one pass over the slots is not
// an instant: a reader moving its lease from a slot the pass already
// skipped to one it has yet to visit can make it find none (CI met it with 4 slots, 2
// leasing readers and a writer running flat out). So the passes repeat;
// each failed one needs a lease to move while it ran, which readers do
// once per version read, so a bounded number suffices.
func (w *Writer) claimSlot() (int, uint64, bool) { return w.claimSlotWith(w.leased) }

// claimPasses bounds claimSlot's passes over the slots.
const claimPasses = 1000

func (w *Writer) claimSlotWith(leased func(int) bool) (int, uint64, bool) {
	for pass := range claimPasses {
		if pass > 0 {
			runtime.Gosched() // let an in-process reader finish its move
		}
		for k := range w.geo.slots {
			i := (w.next + k) % w.geo.slots
			if i == w.newest || leased(i) {
				continue
			}
			seq := u64(w.slot(i), slotSeq)
			s := seq.Load()
			seq.Store(s + 1)
			if !leased(i) {
				return i, s, true
			}
			seq.Store(s)
		}
	}
	return -1, 0, false
}

// leased reports whether a lease entry names slot i. Entries naming no
// slot or a slot out of range (a confused reader) name nothing.
func (w *Writer) leased(i int) bool {
	for e := range w.geo.leases {
		if u64(w.mem, leaseOff(e)+leaseSlot).Load() == uint64(i)+1 {
			return true
		}
	}
	return false
}

func (w *Writer) slot(i int) []byte {
	return w.mem[w.geo.slotOff(i):][:w.geo.stride]
}

// Close marks the segment closed (readers then fail with
// errs.ErrUnavailable once they hold the newest version), wakes readers,
// unmaps it, removes the file unless another segment has replaced it at
// Path, and closes it (dropping the liveness lock); processes that still
// map it keep their mapping. Safe to call twice.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mem == nil {
		return nil
	}
	u32(w.mem, offState).Store(stateClosed)
	u32(w.mem, offNotify).Add(1)
	futexWake(u32(w.mem, offNotify))
	err := unix.Munmap(w.mem)
	w.mem = nil
	if fi, serr := os.Lstat(w.cfg.Path); serr == nil && os.SameFile(fi, w.file) {
		if rerr := os.Remove(w.cfg.Path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	if cerr := w.f.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// ReaderConfig configures a reader of a segment.
type ReaderConfig struct {
	// Path of the segment. Required.
	Path string
	// Model, when set, is the model the segment must hold: Open refuses a
	// segment of another model (errs.ErrInvalid), before it claims a
	// lease, as Python's ShmSource(model=...) does. A collector that read
	// another model's segment (a wrong path, models "a/b" and "a_b" sharing
	// a default path) would load that model's weights when their tensors
	// match. "" takes any model.
	Model string
	// Verify computes the CRC-32C of every version read and compares it
	// with the writer's (a mismatch is errs.ErrInvalid). false, the
	// default, relies on the seqlock alone, which is sound where loads are
	// not reordered with loads (x86-64); on other architectures the reader
	// verifies regardless. Verifying costs about 0.6 of a memcpy per read.
	Verify bool
	// Lease makes the reader read versions in place instead of copying
	// them: it claims an entry of the segment's lease table when it
	// opens, and while it holds a version the writer leaves that version's
	// slot alone (docs/shm-layout.md, "Slot leases"). Its snapshots are
	// views of the read-only mapping and stay valid only until the next
	// call that returns a newer version, or Close (see Reader). The reader
	// falls back to copying, for its whole life, when the segment has no
	// free entry (more leasing readers than slots − 2, or a writer that
	// predates leases) or the file is not writable by this process.
	Lease bool
	// Tick bounds how long WaitNewer sleeps on the futex before checking
	// ctx and the writer's liveness; 0 means 50ms.
	Tick time.Duration
	// Fresh makes a copying reader copy each version into a newly
	// allocated buffer instead of its two alternating ones, so a returned
	// Snapshot stays valid for good (the relay hands its copies to stream
	// collectors). Ignored by a leasing reader.
	Fresh bool
	// NoFollow turns following off: by default a copying reader's
	// WaitNewer that finds a newer version still being written follows
	// the write, copying its bytes as the writer marks them final (the
	// slot's written count, docs/shm-layout.md), so the copy ends soon
	// after the writer's instead of starting then.
	NoFollow bool
	// MaxRetries bounds how often one read restarts because the writer
	// overwrote the slot being copied (or, leasing, took the slot before
	// the lease did); 0 means 1000. Past it the read fails with
	// errs.ErrAborted.
	MaxRetries int
}

func (c *ReaderConfig) validate() error {
	if c.Path == "" {
		return fmt.Errorf("%w: wsync: ReaderConfig.Path is empty", errs.ErrInvalid)
	}
	if c.Tick < 0 || c.MaxRetries < 0 {
		return fmt.Errorf("%w: wsync: negative Tick or MaxRetries", errs.ErrInvalid)
	}
	if c.Tick == 0 {
		c.Tick = 50 * time.Millisecond
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 1000
	}
	if !seqlockAlone {
		c.Verify = true
	}
	return nil
}

// seqlockAlone: on this architecture the seqlock alone keeps torn copies
// out (stores become visible in order and loads are not reordered with
// loads), so verifying the CRC is optional.
const seqlockAlone = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

// Stats counts a reader's work.
type Stats struct {
	// Reads is the number of whole versions read.
	Reads uint64
	// Retries is the number of copies restarted because the writer
	// overwrote the slot meanwhile (a torn read caught by the seqlock), or
	// of leases that lost the slot to the writer and were moved.
	Retries uint64
	// InPlace is how many of Reads were leased and read in place, not
	// copied.
	InPlace uint64
	// Followed is how many of Reads were copied while the writer was
	// still writing them (ReaderConfig.NoFollow).
	Followed uint64
	// Released counts the leased slots given back by Release.
	Released uint64
	// Abandoned counts writes a reader followed and gave up on, copying
	// nothing out: aborted (a relay whose upstream cut the version off),
	// claimed again, or left by a writer that died.
	Abandoned uint64
}

// Reader reads whole versions from a segment. It is a Source for one
// goroutine: it is NOT safe for concurrent use.
//
// By default it copies each version into one of two private buffers,
// alternating, so a returned Snapshot stays valid until the second call
// after the one that returned it starts (the next call writes the other
// buffer); with ReaderConfig.Fresh each version gets a buffer of its own.
//
// A reader that leases (ReaderConfig.Lease and Leasing) copies nothing:
// a returned Snapshot's Blob and tensors are views of the segment's slot,
// which is mapped read-only (writing to it faults). It stays valid until
// the next GetIfNewer or WaitNewer call that returns a newer version (a
// call that fails on a bad version keeps it leased; only one that gives up
// after MaxRetries races with the writer may have released it), or Close,
// which unmaps the segment. Appliers that keep weights longer copy
// them (CopyInto).
type Reader struct {
	cfg ReaderConfig
	geo shmGeometry
	mem []byte // the mapping, read-only but for a leasing reader's header page; nil after Close
	pid int
	// file is the segment's open file, kept until Close: the writer's
	// liveness lock is probed through it, and a leasing reader holds its
	// entry's OFD lock on it (docs/shm-layout.md, "Liveness").
	file *os.File

	// entry is the lease entry this reader owns, -1 when it copies;
	// token is the owner value it stored there.
	entry int
	token uint64
	// why says why the reader copies ("" while it leases).
	why string

	bufs  [2][]byte
	which int
	stats Stats
}

// leaseTokens numbers the lease entries this process claims, so that
// several readers in one process own distinct owner values.
var leaseTokens atomic.Uint32

// Open maps an existing segment read-only and checks its header
// (errs.ErrInvalid for a file that is not a valid segment, errs.ErrNotFound
// when there is none). With cfg.Lease it also claims a lease entry: a free
// one, or one whose owner is gone (claimLease). The reader keeps the file
// open until Close.
func Open(cfg ReaderConfig) (*Reader, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Copying needs only read access; leasing writes the lease table, and
	// a leaser without write access copies.
	// O_NONBLOCK: a FIFO at the path would otherwise hold open(2), with
	// no deadline, until a writer came; it is refused below, as anything
	// but a regular file is.
	writable := cfg.Lease
	var f *os.File
	var err error
	if writable {
		f, err = os.OpenFile(cfg.Path, os.O_RDWR|unix.O_NONBLOCK, 0)
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			writable = false
		}
	}
	if !writable {
		f, err = os.OpenFile(cfg.Path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: wsync: shm segment %s", errs.ErrNotFound, cfg.Path)
		}
		return nil, fmt.Errorf("wsync: open shm segment: %w", err)
	}
	var mem []byte
	fail := func(err error) (*Reader, error) {
		if mem != nil {
			unix.Munmap(mem)
		}
		f.Close() // and with it any lock taken on it
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("wsync: stat shm segment: %w", err))
	}
	if !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("%w: wsync: shm segment %s is not a regular file (%s)", errs.ErrInvalid, cfg.Path, fi.Mode().Type()))
	}
	if fi.Size() < shmPage || fi.Size() > math.MaxInt {
		return fail(fmt.Errorf("%w: wsync: shm segment %s has %d bytes", errs.ErrInvalid, cfg.Path, fi.Size()))
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		mem = nil
		return fail(fmt.Errorf("wsync: map shm segment: %w", err))
	}
	geo, err := parseShmHeader(mem)
	if err != nil {
		return fail(fmt.Errorf("wsync: %s: %w", cfg.Path, err))
	}
	if cfg.Model != "" && geo.name != cfg.Model {
		return fail(fmt.Errorf("%w: wsync: shm segment %s holds model %s, not %s", errs.ErrInvalid, cfg.Path, errs.Quote(geo.name), errs.Quote(cfg.Model)))
	}
	pid := int(u64(mem, offPID).Load())
	r := &Reader{cfg: cfg, geo: geo, mem: mem, pid: pid, file: f, entry: -1}
	switch {
	case !cfg.Lease:
		r.why = "copying reader (ReaderConfig.Lease is off)"
	case !writable:
		r.why = fmt.Sprintf("%s is not writable by this process, so its lease table cannot be written", cfg.Path)
	case geo.leases == 0:
		r.why = fmt.Sprintf("%s has no lease table (%d slots; a writer leaves slots - 2 entries, so 3 or more slots lease)", cfg.Path, geo.slots)
	}
	if writable && geo.leases > 0 {
		// Only the header page becomes writable: the slots stay read-only,
		// so a collector that writes to a leased snapshot faults instead
		// of corrupting what other readers see.
		if err := unix.Mprotect(mem[:shmPage], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return fail(fmt.Errorf("wsync: make the lease table of %s writable: %w", cfg.Path, err))
		}
		// Claimers take an exclusive flock on the file, so that readers
		// without atomic compare-and-swap (the Python reader) can claim
		// entries beside Go's. It must be unlocked explicitly: f stays open
		// (and the mapping would keep the open file, and with it the lock,
		// alive after f closes).
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			return fail(fmt.Errorf("wsync: lock the lease table of %s: %w", cfg.Path, err))
		}
		r.entry = r.claimLease()
		if r.entry < 0 {
			r.why = fmt.Sprintf("every one of the %d lease entries of %s is held by a live reader", geo.leases, cfg.Path)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
			r.Close()
			return nil, fmt.Errorf("wsync: unlock the lease table of %s: %w", cfg.Path, err)
		}
	}
	return r, nil
}

// claimLease takes a lease entry for this reader: a free one (owner 0) or
// one whose owner is gone. The caller holds the file's flock, which every
// claimer takes, so two readers never take the same entry; the
// compare-and-swap on the owner also guards against one that does not. It
// returns the entry, or -1 when every entry is owned by a live reader.
//
// Whether an owner lives is decided by the entry's OFD lock
// (docs/shm-layout.md, "Liveness"): the claimer first takes a write lock
// on the entry's first byte through its own open file, without waiting,
// which succeeds only if no live reader holds it, and keeps it while it
// owns the entry; its token carries leaseLocked. An owner whose token
// lacks leaseLocked is an older reader, which holds no lock: it is judged
// by its pid, as before (leaseOwnerGone). This works across pid
// namespaces and inside one process (two readers' files are two open
// file descriptions), and the kernel drops a dead reader's lock.
func (r *Reader) claimLease() int {
	self := os.Getpid()
	n := uint64(leaseTokens.Add(1) &^ leaseLocked)
	locking := true
	for e := range r.geo.leases {
		off := int64(leaseOff(e))
		locked := false
		if locking {
			ok, err := ofdLock(r.file, off)
			switch {
			case errors.Is(err, unix.EINVAL):
				locking = false // a kernel without OFD locks: owners go by their pids
			case err != nil || !ok:
				continue // held by a live reader (or not lockable: leave it)
			default:
				locked = true
			}
		}
		owner := u64(r.mem, leaseOff(e)+leaseOwner)
		o := owner.Load()
		// With the entry's lock in hand, an owner that locks is gone;
		// one that does not is judged by its pid.
		if o != 0 && (!locked || o&leaseLocked == 0) && !leaseOwnerGone(o, self) {
			if locked {
				ofdUnlock(r.file, off)
			}
			continue
		}
		token := uint64(uint32(self))<<32 | n
		if locked {
			token |= leaseLocked
		}
		if owner.CompareAndSwap(o, token) {
			r.token = token
			// A dead owner's slot is released only now: until here the
			// writer kept avoiding it, which cost it nothing but a slot.
			u64(r.mem, leaseOff(e)+leaseSlot).Store(0)
			u64(r.mem, leaseOff(e)+leaseSeq).Store(0)
			return e
		}
		if locked {
			ofdUnlock(r.file, off)
		}
	}
	return -1
}

// leaseOwnerGone reports whether the process that owns a lease entry by
// pid (an older reader's token, without leaseLocked) has exited. Entries
// of this process belong to its open readers, and a pid that exists (or
// that this process may not signal) is alive; a pid reused by an
// unrelated process therefore keeps its entry until that one exits, and a
// pid of another pid namespace means nothing here.
func leaseOwnerGone(owner uint64, self int) bool {
	pid := int(owner >> 32)
	if pid == self {
		return false
	}
	return pid <= 0 || unix.Kill(pid, 0) == unix.ESRCH
}

// Name is the model name in the segment header.
func (r *Reader) Name() string { return r.geo.name }

// Stats returns the reader's counters.
func (r *Reader) Stats() Stats { return r.stats }

// Leasing reports whether the reader holds a lease entry, i.e. reads in
// place; false means it copies (see ReaderConfig.Lease).
func (r *Reader) Leasing() bool { return r.mem != nil && r.entry >= 0 }

// CopyReason says why the reader copies versions instead of leasing them
// ("" while it leases): leasing was not asked for, the file is not
// writable, the segment has no lease table, every entry is held, or the
// reader's entry was taken over after it opened (see leaseRead).
func (r *Reader) CopyReason() string { return r.why }

// Release gives back the slot a leasing reader holds, so the writer may
// use it again: the snapshot it last returned must no longer be read
// (its bytes may change). A collector that has copied the version into
// its own weights releases at once (wsync.Receiver does, after its
// Apply). The reader keeps its lease entry and leases again on its next
// read. A copying reader does nothing.
func (r *Reader) Release() {
	if r.mem == nil || r.entry < 0 {
		return
	}
	if u64(r.mem, leaseOff(r.entry)+leaseSlot).Load() == 0 {
		return
	}
	u64(r.mem, leaseOff(r.entry)+leaseSlot).Store(0)
	u64(r.mem, leaseOff(r.entry)+leaseSeq).Store(0)
	r.stats.Released++
}

// Published is the newest complete version in the segment (0: none).
func (r *Reader) Published() uint64 { return u64(r.mem, offPublished).Load() }

// Life is the life of the segment's versions, as its writer recorded it
// (store.Snapshot.Life; 0: unknown, as from a writer that predates it).
// Every snapshot the reader returns has it.
func (r *Reader) Life() uint64 { return r.geo.life }

// WaitNewerLife implements wsync.LifeSource: WaitNewer, but when the
// segment is of another life than life (both known; life is that of
// version after) its newest version is returned whatever its number: the
// model was deleted and pushed again, and the segment holds the new
// model's versions only (a writer makes a new segment for a new life).
func (r *Reader) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	if store.OtherLife(life, r.geo.life) {
		after = 0
	}
	return r.WaitNewer(ctx, after)
}

// GetIfNewerLife implements wsync.LifeSource: GetIfNewer, but when the
// segment is of another life than life (both known) its newest version
// is returned whatever its number, as WaitNewerLife's.
func (r *Reader) GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error) {
	if store.OtherLife(life, r.geo.life) {
		than = 0
	}
	return r.GetIfNewer(ctx, than)
}

// GetIfNewer implements Source: the newest whole version if newer than
// `than`, else (nil, nil). A segment whose writer closed it or died fails
// with errs.ErrUnavailable once it holds nothing newer.
func (r *Reader) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	if r.mem == nil {
		return nil, errClosed("shm reader")
	}
	snap, err := r.read(than)
	if err != nil || snap != nil {
		return snap, err
	}
	if !r.writerAlive() {
		return nil, fmt.Errorf("%w: wsync: the writer of %s is gone", errs.ErrUnavailable, r.cfg.Path)
	}
	return nil, ctx.Err()
}

// WaitNewer implements Source, sleeping on the segment's futex word.
func (r *Reader) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	if r.mem == nil {
		return nil, errClosed("shm reader")
	}
	notify := u32(r.mem, offNotify)
	for {
		n := notify.Load()
		snap, err := r.GetIfNewer(ctx, after)
		if err != nil || snap != nil {
			return snap, err
		}
		if snap, err := r.follow(ctx, after); err != nil || snap != nil {
			return snap, err
		}
		if notify.Load() != n {
			continue // a follow that ended in a commit or abort
		}
		tick := r.cfg.Tick
		if dl, ok := ctx.Deadline(); ok {
			tick = max(min(tick, time.Until(dl)), time.Microsecond)
		}
		futexWait(notify, n, tick)
	}
}

// read returns the newest whole version newer than `than`: leased and
// read in place when the reader holds a lease entry, else copied,
// retrying when the writer overwrites the slot during the copy.
func (r *Reader) read(than uint64) (*store.Snapshot, error) {
	for attempt := 0; ; attempt++ {
		if attempt > r.cfg.MaxRetries {
			return nil, fmt.Errorf("%w: wsync: %d reads of %s in a row raced the writer", errs.ErrAborted, attempt, r.cfg.Path)
		}
		// Pick the stable slot with the newest version.
		best, bestSeq, bestVer := -1, uint64(0), than
		for i := range r.geo.slots {
			slot := r.slot(i)
			s := u64(slot, slotSeq).Load()
			if s == 0 || s%2 == 1 {
				continue
			}
			v := u64(slot, slotVersion).Load()
			if u64(slot, slotSeq).Load() != s {
				continue
			}
			if v > bestVer {
				best, bestSeq, bestVer = i, s, v
			}
		}
		if best < 0 {
			return nil, nil
		}
		slot := r.slot(best)
		h, retry, err := r.slotHeader(slot, best, bestSeq)
		if retry {
			r.stats.Retries++
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.entry >= 0 {
			snap, retry, err := r.leaseRead(slot, best, bestSeq, bestVer, h)
			if retry {
				r.stats.Retries++
				continue
			}
			return snap, err
		}
		buf := r.buffer(int(h.length))
		src := slot[shmPage : shmPage+int(h.length)]
		var got uint32
		if r.cfg.Verify {
			got = copyCRC(buf, src)
		} else {
			copy(buf, src)
		}
		if u64(slot, slotSeq).Load() != bestSeq {
			r.stats.Retries++ // the writer came back to this slot: torn, retry
			continue
		}
		if r.cfg.Verify && got != h.crc {
			return nil, r.errCRC(bestVer, got, h.crc)
		}
		snap, err := r.decode(buf, bestVer, h)
		if err == nil {
			r.which ^= 1
			r.stats.Reads++
		}
		return snap, err
	}
}

// A following reader that finds no new bytes marked final sleeps
// followPause, doubling up to followPauseMax while none come (a writer fed
// by a slow socket), back to followPause after each copy.
const (
	followPause    = 50 * time.Microsecond
	followPauseMax = time.Millisecond
)

// followed, when set (tests), is called by a following reader after each
// copy with how many bytes it has copied.
var followed func(done int)

// followMin is the smallest version a reader follows: below it the copy
// after the commit is short and polling the writer's progress would cost
// more than it saves (a variable so that tests follow small versions too).
var followMin uint64 = 1 << 20

// follow copies a version of at least followMin bytes that the writer is
// still writing (a slot whose seq is odd and whose version is newer than
// than) as its bytes become final
// (the slot's written count), and returns it once the writer has
// committed it, checked as a copying read is: the writer writes each byte
// of a claim once, so bytes below written are final; the seq after the
// last copy must be the claim's commit (s+1), so no later write touched
// the slot meanwhile; the CRC when verifying. nil, nil: nothing to follow,
// or the write was aborted, the slot re-claimed or the writer died (the
// caller reads again and waits). Copying readers only.
func (r *Reader) follow(ctx context.Context, than uint64) (*store.Snapshot, error) {
	if r.entry >= 0 || r.cfg.NoFollow {
		return nil, nil
	}
	best, s1, v := -1, uint64(0), than
	for i := range r.geo.slots {
		slot := r.slot(i)
		s := u64(slot, slotSeq).Load()
		if s%2 == 0 {
			continue
		}
		if ver := u64(slot, slotVersion).Load(); ver > v {
			best, s1, v = i, s, ver
		}
	}
	if best < 0 {
		return nil, nil
	}
	slot := r.slot(best)
	seq, written := u64(slot, slotSeq), u64(slot, slotWritten)
	n := u64(slot, slotLength).Load()
	if n < followMin || n > uint64(r.geo.capacity) || seq.Load() != s1 {
		return nil, nil
	}
	buf := r.buffer(int(n))
	src := slot[shmPage : shmPage+int(n)]
	done, crc := 0, uint32(0)
	checked, pause := time.Now(), followPause
	for seq.Load() == s1 {
		if w := int(min(written.Load(), n)); w > done {
			crc = r.copyPart(buf, src, done, w, crc)
			done, pause = w, followPause
			if followed != nil {
				followed(done)
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if time.Since(checked) > r.cfg.Tick {
			if !r.writerAlive() {
				r.stats.Abandoned++
				return nil, nil
			}
			checked = time.Now()
		}
		time.Sleep(pause)
		pause = min(2*pause, followPauseMax)
	}
	if seq.Load() != s1+1 || u64(slot, slotVersion).Load() != v {
		r.stats.Abandoned++
		return nil, nil // aborted, or not this claim's commit
	}
	h, retry, err := r.slotHeader(slot, best, s1+1)
	if retry || err != nil || h.length != n {
		return nil, nil // the plain read sorts it out
	}
	crc = r.copyPart(buf, src, done, int(n), crc)
	if seq.Load() != s1+1 {
		r.stats.Retries++
		return nil, nil
	}
	if r.cfg.Verify && crc != h.crc {
		return nil, r.errCRC(v, crc, h.crc)
	}
	snap, err := r.decode(buf, v, h)
	if err == nil {
		r.which ^= 1
		r.stats.Reads++
		r.stats.Followed++
	}
	return snap, err
}

// copyPart copies src[lo:hi] into dst[lo:hi], extending crc over the bytes
// copied, in one pass (copyCRCUpdate), when the reader verifies.
func (r *Reader) copyPart(dst, src []byte, lo, hi int, crc uint32) uint32 {
	if !r.cfg.Verify {
		copy(dst[lo:hi], src[lo:hi])
		return crc
	}
	return copyCRCUpdate(crc, dst[lo:hi], src[lo:hi], len(src) >= ntMin)
}

// leaseRead reads the version in slot i (seq s when picked) in place and
// leases it. It validates first, like a copying reader, but without the
// copy: it parses the slot where it is and checks that seq has not moved
// meanwhile (retry when it has). Only a version found good takes the
// lease, and taking it releases the slot of the version returned before, so
// a read that fails on a bad version (length, CRC, parse) leaves the
// collector's current snapshot leased. Then the lease is checked: if the
// writer claimed the slot between the validation and the lease (claimSlot
// explains why one of the two sides always sees the other), the caller
// picks again, almost surely finding the newer version the writer is
// making.
func (r *Reader) leaseRead(slot []byte, i int, s, version uint64, h slotHeader) (snap *store.Snapshot, retry bool, err error) {
	seq := u64(slot, slotSeq)
	// A full slice expression: appending to the blob copies it rather
	// than writing to the read-only mapping.
	blob := slot[shmPage : shmPage+int(h.length) : shmPage+int(h.length)]
	var got uint32
	if r.cfg.Verify {
		got = crc32.Checksum(blob, castagnoli)
	}
	snap, err = decodeRacing(func() (*store.Snapshot, error) { return r.decode(blob, version, h) })
	if seq.Load() != s {
		return nil, true, nil // the writer was rewriting the slot: whatever we parsed is void
	}
	if r.cfg.Verify && got != h.crc {
		return nil, false, r.errCRC(version, got, h.crc)
	}
	if err != nil {
		return nil, false, err
	}
	if u64(r.mem, leaseOff(r.entry)+leaseOwner).Load() != r.token {
		// Another reader took the entry over (an older one, which judges
		// owners by pid, judged this process gone: a reader in another
		// pid namespace). Its lease is not ours to write: copy from now
		// on, this version included.
		r.why = fmt.Sprintf("lease entry %d of %s was taken over by another reader", r.entry, r.cfg.Path)
		ofdUnlock(r.file, int64(leaseOff(r.entry)))
		r.entry = -1
		return nil, true, nil
	}
	u64(r.mem, leaseOff(r.entry)+leaseSlot).Store(uint64(i) + 1) // releases the previous version's slot
	u64(r.mem, leaseOff(r.entry)+leaseSeq).Store(s)
	if seq.Load() != s {
		return nil, true, nil
	}
	r.stats.InPlace++
	r.stats.Reads++
	return snap, false, nil
}

// slotHeader is a slot's fields besides seq and version, loaded while its
// seq was s (the caller re-checks seq once it has read the bytes).
type slotHeader struct {
	epoch, length uint64
	crc           uint32
	created       int64
}

// slotHeader loads slot i's header (seq s when picked) for a copying or a
// leasing read. A length over the capacity is torn (retry) when seq has
// moved, else the writer's error.
func (r *Reader) slotHeader(slot []byte, i int, s uint64) (h slotHeader, retry bool, err error) {
	h = slotHeader{
		epoch:   u64(slot, slotEpoch).Load(),
		length:  u64(slot, slotLength).Load(),
		crc:     u32(slot, slotCRC).Load(),
		created: int64(u64(slot, slotCreated).Load()),
	}
	if h.length > uint64(r.geo.capacity) {
		if u64(slot, slotSeq).Load() != s {
			return h, true, nil
		}
		return h, false, r.errLength(i, h.length)
	}
	return h, false, nil
}

// decodeRacing runs decode on bytes the writer may be rewriting (the
// caller checks the seqlock afterwards and discards the result if so).
// The decoder checks every offset it derives and is fuzzed on arbitrary
// bytes, so torn input gives an error, not a crash; a panic is caught
// anyway and returned as an error, which the seqlock check then voids or
// reports.
func decodeRacing(decode func() (*store.Snapshot, error)) (snap *store.Snapshot, err error) {
	defer func() {
		if p := recover(); p != nil {
			snap, err = nil, fmt.Errorf("%w: wsync: decoding a slot: %v", errs.ErrInvalid, p)
		}
	}()
	return decode()
}

// decode parses a whole version's blob (a private copy or a leased slot);
// the snapshot's tensors alias it.
func (r *Reader) decode(blob []byte, version uint64, h slotHeader) (*store.Snapshot, error) {
	f, err := safetensors.Decode(blob)
	if err != nil {
		return nil, fmt.Errorf("wsync: %s version %d: %w", r.cfg.Path, version, err)
	}
	return store.WithLife(&store.Snapshot{
		Name: r.geo.name, Version: version, Epoch: h.epoch, Blob: blob,
		Tensors: f.Tensors, Metadata: f.Metadata, Created: time.Unix(0, h.created),
	}, r.geo.life), nil
}

func (r *Reader) errLength(slot int, length uint64) error {
	return fmt.Errorf("%w: wsync: %s slot %d claims %d bytes, capacity %d", errs.ErrInvalid, r.cfg.Path, slot, length, r.geo.capacity)
}

func (r *Reader) errCRC(version uint64, got, want uint32) error {
	return fmt.Errorf("%w: wsync: %s version %d: CRC-32C %08x, header says %08x", errs.ErrInvalid, r.cfg.Path, version, got, want)
}

// buffer returns the private buffer the next read goes to, n bytes long.
// When it must allocate it allocates both buffers, pre-faulted, so the next
// read neither allocates nor faults; memory a returned snapshot still uses
// is never written, only replaced.
func (r *Reader) buffer(n int) []byte {
	if r.cfg.Fresh {
		return tensor.AlignedBytes(n)
	}
	if cap(r.bufs[r.which]) < n {
		for i := range r.bufs {
			if cap(r.bufs[i]) < n {
				b := tensor.AlignedBytes(n)
				for off := 0; off < len(b); off += shmPage {
					b[off] = 0 // fault the page in now
				}
				r.bufs[i] = b
			}
		}
	}
	return r.bufs[r.which][:n]
}

func (r *Reader) slot(i int) []byte {
	return r.mem[r.geo.slotOff(i):][:r.geo.stride]
}

// WriterAlive reports whether the segment is open and its writer lives:
// holds its liveness lock (a writer that records livenessLock, in any pid
// namespace), or, for an older writer's segment, whose process exists.
func (r *Reader) WriterAlive() bool {
	if r.mem == nil {
		return false
	}
	return r.writerAlive()
}

func (r *Reader) writerAlive() bool {
	if u32(r.mem, offState).Load() == stateClosed {
		return false
	}
	if r.geo.liveness == livenessLock {
		if held, err := ofdLocked(r.file, offLiveness); err == nil {
			return held
		}
		// Cannot probe (never seen): fall back to the pid.
	}
	if r.pid <= 0 {
		return true
	}
	return unix.Kill(r.pid, 0) != unix.ESRCH
}

// Close releases the reader's lease entry, if it has one, unmaps the
// segment (snapshots it returned in place are gone with it) and closes
// its file. Safe to call twice.
func (r *Reader) Close() error {
	if r.mem == nil {
		return nil
	}
	if r.entry >= 0 {
		// Drop the lease first, then free the entry, then its lock: a
		// reader claiming it finds no slot named.
		u64(r.mem, leaseOff(r.entry)+leaseSlot).Store(0)
		u64(r.mem, leaseOff(r.entry)+leaseSeq).Store(0)
		u64(r.mem, leaseOff(r.entry)+leaseOwner).Store(0)
		ofdUnlock(r.file, int64(leaseOff(r.entry))) // closing the file drops it too
		r.entry = -1
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	if cerr := r.file.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// u64 and u32 view an aligned header field of a mapping as an atomic.
func u64(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off]))
}

func u32(b []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off]))
}

// Linux futex operations (shared, not FUTEX_PRIVATE: the word is shared
// between processes).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == val, at most d (or until woken).
func futexWait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every process sleeping on w.
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(math.MaxInt32), 0, 0, 0)
}

// setShmAccess gives a new segment its group (if named) and exactly mode,
// before it appears at its path or holds any bytes.
func setShmAccess(f *os.File, mode os.FileMode, group string) error {
	if group != "" {
		gid, err := strconv.Atoi(group)
		if err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return fmt.Errorf("%w: wsync: shm group: %v", errs.ErrInvalid, lerr)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		if err := f.Chown(-1, gid); err != nil {
			return fmt.Errorf("wsync: give the shm segment to group %s: %w", group, err)
		}
	}
	if err := f.Chmod(mode); err != nil { // the umask may have taken bits; the mode is exact
		return fmt.Errorf("wsync: shm segment mode: %w", err)
	}
	return nil
}

// InMapping reports whether b's bytes lie inside the reader's mapping of
// the segment: a leased, in-place snapshot's blob does, a copied one's
// does not.
func (r *Reader) InMapping(b []byte) bool {
	if len(b) == 0 || len(r.mem) == 0 {
		return false
	}
	p, lo := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&r.mem[0]))
	return p >= lo && p < lo+uintptr(len(r.mem))
}
