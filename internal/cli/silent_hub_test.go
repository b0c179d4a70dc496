package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/testkit"
)

// One-shot commands against a hub that accepts the connection and never
// answers (silent, or after a valid HTTP/2 preface) exit non-zero once
// their --timeout has passed, with an error naming the deadline.
func TestCommandsAgainstSilentHubExitNonZero(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"preface-only", testkit.PrefaceOnly},
	} {
		addr := testkit.SilentHub(t, hub.first)
		for _, args := range [][]string{
			{"model", "ls", "--hub", addr, "--timeout", "300ms"},
			{"ping", "--hub", addr, "--timeout", "300ms", "--wait"},
			{"aggregator", "status", "--hub", addr, "--timeout", "300ms"},
		} {
			code, _, errOut := run(t, context.Background(), args...)
			if code == 0 || !strings.Contains(errOut, "deadline") {
				t.Errorf("%s: %v against a silent hub: exit %d, stderr %q; want non-zero and a deadline error", hub.name, args[:2], code, errOut)
			}
		}
	}
}
