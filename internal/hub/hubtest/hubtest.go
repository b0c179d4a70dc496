// Package hubtest starts real hubs for the tests and benchmarks of other
// packages: every service on a loopback port, closed when the test ends.
package hubtest

import (
	"testing"

	"github.com/rlhub/rlhub/internal/hub"
)

// Start opens a hub with cfg (Listen defaults to 127.0.0.1:0), starts it
// and registers its Close with tb.Cleanup, so hubs started one after the
// other close in the reverse order. It fails tb when either step fails.
func Start(tb testing.TB, cfg hub.Config) *hub.Hub {
	tb.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	h, err := hub.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		tb.Fatal(err)
	}
	return h
}
