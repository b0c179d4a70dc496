//go:build amd64 && !purego

package shm

import "golang.org/x/sys/cpu"

// fusedOK says whether copyCRC3 can run: it needs SSE4.2's CRC32.
var fusedOK = cpu.X86.HasSSE42

// copyCRC3 (copycrc_amd64.s) copies 3·part bytes from src to dst, part a
// positive multiple of 64, as three streams of part bytes, extending the
// raw (uninverted) CRC-32C state crcs[k] over stream k. With nt the stores
// are non-temporal and fenced (SFENCE) before it returns.
//
//go:noescape
func copyCRC3(dst, src *byte, part int, crcs *[3]uint32, nt bool)
