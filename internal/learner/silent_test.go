package learner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// silentHub is a real listener on 127.0.0.1 that accepts connections and
// holds them open, reading and discarding, as a SIGSTOPped or wedged hub
// does. With half it first writes the beginning of an HTTP/2 SETTINGS
// frame (its 9-byte header announcing 6 bytes, and 3 of them) and then
// nothing: a server that stopped mid-message.
func silentHub(t *testing.T, half bool) string {
	t.Helper()
	lis := testkit.Listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				if half {
					_, _ = c.Write([]byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0})
				}
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

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
	for _, half := range []bool{false, true} {
		name := map[bool]string{false: "silent", true: "half-sent"}[half]
		t.Run(name, func(t *testing.T) {
			log := detachLog{errs: make(chan string, 1)}
			ex := &Example{ID: "a"}
			cfg := ex.Config(silentHub(t, half))
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
