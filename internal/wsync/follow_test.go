package wsync

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// boardDialer dials b, counting the dials in n.
func boardDialer(name string, b *Board, n *atomic.Int32) Dialer {
	return Dialer{Name: name, Dial: func(context.Context, uint64) (Source, io.Closer, error) {
		n.Add(1)
		return b, nopCloser{}, nil
	}}
}

func snapAt(t *testing.T, v, epoch uint64) *store.Snapshot {
	s := wsynctest.Snap(t, "m", v, 16)
	s.Epoch = epoch
	return s
}

// A Failover never delivers a version whose epoch is older than one it
// delivered (a deposed primary's or a stale relay's, though numbered
// higher): it drops that source and waits for one in step; the version
// numbers between two deliveries count as skipped.
func TestFailoverNeverDeliversAnOlderEpoch(t *testing.T) {
	a, b := NewBoard("m"), NewBoard("m")
	ctx := context.Background()
	if err := a.Publish(ctx, snapAt(t, 1, 5)); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, snapAt(t, 2, 3)); err != nil { // newer number, older term
		t.Fatal(err)
	}
	var na, nb atomic.Int32
	f, err := NewFailover(FailoverConfig{Dialers: []Dialer{boardDialer("a", a, &na), boardDialer("b", b, &nb)},
		Backoff: time.Millisecond, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mu sync.Mutex
	var got []uint64
	r, err := NewReceiver(ReceiverConfig{Source: f, Apply: func(s *store.Snapshot) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s.Version)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	testkit.Eventually(t, 10*time.Second, "v1 from a", func() bool { return r.Version() == 1 })
	a.Close() // a dies: b offers v2 of epoch 3, which must not be delivered
	// b's board never fails: b is dialed again only after its v2 was refused.
	testkit.Eventually(t, 10*time.Second, "b dialed again after its v2 was refused", func() bool { return nb.Load() >= 2 })
	if err := b.Publish(ctx, snapAt(t, 4, 6)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "v4 of epoch 6 from b", func() bool { return r.Version() == 4 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []uint64{1, 4}) {
		t.Fatalf("applied %v, want [1 4] (v2 is of an older epoch than v1)", got)
	}
	if s := f.Skipped(); s != 2 {
		t.Fatalf("Skipped %d, want 2 (v2 refused, v3 never seen)", s)
	}
}

// A data-plane client given a cluster target needs the connection that
// follows it; the target never reaches a dialer raw.
func TestDataPlaneClusterTargetNeedsItsConnection(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:1,127.0.0.1:2", "etcd://127.0.0.1:2379/c"} {
		_, err := NewDataPlaneClient(DataPlaneConfig{Addr: addr, CollectorID: "c", Model: "m"})
		if !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s without Conn: %v, want ErrInvalid", addr, err)
		}
	}
}
