// Package crashpoint kills the process at a named point, for tests that
// SIGKILL a real hub at an exact moment (the hub's RLHUB_TEST_*_CRASH
// variables). A spec is "point" or "point:N" for the Nth arrival; an
// empty spec is a nil Hook, on which every method is a no-op.
package crashpoint

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Hook counts arrivals at one named point. Safe for concurrent use.
type Hook struct {
	point string
	n     int64
	hits  atomic.Int64
}

// Parse reads a spec; nil for "".
func Parse(s string) *Hook {
	if s == "" {
		return nil
	}
	h := &Hook{point: s, n: 1}
	if p, n, ok := strings.Cut(s, ":"); ok {
		h.point = p
		if v, err := strconv.Atoi(n); err == nil && v > 0 {
			h.n = int64(v)
		}
	}
	return h
}

// Hit counts one arrival at point and reports whether it is the Nth.
func (h *Hook) Hit(point string) bool {
	return h != nil && h.point == point && h.hits.Add(1) == h.n
}

// At SIGKILLs this process the Nth time point is reached.
func (h *Hook) At(point string) {
	if h.Hit(point) {
		Kill()
	}
}

// Kill SIGKILLs this process and does not return.
func Kill() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
