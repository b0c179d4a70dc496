package auth

import (
	"testing"

	"go.uber.org/goleak"
)

// WatchFile and the expiry timers of tracked calls must not outlive their
// owners.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
