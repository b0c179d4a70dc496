package shm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"

	"github.com/rlhub/rlhub/internal/errs"
)

// The shared-memory segment layout, version 1 (docs/shm-layout.md is the
// normative description; keep the two in sync). All integers are
// little-endian; every 8-byte field is 8-byte aligned so that a plain load
// of it is atomic on amd64 and arm64.
//
//	segment header, one page at offset 0:
//	  0  [8]byte magic "RLHUBWS1"
//	  8  u32     layout version (1)
//	  12 u32     slot count S (≥ 2)
//	  16 u64     slot capacity C: bytes of blob a slot holds (multiple of 4096)
//	  24 u64     slot stride: 4096 + C
//	  32 u64     writer pid
//	  40 u32     state: 0 open, 1 closed by the writer
//	  44 u32     notify: futex word, +1 after every publish
//	  48 u64     published: newest complete version (0: none yet)
//	  56 u32     name length N (≤ 256)
//	  60 u32     lease entries L (S − 2 from writers that know leases; 0
//	             from older ones, whose readers then always copy)
//	  64 [N]byte model name (UTF-8)
//	  320 u32    liveness: how readers judge the writer (and lease owners)
//	             alive (a layout 1 extension): 0 by pid (older writers,
//	             whose header page is zero here), 1 by OFD locks: the
//	             writer holds an F_OFD_SETLK write lock on byte 320 of the
//	             file for as long as it lives (docs/shm-layout.md,
//	             "Liveness"); other values are refused
//	  328 u64    life: the life of every version in the segment
//	             (store.Snapshot.Life, a layout 1 extension: 0, unknown,
//	             from older writers, whose header page is zero here); a
//	             writer of another life makes a new segment
//	  512        lease table: L entries of 32 bytes, each
//	               0  u64 owner: 0 free, else pid<<32 | per-process counter,
//	                  with bit 31 set by readers that hold the entry's
//	                  OFD lock (on its first byte) while they own it
//	               8  u64 slot index + 1 the owner reads in place (0: none)
//	               16 u64 that slot's seq when leased (diagnostic)
//	               24 u64 reserved, 0
//	slot i at offset 4096 + i*stride, a header page then C bytes of data:
//	  0  u64 seq: 0 never written, odd while being written, even when whole
//	  8  u64 version
//	  16 u64 epoch
//	  24 u64 length L of the safetensors blob (≤ C)
//	  32 u32 CRC-32C (Castagnoli) of the L blob bytes
//	  40 u64 created, Unix nanoseconds
//	  48 u64 written: while seq is odd, how many leading blob bytes are
//	         final (a layout 1 extension: 0 from writers that predate it)
//	  4096.. the blob: data at slot offset + 4096
const (
	shmMagic         = "RLHUBWS1"
	shmLayoutVersion = 1
	shmPage          = 4096
	shmMaxName       = 256

	offMagic     = 0
	offLayout    = 8
	offSlots     = 12
	offCapacity  = 16
	offStride    = 24
	offPID       = 32
	offState     = 40
	offNotify    = 44
	offPublished = 48
	offNameLen   = 56
	offLeases    = 60
	offName      = 64

	// offLiveness (a layout 1 extension, in the header page's gap between
	// the name and the lease table, which older writers leave zero) says
	// how readers judge the writer alive: livenessPID by the writer pid
	// (kill(pid, 0)), livenessLock by the OFD write lock the writer holds
	// on the byte at offLiveness for its lifetime. Pids mean nothing
	// across pid namespaces (containers sharing /dev/shm); a lock lives
	// on the file and dies with the writer's open file description.
	offLiveness  = 320
	livenessPID  = 0
	livenessLock = 1

	// offLife (a layout 1 extension, in the same gap, zero from older
	// writers: unknown) is the life of the segment's versions
	// (docs/shm-layout.md, "Lives"): fixed when the segment is made,
	// before it appears at its path, so a reader reads it once. Versions
	// of another life (the model deleted and pushed again) go to a new
	// segment, whose lower versions a reader would otherwise take for
	// older ones.
	offLife = 328

	// The lease table (docs/shm-layout.md, "Slot leases"): a layout 1
	// extension in the header page's unused tail, which older writers
	// leave zero (no entries).
	offLeaseTable = 512
	leaseEntry    = 32
	leaseOwner    = 0
	leaseSlot     = 8
	leaseSeq      = 16
	// leaseLocked marks an owner token whose reader holds the entry's OFD
	// write lock (on the entry's first byte) while it owns the entry: the
	// lock, not the pid, then says whether the owner lives. Older readers
	// never set it (their per-process counters stay far below 2^31).
	leaseLocked = 1 << 31

	slotSeq     = 0
	slotVersion = 8
	slotEpoch   = 16
	slotLength  = 24
	slotCRC     = 32
	slotCreated = 40
	slotWritten = 48

	stateOpen   = 0
	stateClosed = 1

	// copyChunk is how much of a slot the writer copies (and checksums)
	// before it publishes its progress in the slot's written field.
	copyChunk = 256 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// shmGeometry is the decoded, checked segment header.
type shmGeometry struct {
	slots    int
	capacity int64
	stride   int64
	name     string
	// leases is the lease table's entry count L: at most slots − 2, so
	// that the writer always has a slot that neither holds the newest
	// version nor is leased.
	leases int
	// liveness is the header's liveness field: livenessPID or
	// livenessLock.
	liveness uint32
	// life is the life of the segment's versions (0: unknown).
	life uint64
}

func (g shmGeometry) size() int64         { return shmPage + int64(g.slots)*g.stride }
func (g shmGeometry) slotOff(i int) int64 { return shmPage + int64(i)*g.stride }

// leaseOff is the offset of lease entry e in the header page.
func leaseOff(e int) int { return offLeaseTable + e*leaseEntry }

// parseShmHeader checks a mapped segment's header against its size. Every
// failure wraps errs.ErrInvalid.
func parseShmHeader(b []byte) (shmGeometry, error) {
	var g shmGeometry
	if len(b) < shmPage {
		return g, fmt.Errorf("%w: shm segment of %d bytes is smaller than its header page", errs.ErrInvalid, len(b))
	}
	if string(b[offMagic:offMagic+8]) != shmMagic {
		return g, fmt.Errorf("%w: shm segment magic %q, want %q", errs.ErrInvalid, b[offMagic:offMagic+8], shmMagic)
	}
	if v := binary.LittleEndian.Uint32(b[offLayout:]); v != shmLayoutVersion {
		return g, fmt.Errorf("%w: shm layout version %d, this reader knows %d", errs.ErrInvalid, v, shmLayoutVersion)
	}
	slots := binary.LittleEndian.Uint32(b[offSlots:])
	capacity := binary.LittleEndian.Uint64(b[offCapacity:])
	stride := binary.LittleEndian.Uint64(b[offStride:])
	nameLen := binary.LittleEndian.Uint32(b[offNameLen:])
	leases := binary.LittleEndian.Uint32(b[offLeases:])
	liveness := binary.LittleEndian.Uint32(b[offLiveness:])
	switch {
	case slots < 2 || slots > 64:
		return g, fmt.Errorf("%w: shm slot count %d outside [2, 64]", errs.ErrInvalid, slots)
	case capacity == 0 || capacity%shmPage != 0 || capacity > 1<<40:
		return g, fmt.Errorf("%w: shm slot capacity %d is not a positive multiple of %d", errs.ErrInvalid, capacity, shmPage)
	case stride != shmPage+capacity:
		return g, fmt.Errorf("%w: shm slot stride %d, want %d", errs.ErrInvalid, stride, shmPage+capacity)
	case nameLen > shmMaxName:
		return g, fmt.Errorf("%w: shm name length %d exceeds %d", errs.ErrInvalid, nameLen, shmMaxName)
	case leases > slots-2:
		// More entries than S − 2 could lease every slot but the newest
		// and leave the writer nowhere to write.
		return g, fmt.Errorf("%w: shm lease table of %d entries for %d slots (at most %d)", errs.ErrInvalid, leases, slots, slots-2)
	case offLeaseTable+int(leases)*leaseEntry > shmPage:
		return g, fmt.Errorf("%w: shm lease table of %d entries runs past the header page", errs.ErrInvalid, leases)
	case liveness != livenessPID && liveness != livenessLock:
		return g, fmt.Errorf("%w: shm liveness scheme %d, this reader knows %d (pid) and %d (OFD lock)", errs.ErrInvalid, liveness, livenessPID, livenessLock)
	}
	g = shmGeometry{slots: int(slots), capacity: int64(capacity), stride: int64(stride), name: string(b[offName : offName+nameLen]), leases: int(leases), liveness: liveness,
		life: binary.LittleEndian.Uint64(b[offLife:])}
	if g.size() != int64(len(b)) {
		return g, fmt.Errorf("%w: shm segment is %d bytes, its header describes %d", errs.ErrInvalid, len(b), g.size())
	}
	return g, nil
}

// putShmHeader writes the constant part of a segment header.
func putShmHeader(b []byte, g shmGeometry, pid int) {
	copy(b[offMagic:], shmMagic)
	binary.LittleEndian.PutUint32(b[offLayout:], shmLayoutVersion)
	binary.LittleEndian.PutUint32(b[offSlots:], uint32(g.slots))
	binary.LittleEndian.PutUint64(b[offCapacity:], uint64(g.capacity))
	binary.LittleEndian.PutUint64(b[offStride:], uint64(g.stride))
	binary.LittleEndian.PutUint64(b[offPID:], uint64(pid))
	binary.LittleEndian.PutUint32(b[offNameLen:], uint32(len(g.name)))
	binary.LittleEndian.PutUint32(b[offLeases:], uint32(g.leases))
	binary.LittleEndian.PutUint32(b[offLiveness:], g.liveness)
	binary.LittleEndian.PutUint64(b[offLife:], g.life)
	copy(b[offName:], g.name)
}

// copyCRC copies src into dst (same length) and returns the CRC-32C of the
// bytes, in one pass where the fused kernel runs (copyCRCUpdate).
func copyCRC(dst, src []byte) uint32 { return copyCRCProgress(dst, src, nil, len(src) >= ntMin) }

// copyCRCProgress is copyCRC that stores, after each chunk, how many
// leading bytes are copied into written (nil: none); a slot's written
// field, so that readers can follow the copy (docs/shm-layout.md). nt asks
// for non-temporal stores (copyCRCUpdate), which are fenced at the end of
// each chunk's call, before its written store.
func copyCRCProgress(dst, src []byte, written *atomic.Uint64, nt bool) uint32 {
	var crc uint32
	for off := 0; off < len(src); off += copyChunk {
		end := min(off+copyChunk, len(src))
		crc = copyCRCUpdate(crc, dst[off:end], src[off:end], nt)
		if written != nil {
			written.Store(uint64(end))
		}
	}
	return crc
}

// maxCopyWorkers bounds the goroutines one copy is split across.
const maxCopyWorkers = 8

// minCopyPart is the smallest part a copy is split into: below it the
// goroutine hand-off costs more than the second core saves. A variable so
// that the torn-read test can split its small versions too.
var minCopyPart = 2 << 20

// copyCRCParallel is copyCRC split into up to `workers` contiguous parts
// (whole copyChunks, each at least minCopyPart) copied and checksummed by
// that many goroutines at once; the calling goroutine does the first part
// and waits for the others, then combines the parts' CRCs. On an idle
// machine with several cores this takes the copy's wall time from one
// core's memory bandwidth to several.
//
// written, when not nil, follows the first part (the calling goroutine's),
// which is the copy's leading bytes.
func copyCRCParallel(dst, src []byte, workers int, written *atomic.Uint64) uint32 {
	nt := len(src) >= ntMin
	n := min(workers, maxCopyWorkers, len(src)/minCopyPart)
	if n <= 1 {
		return copyCRCProgress(dst, src, written, nt)
	}
	part := (len(src)/n + copyChunk - 1) / copyChunk * copyChunk
	bounds := func(i int) (lo, hi int) {
		lo, hi = min(i*part, len(src)), min((i+1)*part, len(src))
		if i == n-1 {
			hi = len(src)
		}
		return lo, hi
	}
	var crcs [maxCopyWorkers]uint32
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		lo, hi := bounds(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			crcs[i] = copyCRCProgress(dst[lo:hi], src[lo:hi], nil, nt)
		}()
	}
	_, hi := bounds(0)
	crc := copyCRCProgress(dst[:hi], src[:hi], written, nt)
	wg.Wait()
	for i := 1; i < n; i++ {
		lo, hi := bounds(i)
		crc = crc32cCombine(crc, crcs[i], hi-lo)
	}
	return crc
}

