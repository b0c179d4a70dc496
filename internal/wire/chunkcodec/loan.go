package chunkcodec

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/mem"
)

// Loans. Marshal hands a chunk's bytes to gRPC without a copy, and gRPC's
// transport holds them after SendMsg returns: it queues the buffers and
// frees them once its writer has copied them into a frame. That is fine
// for bytes that never change (a store version a reader took). For bytes
// their owner wants back (a store version lent to a pull, which the
// reducer may write its next step into once the loan ends) the sender
// registers them with Lend: Marshal then counts each buffer over them as
// outstanding until gRPC frees it, and the release runs only when the
// sender has said it is through (done) and gRPC has freed them all.
//
// Chunks at or below gRPC's pooling threshold are copied instead: gRPC
// does not report freeing those. Bytes marshalled by the stock codec (a
// peer that did not ask for this one) are copied during SendMsg, so they
// need no counting.

type loan struct {
	lo, hi  uintptr
	n       atomic.Int64 // 1 until done, plus the buffers gRPC holds
	release func()
}

func (l *loan) dec() {
	if l.n.Add(-1) == 0 {
		l.release()
	}
}

// Put is mem.BufferPool's: gRPC freed a buffer over the loan's bytes.
func (l *loan) Put(*[]byte) { l.dec() }

// Get is never called: the buffers are made with mem.NewBuffer.
func (l *loan) Get(n int) *[]byte { b := make([]byte, n); return &b }

var loans struct {
	mu   sync.RWMutex
	list []*loan
}

// Lend registers b as lent bytes and returns done, which the sender calls
// once (later calls do nothing) when it will send nothing more from b.
// release runs once, after done, when gRPC has freed every buffer Marshal
// made over b (at once if there was none).
func Lend(b []byte, release func()) (done func()) {
	l := &loan{release: release}
	l.n.Store(1)
	if len(b) > 0 {
		l.lo = uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		l.hi = l.lo + uintptr(len(b))
		loans.mu.Lock()
		loans.list = append(loans.list, l)
		loans.mu.Unlock()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			loans.mu.Lock()
			if i := slices.Index(loans.list, l); i >= 0 {
				loans.list = slices.Delete(loans.list, i, i+1)
			}
			loans.mu.Unlock()
			l.dec()
		})
	}
}

// lentBuffer returns the buffer Marshal hands gRPC for data: a counted one
// when data lies in a lent range, else data itself.
//
// The count is taken under the registry's lock. Two streams may lend the
// same bytes (two pulls of one version) and the lookup may find the other
// stream's loan; done removes a loan under the write lock before its last
// decrement, so a loan found here has not been released yet, and the count
// taken keeps it from being released until gRPC frees this buffer.
func lentBuffer(data []byte) mem.Buffer {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	small := mem.IsBelowBufferPoolingThreshold(cap(data))
	var l *loan
	loans.mu.RLock()
	for _, x := range loans.list {
		if p >= x.lo && p < x.hi {
			l = x
			break
		}
	}
	if l != nil && !small {
		l.n.Add(1)
	}
	loans.mu.RUnlock()
	switch {
	case l == nil:
		return mem.SliceBuffer(data)
	case small:
		return mem.SliceBuffer(slices.Clone(data)) // not reported freed: copy
	}
	return mem.NewBuffer(&data, l)
}
