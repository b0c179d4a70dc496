// Package cli implements the rlhub command line with cobra. Each subcommand
// lives in its own file and is added in newRootCmd; Run is what main calls,
// and tests call it too.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/buildinfo"
)

// Run executes the command line args and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "rlhub:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}

// exitError makes a command exit with a specific code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// globals are the flags every subcommand sees.
type globals struct {
	logLevel  string
	logFormat string
	stdout    io.Writer
	stderr    io.Writer
	// raw is the stderr given to Run when stderr was wrapped (a
	// lockedWriter); nil when stderr is it.
	raw    io.Writer
	logger *slog.Logger
	conn   connFlags // how clients reach a hub (TLS, token)
}

// rawStderr is the stderr Run was given (a terminal check looks at it).
func (g *globals) rawStderr() io.Writer {
	if g.raw != nil {
		return g.raw
	}
	return g.stderr
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "rlhub",
		Short:         "Backbone for distributed reinforcement-learning training",
		Long:          "rlhub keeps many processes on many machines training one policy together:\nan ordered model store, a push-pull gradient server, weight sync, a learner\naggregator and distributed ARS, in one binary.",
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// A one-shot command's --timeout is the deadline of its call:
			// 0 or less expired it at once, and the call then failed as if
			// the hub or etcd were down ("context deadline exceeded").
			if cmd.Flags().Lookup("timeout") != nil {
				if err := refuseNonPositive(cmd, "timeout"); err != nil {
					return err
				}
			}
			l, err := newLogger(g.stderr, g.logLevel, g.logFormat)
			if err != nil {
				return err
			}
			g.logger = l
			slog.SetDefault(l)
			dc, err := g.conn.load()
			if err != nil {
				return err
			}
			cmd.SetContext(withDial(cmd.Context(), dc))
			return applyClusterTarget(cmd)
		},
	}
	root.SetVersionTemplate("{{.Version}}\n") // --version prints what `rlhub version` does
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	g.conn.register(root)

	root.AddCommand(
		newVersionCmd(g),
		newServeCmd(g),
		newPingCmd(g),
		newReducerCmd(g),
		newModelCmd(g),
		newAggregatorCmd(g),
		newLearnerCmd(g),
		newTrainCmd(g),
		newWorkerCmd(g),
		newEvalCmd(g),
		newSyncCmd(g),
		newRelayCmd(g),
		newBenchCmd(g),
		newClusterCmd(g),
		newLoopBenchCmd(g),
		newCertCmd(g),
		newTokenCmd(g),
	)
	addClusterTargetFlags(root)
	return root
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
