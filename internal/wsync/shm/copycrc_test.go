package shm

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"unsafe"
)

// checkFused runs copyCRCFused on src (len n at offset so) into a
// sentinel-filled buffer at offset do, and fails unless the bytes copied
// equal the source, the bytes around them are untouched, and the CRC
// equals crc32.Update's over the source.
func checkFused(t testing.TB, src, buf []byte, so, do, n int, seed uint32, nt bool) {
	// The kernel is handed 64 bytes more than it may write, and the bytes
	// before the destination: both must keep the sentinel.
	around := buf[:do+n+64]
	copy(around, sentinel[:len(around)])
	s := src[so : so+n]
	got := copyCRCFused(seed, buf[do:do+n+64], s, nt)
	if want := crc32.Update(seed, castagnoli, s); got != want {
		t.Fatalf("n=%d src+%d dst+%d seed=%#x nt=%v: crc %#08x, want %#08x", n, so, do, seed, nt, got, want)
	}
	if !bytes.Equal(buf[do:do+n], s) {
		t.Fatalf("n=%d src+%d dst+%d nt=%v: copied bytes differ from the source", n, so, do, nt)
	}
	if !bytes.Equal(buf[:do], sentinel[:do]) || !bytes.Equal(buf[do+n:do+n+64], sentinel[:64]) {
		t.Fatalf("n=%d src+%d dst+%d nt=%v: a byte outside the destination changed", n, so, do, nt)
	}
}

// sentinel fills the bytes around checkFused's destination.
var sentinel = bytes.Repeat([]byte{0xa5}, 4<<20)

// aligned64 returns a buffer of n bytes whose first byte is 64-byte
// aligned, so that offsets 0..63 are every misalignment.
func aligned64(n int) []byte {
	b := make([]byte, n+64)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) & 63)
	return b[off : off+n]
}

func TestCopyCRCFusedSmall(t *testing.T) {
	if !fusedOK {
		t.Skip("no fused copy + CRC kernel on this CPU/architecture")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	src := aligned64(300 + 64)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	buf := aligned64(300 + 2*64)
	// Every length 0..300 at every src/dst misalignment pair, both store
	// kinds: the head (to a 64-byte dst boundary), the three streams and
	// the tail (< 192 bytes) each take every split, including none.
	for n := 0; n <= 300; n++ {
		for so := range 64 {
			for do := range 64 {
				checkFused(t, src, buf, so, do, n, uint32(n*4099+so*64+do), (n+so+do)%2 == 1)
			}
		}
	}
}

func TestCopyCRCFusedLarge(t *testing.T) {
	if !fusedOK {
		t.Skip("no fused copy + CRC kernel on this CPU/architecture")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const max = 3<<20 + 1000
	src := aligned64(max + 64)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	buf := aligned64(max + 2*64)
	for _, n := range []int{191, 192, 193, 383, 384, 577, 4095, 4096, 65536 + 7, 256 << 10, 256<<10 + 191, 1<<20 - 1, 1 << 20, 2<<20 + 129, 3<<20 + 1000 - 64} {
		for _, al := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {63, 17}, {8, 40}, {32, 32}} {
			for _, nt := range []bool{false, true} {
				checkFused(t, src, buf, al[0], al[1], n, rng.Uint32(), nt)
			}
		}
	}
}

// TestCopyCRCUpdateChunks checks the dispatching copyCRCUpdate, and the
// chunked writer copy built on it, against one crc32.Checksum: the
// fused and plain paths chain over chunks like one pass.
func TestCopyCRCUpdateChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]byte, 5*copyChunk+12345)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	want := crc32.Checksum(src, castagnoli)
	for _, nt := range []bool{false, true} {
		dst := make([]byte, len(src))
		var crc uint32
		for off := 0; off < len(src); {
			end := min(off+1+rng.IntN(2*fusedMin), len(src))
			if rng.IntN(4) == 0 {
				end = min(off+copyChunk, len(src))
			}
			crc = copyCRCUpdate(crc, dst[off:], src[off:end], nt)
			off = end
		}
		if crc != want || !bytes.Equal(dst, src) {
			t.Fatalf("nt=%v: crc %#08x want %#08x, bytes equal %v", nt, crc, want, bytes.Equal(dst, src))
		}
	}
	dst := make([]byte, len(src))
	var written atomic.Uint64
	if got := copyCRCProgress(dst, src, &written, true); got != want || !bytes.Equal(dst, src) || written.Load() != uint64(len(src)) {
		t.Fatalf("copyCRCProgress: crc %#08x want %#08x, written %d of %d", got, want, written.Load(), len(src))
	}
}

