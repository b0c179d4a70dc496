package wsync

import (
	"context"
	"errors"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

func TestReceiverAppliesOnlyNewer(t *testing.T) {
	b := NewBoard("m")
	var applied []uint64
	r, err := NewReceiver(ReceiverConfig{Source: b, Apply: func(s *store.Snapshot) error {
		applied = append(applied, s.Version)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, err := r.Poll(ctx); ok || err != nil {
		t.Fatalf("Poll on empty board = %v, %v; want false, nil", ok, err)
	}
	s3 := wsynctest.Snap(t, "m", 3, 4)
	if err := b.Publish(ctx, s3); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Poll(ctx); !ok || err != nil {
		t.Fatalf("Poll = %v, %v; want true, nil", ok, err)
	}
	// The same version twice, then an older one: no-ops.
	for _, s := range []*store.Snapshot{s3, wsynctest.Snap(t, "m", 2, 4)} {
		if ok, err := r.Offer(s); ok || err != nil {
			t.Fatalf("Offer(v%d) = %v, %v; want no-op", s.Version, ok, err)
		}
	}
	if ok, _ := r.Poll(ctx); ok {
		t.Fatal("Poll applied the version it already runs")
	}
	if got := r.Version(); got != 3 {
		t.Fatalf("Version = %d, want 3", got)
	}
	if len(applied) != 1 || applied[0] != 3 {
		t.Fatalf("applied %v, want [3]", applied)
	}
	if r.Current() != s3 {
		t.Fatal("Current is not the applied snapshot (in-process must not copy)")
	}
}

func TestReceiverApplyErrorKeepsVersion(t *testing.T) {
	boom := errors.New("boom")
	r, _ := NewReceiver(ReceiverConfig{Source: NewBoard(""), Start: 5, Apply: func(*store.Snapshot) error { return boom }})
	if _, err := r.Offer(wsynctest.Snap(t, "m", 6, 4)); !errors.Is(err, boom) {
		t.Fatalf("Offer error = %v, want boom", err)
	}
	if r.Version() != 5 {
		t.Fatalf("Version = %d after a failed apply, want 5", r.Version())
	}
	if _, err := NewReceiver(ReceiverConfig{}); err == nil {
		t.Fatal("NewReceiver without a Source succeeded")
	}
}

func TestCopyIntoRefusesOtherLayout(t *testing.T) {
	dst := tensor.NewF32("w", 4)
	sd, _ := tensor.NewStateDict(dst)
	apply := CopyInto(sd)
	if err := apply(wsynctest.Snap(t, "m", 1, 4)); err != nil {
		t.Fatal(err)
	}
	if err := wsynctest.Check(&store.Snapshot{Version: 1, Tensors: sd, Metadata: map[string]string{"version": "1"}}); err != nil {
		t.Fatalf("copied weights: %v", err)
	}
	before := append([]byte(nil), dst.Data...)
	if err := apply(wsynctest.Snap(t, "m", 2, 8)); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("apply of another shape = %v, want ErrInvalid", err)
	}
	if string(before) != string(dst.Data) {
		t.Fatal("a refused apply changed the weights")
	}
}

func TestBoardRules(t *testing.T) {
	ctx := context.Background()
	b := NewBoard("m")
	if err := b.Publish(ctx, wsynctest.Snap(t, "m", 2, 1)); err != nil {
		t.Fatal(err)
	}
	var se *errs.StaleError
	if err := b.Publish(ctx, wsynctest.Snap(t, "m", 2, 1)); !errors.As(err, &se) || se.CurrentVersion != 2 {
		t.Fatalf("republish v2 = %v, want StaleError at 2", err)
	}
	if err := b.Publish(ctx, wsynctest.Snap(t, "other", 3, 1)); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("wrong model = %v, want ErrInvalid", err)
	}
	if b.Newest().Version != 2 {
		t.Fatal("a refused publish changed the board")
	}

	// A waiter wakes on publish and on close.
	var wg sync.WaitGroup
	got := make(chan uint64, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s, err := b.WaitNewer(ctx, 2)
		if err != nil {
			t.Error(err)
			return
		}
		got <- s.Version
	}()
	if err := b.Publish(ctx, wsynctest.Snap(t, "m", 3, 1)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if v := <-got; v != 3 {
		t.Fatalf("WaitNewer = v%d, want v3", v)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := b.WaitNewer(ctx, 3); !errors.Is(err, errs.ErrUnavailable) {
			t.Errorf("WaitNewer after Close = %v, want ErrUnavailable", err)
		}
	}()
	b.Close()
	b.Close()
	wg.Wait()
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if _, err := NewBoard("").WaitNewer(cctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer past deadline = %v", err)
	}
}

func TestReceiverRunFollowsBoard(t *testing.T) {
	b := NewBoard("m")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := make(chan uint64, 16)
	r, _ := NewReceiver(ReceiverConfig{Source: b, OnApplied: func(v uint64) { seen <- v }})
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for v := uint64(1); v <= 3; v++ {
		if err := b.Publish(ctx, wsynctest.Snap(t, "m", v, 1)); err != nil {
			t.Fatal(err)
		}
		for r.Version() < v {
			select {
			case <-seen:
			case <-ctx.Done():
				t.Fatal("receiver did not follow")
			}
		}
	}
	b.Close()
	if err := <-done; !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Run after board close = %v, want ErrUnavailable", err)
	}
}
