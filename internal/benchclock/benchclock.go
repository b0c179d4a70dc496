// Package benchclock times benchmark phases on a shared machine. Next to the
// wall clock it reads the calling thread's CPU clock, which does not advance
// while other processes hold the core, so a ratio of two phases measured in
// CPU time stays meaningful when the machine's load swings. Only benchmarks
// use it.
//
// The caller must keep the goroutine on one OS thread while timing
// (runtime.LockOSThread), or the CPU clock would mix threads. CPU time
// excludes work done for the caller on other threads (for example the
// garbage collector's background marking), so allocation-heavy phases look
// cheaper in CPU time than they are; compare them in wall time too.
package benchclock

import "time"

// Stamp is a point on both clocks.
type Stamp struct {
	wall time.Time
	cpu  time.Duration
}

// Now reads both clocks.
func Now() Stamp { return Stamp{wall: time.Now(), cpu: threadCPU()} }

// Span is a duration on both clocks.
type Span struct {
	Wall, CPU time.Duration
}

// Sub returns the time from earlier to s.
func (s Stamp) Sub(earlier Stamp) Span {
	return Span{Wall: s.wall.Sub(earlier.wall), CPU: s.cpu - earlier.cpu}
}

// Add accumulates d into s.
func (s *Span) Add(d Span) { s.Wall += d.Wall; s.CPU += d.CPU }

// HasCPU reports whether the thread CPU clock is available on this platform
// (otherwise Span.CPU is always 0).
func HasCPU() bool { return hasCPU }
