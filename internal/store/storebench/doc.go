// Package storebench holds the model store's transfer benchmarks (pulls of
// 16 MiB and 256 MiB models to 1 and 4 readers over loopback gRPC through
// the real hub, next to a plain TCP copy of the same bytes measured in the
// same run). It has no non-test code; see docs/benchlog/2026-11-30-sessions-1-4.md.
package storebench
