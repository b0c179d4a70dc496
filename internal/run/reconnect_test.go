package run

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// retry counts one reconnect per outage it rode out: not one per failed
// attempt, none for a call that went through at once, none for a
// permanent refusal.
func TestRetryCountsOneReconnectPerOutage(t *testing.T) {
	r := &runner{cfg: Config{ReconnectWindow: time.Minute, Logger: testkit.Logger()}}
	ctx := context.Background()
	failing := func(n int, last error) func(context.Context) error {
		return func(context.Context) error {
			if n > 0 {
				n--
				return fmt.Errorf("%w: hub down", errs.ErrUnavailable)
			}
			return last
		}
	}
	if err := r.retry(ctx, "call", failing(3, nil)); err != nil || r.reconnects != 1 {
		t.Fatalf("three failed attempts, then through: err %v, %d reconnects; want 1", err, r.reconnects)
	}
	if err := r.retry(ctx, "call", failing(0, nil)); err != nil || r.reconnects != 1 {
		t.Fatalf("through at once: err %v, %d reconnects; want still 1", err, r.reconnects)
	}
	refused := fmt.Errorf("%w: bad spec", errs.ErrInvalid)
	if err := r.retry(ctx, "call", failing(1, refused)); !errors.Is(err, errs.ErrInvalid) || r.reconnects != 1 {
		t.Fatalf("down, then refused for good: err %v, %d reconnects; want the refusal and still 1", err, r.reconnects)
	}
}
