package wsync

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// failoverCollector follows a Failover source in a goroutine.
type failoverCollector struct {
	f      *Failover
	recv   *Receiver
	cancel context.CancelFunc
	done   chan error
}

func startFailoverCollector(t *testing.T, dialers ...Dialer) *failoverCollector {
	t.Helper()
	return startFailoverCollectorApply(t, wsynctest.Check, dialers...)
}

// startFailoverCollectorApply is startFailoverCollector with the
// collector's ApplyFunc.
func startFailoverCollectorApply(t *testing.T, apply ApplyFunc, dialers ...Dialer) *failoverCollector {
	t.Helper()
	f, err := NewFailover(FailoverConfig{Dialers: dialers, Backoff: 10 * time.Millisecond, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	c := &failoverCollector{f: f, done: make(chan error, 1)}
	c.recv, err = NewReceiver(ReceiverConfig{Source: f, Apply: apply, OnApplied: f.Running})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- c.recv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-c.done
		f.Close()
	})
	return c
}

func TestFailoverRejectsEmptyAndReportsAllDown(t *testing.T) {
	if _, err := NewFailover(FailoverConfig{}); err == nil {
		t.Fatal("NewFailover without dialers succeeded")
	}
	down := Dialer{Name: "down", Dial: func(context.Context, uint64) (Source, io.Closer, error) {
		return nil, nil, errors.New("refused")
	}}
	f, _ := NewFailover(FailoverConfig{Dialers: []Dialer{down, down}, Logger: testkit.Logger()})
	defer f.Close()
	ctx := context.Background()
	if _, err := f.GetIfNewer(ctx, 0); err == nil {
		t.Fatal("GetIfNewer with every source down succeeded")
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := f.WaitNewer(cctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer with every source down = %v, want to keep trying until the deadline", err)
	}
}
