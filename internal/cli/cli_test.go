package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rlhub/rlhub/internal/testkit"
)

func run(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, context.Background(), "version")
	if code != 0 || !strings.HasPrefix(out, "rlhub ") {
		t.Fatalf("version: code %d, out %q", code, out)
	}
	code, flagOut, _ := run(t, context.Background(), "--version")
	if code != 0 || flagOut != out {
		t.Fatalf("--version: code %d, out %q; want what `version` prints, %q", code, flagOut, out)
	}
}

// TestHelpShowsNoPlaceholderFromBackquotes: pflag turns a back-quoted
// word in a usage string into the flag's placeholder ("--policy rlhub
// train ars"); every flag's placeholder is its type or one word.
func TestHelpShowsNoPlaceholderFromBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.Contains(name, " ") {
				t.Errorf("%s --%s shows the placeholder %q in --help", c.CommandPath(), f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	var out bytes.Buffer
	walk(newRootCmd(&out, &out))
}

func TestUnknownCommandFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "no-such-command")
	if code == 0 || !strings.Contains(errOut, "unknown command") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}

func TestBadLogLevel(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "--log-level", "loud", "version")
	if code == 0 || !strings.Contains(errOut, "--log-level") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}

// freeAddr is a port that was free a moment ago: for an address nothing
// listens on, and for listeners that cannot report a port they bound
// (metrics, relays, etcd). It is below the ephemeral range
// (testkit.FreeAddr), so no outgoing connection takes it meanwhile; a hub
// is started with serveCLI instead.
func freeAddr(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

func TestServeAndPing(t *testing.T) {
	// serveCLI's cleanup cancels serve's context, as SIGINT does through
	// main's signal context, and checks it exits 0.
	addr := serveCLI(t, "--data", t.TempDir())
	code, out, errOut := run(t, context.Background(), "ping", "--hub", addr, "--timeout", "20s")
	if code != 0 || !strings.Contains(out, "SERVING") {
		t.Errorf("ping: code %d, out %q, err %q", code, out, errOut)
	}
}

// TestPingNoHubFails: a refused connection is reported as Unavailable,
// not waited on until the deadline (the old ping sat out its 10 s).
func TestPingNoHubFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "ping", "--hub", freeAddr(t), "--timeout", "10m")
	if code == 0 || !strings.Contains(errOut, "health check") || !strings.Contains(errOut, "Unavailable") {
		t.Fatalf("code %d, stderr %q; want an Unavailable health check", code, errOut)
	}
	// --wait waits for a hub that is starting: against none it is the
	// deadline that ends it.
	code, _, errOut = run(t, context.Background(), "ping", "--wait", "--hub", freeAddr(t), "--timeout", "300ms")
	if code == 0 || !strings.Contains(errOut, "DeadlineExceeded") {
		t.Fatalf("ping --wait: code %d, stderr %q; want DeadlineExceeded", code, errOut)
	}
}
