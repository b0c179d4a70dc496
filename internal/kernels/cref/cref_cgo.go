//go:build cgo

package cref

/*
#cgo CFLAGS: -O3
#include <stddef.h>

// On x86-64 GCC builds an AVX2 clone and a baseline (SSE2) clone and picks
// one at load time, so this runs on any x86-64 CPU yet uses the same vector
// width as the Go AVX2 kernel where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void rlhub_add_f32(float *restrict dst, const float *restrict x, size_t n) {
	for (size_t i = 0; i < n; i++) {
		dst[i] += x[i];
	}
}
*/
import "C"

import "unsafe"

// Available reports whether the C reference was compiled in.
const Available = true

// Add sets dst[i] += x[i] with the C loop. It panics if the lengths differ.
// One cgo call per slice: the call overhead (tens of ns) is noise at the
// benchmark sizes (≥ 1 MiB).
func Add(dst, x []float32) {
	if len(dst) != len(x) {
		panic("cref.Add: length mismatch")
	}
	if len(dst) == 0 {
		return
	}
	C.rlhub_add_f32((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&x[0])), C.size_t(len(dst)))
}
