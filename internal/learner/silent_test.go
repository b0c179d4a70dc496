package learner

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// detachLog sends the err of every "detached" warning the learner logs.
type detachLog struct{ errs chan string }

func (h detachLog) Enabled(context.Context, slog.Level) bool { return true }
func (h detachLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h detachLog) WithGroup(string) slog.Handler            { return h }
func (h detachLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "detached") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			select {
			case h.errs <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}

// A learner whose hub accepts the connection and never answers, or stops
// mid-message, ends each attach after WelcomeTimeout with an error in the
// log that says what it waited for, and re-attaches; it does not wait
// silently forever for a connection that never becomes ready.
func TestAttachToSilentHubIsBounded(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{{"silent", testkit.Silent}, {"half-sent", testkit.HalfSettings}} {
		t.Run(hub.name, func(t *testing.T) {
			log := detachLog{errs: make(chan string, 1)}
			ex := &Example{ID: "a"}
			cfg := ex.Config(testkit.SilentHub(t, hub.first))
			cfg.WelcomeTimeout = 100 * time.Millisecond
			cfg.Logger = slog.New(log)
			ctx, cancel := context.WithCancel(context.Background())
			var runErr error
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				runErr = Run(ctx, cfg)
			}()
			t.Cleanup(func() { cancel(); <-finished }) // also when Recv fails the test
			got := testkit.Recv(t, log.errs, 30*time.Second, "the learner to give up an attach to a silent hub")
			cancel()
			<-finished
			if !errors.Is(runErr, context.Canceled) {
				t.Errorf("Run = %v, want the context's error", runErr)
			}
			if !strings.Contains(got, "no welcome") {
				t.Fatalf("detached with %q, want the error to say no welcome came", got)
			}
		})
	}
}
