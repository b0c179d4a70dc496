package wsync

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
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

// On a less preferred source the Failover probes the preferred one and
// goes back only to one serving a version at least as new as the one
// delivered, at an epoch no older (a stale relay is not gone back to).
func TestFailoverGoesBackOnlyToAnUpToDatePreferredSource(t *testing.T) {
	ctx := context.Background()
	pref, up := NewBoard("m"), NewBoard("m")
	var prefUp atomic.Bool
	snap := func(v, epoch uint64) *store.Snapshot {
		s := wsynctest.Snap(t, "m", v, 100)
		s.Epoch = epoch
		return s
	}
	f, err := NewFailover(FailoverConfig{Dialers: []Dialer{
		{Name: "pref", Dial: func(context.Context, uint64) (Source, io.Closer, error) {
			if !prefUp.Load() {
				return nil, nil, errors.New("down")
			}
			return pref, io.NopCloser(nil), nil
		}},
		{Name: "up", Dial: func(context.Context, uint64) (Source, io.Closer, error) { return up, io.NopCloser(nil), nil }},
	}, ProbeEvery: 10 * time.Millisecond, ProbeTimeout: 20 * time.Millisecond, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	up.Publish(ctx, snap(5, 3))
	if s, err := f.GetIfNewer(ctx, 0); err != nil || s == nil || s.Version != 5 || f.Current() != "up" {
		t.Fatalf("GetIfNewer(0) = %v, %v from %q; want v5 from up", s, err, f.Current())
	}
	// The preferred source is back, but behind (v4) or at an older epoch.
	prefUp.Store(true)
	pref.Publish(ctx, snap(4, 3))
	time.Sleep(20 * time.Millisecond)
	if s, err := f.GetIfNewer(ctx, 5); s != nil || err != nil || f.Current() != "up" {
		t.Fatalf("with the preferred source behind: %v, %v from %q; want nothing, still up", s, err, f.Current())
	}
	pref.Publish(ctx, snap(6, 2))
	time.Sleep(20 * time.Millisecond)
	if s, err := f.GetIfNewer(ctx, 5); s != nil || err != nil || f.Current() != "up" {
		t.Fatalf("with the preferred source at an older epoch: %v, %v from %q; want nothing, still up", s, err, f.Current())
	}
	// Up to date: WaitNewer goes back at its next probe and delivers v7.
	pref.Publish(ctx, snap(7, 3))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := f.WaitNewer(wctx, 5)
	if err != nil || s == nil || s.Version != 7 || f.Current() != "pref" {
		t.Fatalf("WaitNewer(5) = %v, %v from %q; want v7 from pref", s, err, f.Current())
	}
	if f.Switches() != 1 {
		t.Fatalf("Switches = %d, want 1", f.Switches())
	}
}
