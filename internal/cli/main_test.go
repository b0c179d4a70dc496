package cli

import (
	"context"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the tests under goleak: every command stops and waits for
// the goroutines it starts before Run returns. With serveChildEnv set the
// test binary is instead `rlhub serve` (limits_test.go).
func TestMain(m *testing.M) {
	if args := os.Getenv(serveChildEnv); args != "" {
		os.Exit(Run(context.Background(), strings.Fields(args), os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}
