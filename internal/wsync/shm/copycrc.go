package shm

import (
	"hash/crc32"
	"sync/atomic"
	"unsafe"
)

// fusedMin is the smallest copy that goes through the fused kernel;
// below it a copy then crc32.Update of the bytes still in L1 is faster
// (the kernel's head, tail and CRC combination cost more than they save;
// the two are even at about 8 KiB, docs/benchlog/2026-12-03-s20-fusedcrc.md).
const fusedMin = 8 << 10

// ntMin is the smallest whole copy (not chunk) that uses non-temporal
// stores: bigger than L2, so that the destination is not in cache when it
// is next read anyway, and the stores save the read-for-ownership of each
// destination line. A variable so that the torn-read test can make its
// small versions take the non-temporal path too.
var ntMin = 2 << 20

// copyCRCUpdate copies src into dst[:len(src)] and returns crc extended
// over the copied bytes (crc32.Update(crc, castagnoli, dst) after the
// copy). Where the fused kernel runs (fusedOK) it loads each 64-byte line
// of the source into registers it stores, then reads the same line again
// into the CRC32 instruction. x86 loads are not reordered with each other
// and one address is coherent, so when the source changes under the copy
// (a reader's source is a slot a writer may reuse) a line stored with new
// bytes is checksummed with those or newer ones: the torn copy fails its
// CRC check, as when the CRC was taken over the destination, unless the
// line changed and changed back within the nanoseconds between the two
// loads. nt asks for non-temporal stores, which
// the kernel fences before it returns, so a store after the call (a
// progress counter, a seq) is seen only after the bytes are.
func copyCRCUpdate(crc uint32, dst, src []byte, nt bool) uint32 {
	if !fusedOK || len(src) < fusedMin {
		dst = dst[:len(src)]
		copy(dst, src)
		return crc32.Update(crc, castagnoli, dst)
	}
	return copyCRCFused(crc, dst, src, nt)
}

// copyCRCFused is copyCRCUpdate through the kernel at every length (the
// tests call it directly); fusedOK must hold.
func copyCRCFused(crc uint32, dst, src []byte, nt bool) uint32 {
	dst = dst[:len(src)]
	if len(src) == 0 {
		return crc
	}
	// A head that brings dst to a 64-byte boundary, so that every stream
	// stores whole cache lines; three streams of part bytes; a tail of
	// less than 3·64 bytes.
	head := min(int(-uintptr(unsafe.Pointer(&dst[0]))&63), len(src))
	if head > 0 {
		copy(dst[:head], src[:head])
		crc = crc32.Update(crc, castagnoli, dst[:head])
	}
	part := max(len(src)-head, 0) / (3 * 64) * 64
	if part > 0 {
		st := [3]uint32{^crc, ^uint32(0), ^uint32(0)}
		copyCRC3(&dst[head], &src[head], part, &st, nt)
		crc = crc32cCombine(crc32cCombine(^st[0], ^st[1], part), ^st[2], part)
	}
	if rest := head + 3*part; rest < len(src) {
		copy(dst[rest:], src[rest:])
		crc = crc32.Update(crc, castagnoli, dst[rest:])
	}
	return crc
}

// lastShift caches shiftFor's last answer as part<<32 | x: the copies of
// one process mostly have one chunk size, so one part.
var lastShift atomic.Uint64

// shiftFor is x^(8·part) modulo the polynomial, which crc32cCombine
// multiplies a CRC by to append part bytes' CRC (the fused copy combines
// its three streams at every call, each time for the same part).
func shiftFor(part int) uint32 {
	if v := lastShift.Load(); v != 0 && int(v>>32) == part {
		return uint32(v)
	}
	x := x2nModP(uint64(part), 3)
	if uint64(part) < 1<<32 {
		lastShift.Store(uint64(part)<<32 | uint64(x))
	}
	return x
}
