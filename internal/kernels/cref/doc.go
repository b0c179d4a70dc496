// Package cref is a C reference for the kernels' benchmarks: the float32
// add loop (dst[i] += x[i]) compiled by the C compiler at -O3, so the Go
// kernels can report their bandwidth as a fraction of what C achieves on the
// same machine in the same run.
//
// It is built with cgo; without cgo (CGO_ENABLED=0 or no C compiler)
// Available is false and the benchmarks that need it skip the comparison.
// Nothing outside benchmarks and tests uses this package.
package cref
