package cli

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRelayRefusesSegmentFlagsWithNoShm: --shm-group, --shm-slots and
// --shm-capacity configure the segment --no-shm says not to make; like
// --shm (TestRelayRefusesShmAndNoShm) they must be refused with it, not
// dropped without a word (the relay used to start and serve).
func TestRelayRefusesSegmentFlagsWithNoShm(t *testing.T) {
	for _, extra := range [][]string{{"--shm-group", "nosuchgroup"}, {"--shm-slots", "5"}, {"--shm-capacity", "100"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		code, out, errOut := run(t, ctx, append([]string{"relay", "--upstream", "127.0.0.1:1", "--model", "m", "--listen", "127.0.0.1:0", "--no-shm"}, extra...)...)
		cancel()
		if code == 0 || !strings.Contains(errOut, "no-shm") || !strings.Contains(errOut, strings.TrimPrefix(extra[0], "--")) {
			t.Errorf("relay --no-shm %v: exit %d, stdout %q; want a refusal naming both flags", extra, code, strings.TrimSpace(out))
		}
	}
}

// TestRelayRefusesZeroBodyLimits: as serve's, the relay's --body-timeout
// and --body-min-rate read 0 as their defaults; a 0 given is refused.
func TestRelayRefusesZeroBodyLimits(t *testing.T) {
	for _, flag := range []string{"--body-timeout", "--body-min-rate"} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		code, _, errOut := run(t, ctx, "relay", "--upstream", "127.0.0.1:1", "--model", "m", "--listen", "127.0.0.1:0", "--no-shm", flag, "0")
		cancel()
		if code == 0 || !strings.Contains(errOut, flag+" 0") {
			t.Errorf("relay %s 0: exit %d, %q; want a refusal", flag, code, errOut)
		}
	}
}