// crc32cCombine returns the CRC-32C of A followed by B from crcA, crcB and
// len(B): crcA times x^(8·lenB) modulo the polynomial, plus crcB (zlib's
// crc32_combine, with its table of x^(2^k)); the power comes from
// shiftFor, which keeps the last one.
func crc32cCombine(crcA, crcB uint32, lenB int) uint32 {
	return multModP(shiftFor(lenB), crcA) ^ crcB
}

// multModP multiplies a and b modulo the reflected Castagnoli polynomial.
func multModP(a, b uint32) uint32 {
	m, p := uint32(1)<<31, uint32(0)
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				return p
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ crc32.Castagnoli
		} else {
			b >>= 1
		}
	}
}

// x2nModP is x^(n·2^k) modulo the polynomial.
func x2nModP(n uint64, k uint) uint32 {
	p := uint32(1) << 31 // x^0
	for ; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = multModP(x2nTable[k&31], p)
		}
	}
	return p
}

// x2nTable[k] is x^(2^k) modulo the polynomial.
var x2nTable = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

func roundPage(n int64) int64 { return (n + shmPage - 1) / shmPage * shmPage }

// SegmentSize is the bytes a segment of slots slots of capacity bytes
// takes (what Create reserves).
func SegmentSize(capacity int64, slots int) int64 {
	return shmGeometry{slots: slots, stride: shmPage + roundPage(capacity)}.size()
}
