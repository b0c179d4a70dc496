//go:build linux

package wsync

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
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

// ShmConfig configures a shared-memory segment writer.
type ShmConfig struct {
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
	// writer comes back to its slot.
	Slots int
	// Replace removes an existing file at Path first; false makes
	// CreateShm fail with errs.ErrExists when one exists.
	Replace bool
	// Mode is the file mode; 0 means 0600.
	Mode os.FileMode
	// Now stamps versions; nil means time.Now.
	Now func() time.Time
	// CopyWorkers is how many goroutines copy (and checksum) a version
	// into its slot at once, each a contiguous part of at least 2 MiB;
	// 0 means min(GOMAXPROCS, 4), 1 copies on the calling goroutine only.
	CopyWorkers int
}

func (c *ShmConfig) validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("%w: wsync: ShmConfig.Path is empty", errs.ErrInvalid)
	case c.Name == "" || len(c.Name) > shmMaxName:
		return fmt.Errorf("%w: wsync: ShmConfig.Name %q must be 1..%d bytes", errs.ErrInvalid, c.Name, shmMaxName)
	case c.Capacity <= 0 || c.Capacity > 1<<40:
		return fmt.Errorf("%w: wsync: ShmConfig.Capacity %d outside (0, 1 TiB]", errs.ErrInvalid, c.Capacity)
	case c.Slots < 0 || c.Slots == 1 || c.Slots > 64:
		return fmt.Errorf("%w: wsync: ShmConfig.Slots %d outside [2, 64]", errs.ErrInvalid, c.Slots)
	case c.CopyWorkers < 0:
		return fmt.Errorf("%w: wsync: ShmConfig.CopyWorkers %d is negative", errs.ErrInvalid, c.CopyWorkers)
	}
	if c.CopyWorkers == 0 {
		c.CopyWorkers = min(runtime.GOMAXPROCS(0), 4)
	}
	if c.Slots == 0 {
		c.Slots = 2
	}
	if c.Mode == 0 {
		c.Mode = 0o600
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// ShmWriter publishes versions of one model into a shared-memory segment.
// It is the only writer of its segment. Publish and Close are safe for
// concurrent use.
type ShmWriter struct {
	cfg ShmConfig
	geo shmGeometry

	file os.FileInfo // the segment's identity, so Close removes only its own file

	mu        sync.Mutex // serializes writes; guards the fields below
	mem       []byte     // the mapping; nil after Close
	next      int        // slot the next version goes to
	published uint64
}

var _ Publisher = (*ShmWriter)(nil)

// CreateShm creates, sizes, maps and pre-faults a segment (every page is
// touched at creation, so publishing never pays for first-touch faults).
// The segment is built under a temporary name and appears at Path only
// once its header is complete, so readers never open a half-made segment;
// with Replace it atomically takes the place of an existing file (whose
// readers keep their mapping of the old one).
func CreateShm(cfg ShmConfig) (*ShmWriter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	geo := shmGeometry{slots: cfg.Slots, capacity: roundPage(cfg.Capacity), name: cfg.Name}
	geo.stride = shmPage + geo.capacity
	if !cfg.Replace {
		if _, err := os.Lstat(cfg.Path); err == nil {
			return nil, fmt.Errorf("%w: wsync: shm segment %s", errs.ErrExists, cfg.Path)
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", cfg.Path, os.Getpid())
	os.Remove(tmp) // a leftover of this pid's crashed predecessor
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("wsync: create shm segment: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	var mem []byte
	fail := func(err error) (*ShmWriter, error) {
		if mem != nil {
			unix.Munmap(mem)
		}
		os.Remove(tmp)
		return nil, err
	}
	if err := f.Truncate(geo.size()); err != nil {
		return fail(fmt.Errorf("wsync: size shm segment to %d bytes: %w", geo.size(), err))
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, int(geo.size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		mem = nil
		return fail(fmt.Errorf("wsync: map shm segment: %w", err))
	}
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
		// Kernels before 5.14: touch every page instead.
		for i := 0; i < len(mem); i += shmPage {
			mem[i] = 0
		}
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
	return &ShmWriter{cfg: cfg, geo: geo, mem: mem, file: fi}, nil
}

// Path is the segment's file.
func (w *ShmWriter) Path() string { return w.cfg.Path }

// Capacity is the largest blob the segment holds.
func (w *ShmWriter) Capacity() int64 { return w.geo.capacity }

// Publish implements Publisher: it writes snap.Blob as a new version.
func (w *ShmWriter) Publish(_ context.Context, snap *store.Snapshot) error {
	if snap.Name != w.cfg.Name {
		return errWrongModel(w.cfg.Name, snap.Name)
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
// checksummed in one pass, by up to CopyWorkers goroutines (ShmConfig).
func (w *ShmWriter) Write(version, epoch uint64, blob []byte) error {
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
	slot := w.mem[w.geo.slotOff(w.next):][:w.geo.stride]
	seq := u64(slot, slotSeq)
	s := seq.Load()
	seq.Store(s + 1)
	u64(slot, slotVersion).Store(version)
	u64(slot, slotEpoch).Store(epoch)
	u64(slot, slotLength).Store(uint64(len(blob)))
	crc := copyCRCParallel(slot[shmPage:shmPage+len(blob)], blob, w.cfg.CopyWorkers)
	u32(slot, slotCRC).Store(crc)
	u64(slot, slotCreated).Store(uint64(w.cfg.Now().UnixNano()))
	seq.Store(s + 2)

	w.published = version
	u64(w.mem, offPublished).Store(version)
	u32(w.mem, offNotify).Add(1)
	futexWake(u32(w.mem, offNotify))
	w.next = (w.next + 1) % w.geo.slots
	return nil
}

// Close marks the segment closed (readers then fail with
// errs.ErrUnavailable once they hold the newest version), wakes readers,
// unmaps it and removes the file unless another segment has replaced it at
// Path; processes that still map it keep their mapping. Safe to call twice.
func (w *ShmWriter) Close() error {
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
	return err
}

// ShmReaderConfig configures a reader of a segment.
type ShmReaderConfig struct {
	// Path of the segment. Required.
	Path string
	// Verify computes the CRC-32C of every version read and compares it
	// with the writer's (a mismatch is errs.ErrInvalid). false, the
	// default, relies on the seqlock alone, which is sound where loads are
	// not reordered with loads (x86-64); on other architectures the reader
	// verifies regardless. Verifying costs about 0.6 of a memcpy per read.
	Verify bool
	// Tick bounds how long WaitNewer sleeps on the futex before checking
	// ctx and the writer's liveness; 0 means 50ms.
	Tick time.Duration
	// MaxRetries bounds how often one read restarts because the writer
	// overwrote the slot being copied; 0 means 1000. Past it the read
	// fails with errs.ErrAborted.
	MaxRetries int
}

func (c *ShmReaderConfig) validate() error {
	if c.Path == "" {
		return fmt.Errorf("%w: wsync: ShmReaderConfig.Path is empty", errs.ErrInvalid)
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

// ShmStats counts a reader's work.
type ShmStats struct {
	// Reads is the number of whole versions read.
	Reads uint64
	// Retries is the number of copies restarted because the writer
	// overwrote the slot meanwhile (a torn read caught by the seqlock).
	Retries uint64
}

// ShmReader reads whole versions from a segment into its own memory. It
// is a Source for one goroutine: it is NOT safe for concurrent use.
//
// It copies each version into one of two private buffers, alternating, so
// a returned Snapshot stays valid until the second call after the one that
// returned it starts (the next call writes the other buffer). Appliers that
// keep weights longer copy them (CopyInto).
type ShmReader struct {
	cfg ShmReaderConfig
	geo shmGeometry
	mem []byte // read-only mapping; nil after Close
	pid int

	bufs  [2][]byte
	which int
	stats ShmStats
}

var _ Source = (*ShmReader)(nil)

// OpenShm maps an existing segment read-only and checks its header
// (errs.ErrInvalid for a file that is not a valid segment, errs.ErrNotFound
// when there is none).
func OpenShm(cfg ShmReaderConfig) (*ShmReader, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(cfg.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: wsync: shm segment %s", errs.ErrNotFound, cfg.Path)
		}
		return nil, fmt.Errorf("wsync: open shm segment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("wsync: stat shm segment: %w", err)
	}
	if fi.Size() < shmPage || fi.Size() > math.MaxInt {
		return nil, fmt.Errorf("%w: wsync: shm segment %s has %d bytes", errs.ErrInvalid, cfg.Path, fi.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("wsync: map shm segment: %w", err)
	}
	geo, err := parseShmHeader(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("wsync: %s: %w", cfg.Path, err)
	}
	pid := int(u64(mem, offPID).Load())
	return &ShmReader{cfg: cfg, geo: geo, mem: mem, pid: pid}, nil
}

// Name is the model name in the segment header.
func (r *ShmReader) Name() string { return r.geo.name }

// Stats returns the reader's counters.
func (r *ShmReader) Stats() ShmStats { return r.stats }

// Published is the newest complete version in the segment (0: none).
func (r *ShmReader) Published() uint64 { return u64(r.mem, offPublished).Load() }

// GetIfNewer implements Source: the newest whole version if newer than
// `than`, else (nil, nil). A segment whose writer closed it or died fails
// with errs.ErrUnavailable once it holds nothing newer.
func (r *ShmReader) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
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
func (r *ShmReader) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
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
		tick := r.cfg.Tick
		if dl, ok := ctx.Deadline(); ok {
			tick = max(min(tick, time.Until(dl)), time.Microsecond)
		}
		futexWait(notify, n, tick)
	}
}

// read copies the newest whole version newer than `than`, retrying when
// the writer overwrites the slot during the copy.
func (r *ShmReader) read(than uint64) (*store.Snapshot, error) {
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
		epoch := u64(slot, slotEpoch).Load()
		length := u64(slot, slotLength).Load()
		crc := u32(slot, slotCRC).Load()
		created := int64(u64(slot, slotCreated).Load())
		if length > uint64(r.geo.capacity) {
			if u64(slot, slotSeq).Load() != bestSeq {
				r.stats.Retries++
				continue
			}
			return nil, fmt.Errorf("%w: wsync: %s slot %d claims %d bytes, capacity %d", errs.ErrInvalid, r.cfg.Path, best, length, r.geo.capacity)
		}
		buf := r.buffer(int(length))
		src := slot[shmPage : shmPage+int(length)]
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
		if r.cfg.Verify && got != crc {
			return nil, fmt.Errorf("%w: wsync: %s version %d: CRC-32C %08x, header says %08x", errs.ErrInvalid, r.cfg.Path, bestVer, got, crc)
		}
		f, err := safetensors.Decode(buf)
		if err != nil {
			return nil, fmt.Errorf("wsync: %s version %d: %w", r.cfg.Path, bestVer, err)
		}
		r.which ^= 1
		r.stats.Reads++
		return &store.Snapshot{
			Name: r.geo.name, Version: bestVer, Epoch: epoch, Blob: buf,
			Tensors: f.Tensors, Metadata: f.Metadata, Created: time.Unix(0, created),
		}, nil
	}
}

// buffer returns the private buffer the next read goes to, n bytes long.
// When it must allocate it allocates both buffers, pre-faulted, so the next
// read neither allocates nor faults; memory a returned snapshot still uses
// is never written, only replaced.
func (r *ShmReader) buffer(n int) []byte {
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

func (r *ShmReader) slot(i int) []byte {
	return r.mem[r.geo.slotOff(i):][:r.geo.stride]
}

// WriterAlive reports whether the segment is open and its writer process
// exists.
func (r *ShmReader) WriterAlive() bool {
	if r.mem == nil {
		return false
	}
	return r.writerAlive()
}

func (r *ShmReader) writerAlive() bool {
	if u32(r.mem, offState).Load() == stateClosed {
		return false
	}
	if r.pid <= 0 {
		return true
	}
	return unix.Kill(r.pid, 0) != unix.ESRCH
}

// Close unmaps the segment. Safe to call twice.
func (r *ShmReader) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
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
