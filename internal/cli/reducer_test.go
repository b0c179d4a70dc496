package cli

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReducerStatsAndRoleFlags: `rlhub reducer stats` prints the counters
// of a served hub; --role reducer without --primary is refused.
func TestReducerStatsAndRoleFlags(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "serve", "--role", "reducer", "--listen", "127.0.0.1:0", "--data", "")
	if code == 0 || !strings.Contains(errOut, "--primary") {
		t.Fatalf("serve --role reducer without --primary: code %d, stderr %q", code, errOut)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := run(t, ctx, "serve", "--listen", addr, "--data", "", "--reducer-secondaries", "2")
		done <- code
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, out, errOut := run(t, context.Background(), "reducer", "stats", "--hub", addr, "--timeout", "2s")
		if code == 0 {
			for _, want := range []string{"total", "primary", "secondary/s0", "secondary/s1", "pushed 0"} {
				if !strings.Contains(out, want) {
					t.Fatalf("stats output lacks %q:\n%s", want, out)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reducer stats: code %d, stderr %q", code, errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
