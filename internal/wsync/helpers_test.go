package wsync

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// TestRelayProcessKilled re-executes this binary as a relay process.
	if os.Getenv(childEnv) == "relay" {
		os.Exit(runRelayChild())
	}
	goleak.VerifyTestMain(m)
}

// childEnv names the helper process a re-executed test binary runs.
const childEnv = "RLHUB_WSYNC_CHILD"
