package reducer_test

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/cli"
)

// childEnv, when set, makes the test binary run `rlhub` with the arguments
// it holds (separated by \x1f) instead of the tests: the kill test starts
// secondary reducer processes this way.
const childEnv = "RLHUB_REDUCER_TEST_CHILD"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli.Run(ctx, strings.Split(args, "\x1f"), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}
