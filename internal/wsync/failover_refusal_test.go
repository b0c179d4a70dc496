package wsync

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// badID is a collector ID the hub refuses for good (InvalidArgument: over
// maxIDBytes), as it refuses a wrong token: a refusal from the real
// service, not one made up by the test.
var badID = strings.Repeat("x", maxIDBytes+1)

func newTestFailover(t *testing.T, dialers ...Dialer) *Failover {
	t.Helper()
	f, err := NewFailover(FailoverConfig{Dialers: dialers, Backoff: 10 * time.Millisecond, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// When every source refuses for good, a Receiver on the Failover stops
// with the refusal instead of retrying until its context ends.
func TestFailoverReturnsWhenEverySourceRefusesForGood(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	f := newTestFailover(t, PushDialer("relay", dial(t, h.addr), badID, "m"), PushDialer("upstream", dial(t, h.addr), badID, "m"))
	r, err := NewReceiver(ReceiverConfig{Source: f})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("Run retried until its context ended")
	}
	if !errs.Permanent(err) || !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "relay") || !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("Run = %v; want both sources' InvalidArgument refusals", err)
	}
}

// One source refusing for good does not stop the collector while another
// serves.
func TestFailoverPassesARefusingSource(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	f := newTestFailover(t, PushDialer("relay", dial(t, h.addr), badID, "m"), PushDialer("upstream", dial(t, h.addr), "ok", "m"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := f.WaitNewer(ctx, 0)
	if err != nil || snap.Version != 1 || f.Current() != "upstream" {
		t.Fatalf("WaitNewer = v%v, %v from %q; want v1 from upstream", snap, err, f.Current())
	}
}

// A refusal next to a source that is only unreachable is not the end: the
// unreachable one may come back, so the Failover keeps trying.
func TestFailoverKeepsTryingWhileASourceIsOnlyUnreachable(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 100)
	dead := testkit.FreeAddr(t) // nothing listens there; below the ephemeral range, no source port either
	f := newTestFailover(t, PushDialer("relay", dial(t, dead), "ok", "m"), PushDialer("upstream", dial(t, h.addr), badID, "m"))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := f.WaitNewer(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer = %v; want it to keep trying until the deadline", err)
	}
}
