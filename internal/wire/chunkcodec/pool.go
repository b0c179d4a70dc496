package chunkcodec

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// ServerOptions are the gRPC options every rlhub server that moves chunks
// uses (the hub passes them to grpc.NewServer); DialOptions are the same
// for clients. Both install BufferPool.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{experimental.BufferPool(BufferPool)}
}

// DialOptions: see ServerOptions.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{experimental.WithBufferPool(BufferPool)}
}

// BufferPool is the mem.BufferPool behind ServerOptions and DialOptions.
// gRPC takes a buffer from it for every HTTP/2 DATA frame it reads (16 KiB
// on loopback bulk transfers) and reads the frame's payload into it. Unlike
// grpc-go's default pool it does not zero a buffer before handing it out:
// every user in grpc-go v1.85 overwrites exactly the length it asked for
// (frame reads, message marshalling, receive-buffer compaction; its own
// read-buffer and ALTS pools are unzeroed for the same reason), so zeroing
// only cost a pass over every received byte, about 5% of a pull's CPU
// (docs/benchlog/2026-11-30-sessions-1-4.md, model store). A buffer's old contents are always
// overwritten before anything reads them.
var BufferPool mem.BufferPool = newDirtyPool(4<<10, 16<<10, 32<<10, 1<<20)

// dirtyPool keeps buffers of a few fixed capacities, one sync.Pool each;
// larger requests are allocated and dropped.
type dirtyPool struct {
	sizes []int // increasing
	pools []sync.Pool
}

func newDirtyPool(sizes ...int) *dirtyPool {
	return &dirtyPool{sizes: sizes, pools: make([]sync.Pool, len(sizes))}
}

// tier is the index of the smallest size ≥ n, or len(sizes).
func (p *dirtyPool) tier(n int) int {
	for i, s := range p.sizes {
		if n <= s {
			return i
		}
	}
	return len(p.sizes)
}

// Get implements mem.BufferPool: a buffer of length n whose contents are
// undefined.
func (p *dirtyPool) Get(n int) *[]byte {
	i := p.tier(n)
	if i == len(p.sizes) {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.pools[i].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, p.sizes[i])
	return &b
}

// Put implements mem.BufferPool. Buffers of a capacity it does not keep
// are left to the garbage collector.
func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	if i := p.tier(c); i < len(p.sizes) && p.sizes[i] == c {
		p.pools[i].Put(b)
	}
}
