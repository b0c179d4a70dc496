// Command rlhub is the one binary for every rlhub role: hub, reducer,
// relay, learner, worker and the command-line client.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/rlhub/rlhub/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal asks for a graceful stop (serve's --stop-timeout);
	// a second one ends the process at once: the default action again.
	go func() { <-ctx.Done(); stop() }()
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