func FuzzCopyCRCFused(f *testing.F) {
	f.Add([]byte("hello, shared memory"), uint8(0), uint8(0), uint32(0), false)
	f.Add(bytes.Repeat([]byte{0xff, 0, 1}, 300), uint8(3), uint8(61), uint32(0xdeadbeef), true)
	f.Add(bytes.Repeat([]byte("abcdefg"), 1000), uint8(63), uint8(1), uint32(7), false)
	f.Fuzz(func(t *testing.T, data []byte, so, do uint8, seed uint32, nt bool) {
		if !fusedOK {
			t.Skip("no fused copy + CRC kernel")
		}
		data = data[:min(len(data), 1<<20)]
		s, d := int(so%64), int(do%64)
		src := aligned64(len(data) + 64)
		copy(src[s:], data)
		buf := aligned64(len(data) + 2*64)
		checkFused(t, src, buf, s, d, len(data), seed, nt)
	})
}

// Benchmarks: the fused kernel against memmove and the chunked copy then
// crc32.Update it replaces, single goroutine and split over workers.
func BenchmarkCopyCRC(b *testing.B) {
	for _, size := range []int{1 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i] = byte(i * 7)
		}
		copy(dst, src)
		run := func(name string, f func()) {
			label := fmt.Sprintf("%dMiB", size>>20)
			if size < 1<<20 {
				label = fmt.Sprintf("%dKiB", size>>10)
			}
			b.Run(name+"/"+label, func(b *testing.B) {
				b.SetBytes(int64(size))
				for range b.N {
					f()
				}
			})
		}
		run("memmove", func() { copy(dst, src) })
		run("chunked", func() { benchSink = chunkedCopyCRC(dst, src) })
		run("fused", func() { benchSink = copyCRCProgress(dst, src, nil, size >= ntMin) })
		if fusedOK && size < 64<<10 {
			// Where fusedMin should be: the kernel itself against the plain
			// copy then crc32.Update that copyCRCUpdate uses below it.
			run("kernel", func() { benchSink = copyCRCFused(0, dst, src, false) })
			continue
		}
		run("fused-temporal", func() { benchSink = copyCRCProgress(dst, src, nil, false) })
		run("memmove-2workers", func() {
			parallelWith(dst, src, 2, func(d, s []byte) uint32 { copy(d, s); return 0 })
		})
		run("chunked-2workers", func() { benchSink = parallelWith(dst, src, 2, chunkedCopyCRC) })
		run("fused-2workers", func() { benchSink = copyCRCParallel(dst, src, 2, nil) })
	}
}

var benchSink uint32

// chunkedCopyCRC is the copy before the fused kernel: copy a chunk, then
// crc32.Update over the chunk's destination bytes.
func chunkedCopyCRC(dst, src []byte) uint32 {
	var crc uint32
	for off := 0; off < len(src); off += copyChunk {
		end := min(off+copyChunk, len(src))
		copy(dst[off:end], src[off:end])
		crc = crc32.Update(crc, castagnoli, dst[off:end])
	}
	return crc
}

// parallelWith splits like copyCRCParallel (two halves) with f per half.
func parallelWith(dst, src []byte, workers int, f func(dst, src []byte) uint32) uint32 {
	part := (len(src)/workers + copyChunk - 1) / copyChunk * copyChunk
	if workers != 2 || part >= len(src) {
		return f(dst, src)
	}
	done := make(chan uint32)
	go func() { done <- f(dst[part:], src[part:]) }()
	crc := f(dst[:part], src[:part])
	return crc32cCombine(crc, <-done, len(src)-part)
}
