package reducer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
)

// ackStore is a cluster primary's store in miniature (a fake of
// replica.Fenced): its next refuse pushes fail before the commit with
// Unavailable, its next unacked pushes commit and fail with
// store.ErrNotAcknowledged, as do that many Acknowledge calls after.
type ackStore struct {
	store.Store
	mu              sync.Mutex
	refuse, unacked int
	acks            int // Acknowledge calls
	ackCalled       chan struct{}
}

func (a *ackStore) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refuse > 0 {
		a.refuse--
		return store.Info{}, fmt.Errorf("%w: etcd cannot confirm this hub's term", errs.ErrUnavailable)
	}
	info, err := a.Store.Push(ctx, req)
	if err == nil && a.unacked > 0 {
		return info, fmt.Errorf("%w: 0 of 1 standbys acknowledged", store.ErrNotAcknowledged)
	}
	return info, err
}

// Claim commits the claim (store.Claimer) and, while unacked, fails
// not acknowledged.
func (a *ackStore) Claim(ctx context.Context, name, owner string) error {
	if err := a.Store.(store.Claimer).Claim(ctx, name, owner); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unacked > 0 {
		return fmt.Errorf("%w: 0 of 1 standbys acknowledged", store.ErrNotAcknowledged)
	}
	return nil
}

func (a *ackStore) Release(ctx context.Context, name, owner string) error {
	return a.Store.(store.Claimer).Release(ctx, name, owner)
}

func (a *ackStore) Acknowledge(ctx context.Context, name string, version uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acks++
	if a.ackCalled != nil {
		select {
		case a.ackCalled <- struct{}{}:
		default:
		}
	}
	if a.unacked > 0 {
		a.unacked--
		return fmt.Errorf("%w: 0 of 1 standbys acknowledged", store.ErrNotAcknowledged)
	}
	return nil
}

func (a *ackStore) set(refuse, unacked int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refuse, a.unacked = refuse, unacked
}

// newAckPrimary is a primary on an ackStore seen through the hub's Owned
// view (store.AsAcknowledger finds the store under it).
func newAckPrimary(t *testing.T) (*ackStore, *Primary, uint64) {
	t.Helper()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	pushModel(t, mem, "m", testLayout(3))
	// The registration's claim is not acknowledged at first either.
	as := &ackStore{Store: mem, unacked: 2}
	p, err := NewPrimary(PrimaryConfig{Store: store.Owned{Store: as, Owner: "reducer"}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, _, err := p.Register(context.Background(), ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	// The claim's: 2 failing, then 1 holding; then the registration's
	// own (Register returns once its files are acknowledged).
	if as.unacked != 0 || as.acks != 4 {
		t.Fatalf("registration: %d acknowledgements asked, %d faults left; want 4 (2 failing) and 0", as.acks, as.unacked)
	}
	as.acks = 0
	sess, _, err := p.Attach(context.Background(), Secondary{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	return as, p, sess
}

func forwardOne(p *Primary, sess, seq uint64) (uint64, error) {
	ctx := context.Background()
	id := reduce.ID{Client: "c", Seq: seq}
	if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
		return 0, err
	}
	return p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(3, "c", seq)})
}

// On a cluster a step whose push is refused before its commit is pushed
// again, and one committed but not acknowledged (a registration's claim
// too: newAckPrimary) is acknowledged again:
// each step publishes the next version, every gradient counts applied,
// none dropped, and the model keeps taking gradients.
func TestReplicatedPublishIsCarriedThrough(t *testing.T) {
	as, p, sess := newAckPrimary(t)
	faults := []struct{ refuse, unacked int }{{}, {refuse: 2}, {unacked: 2}, {refuse: 1, unacked: 1}, {}}
	for i, f := range faults {
		as.set(f.refuse, f.unacked)
		v, err := forwardOne(p, sess, uint64(i+1))
		if err != nil || v != uint64(i+2) {
			t.Fatalf("step %d (refused %d, unacknowledged %d): v%d, %v; want v%d", i+1, f.refuse, f.unacked, v, err, i+2)
		}
	}
	if as.acks != 5 {
		t.Errorf("%d acknowledgements asked again, want 5 (3 for step 3, 2 for step 4: each until one holds)", as.acks)
	}
	st := p.Stats().Models["m"]
	if st.Version != 6 || st.Counters.Applied != 5 || st.Counters.DroppedTotal() != 0 {
		t.Errorf("model after the faults: version %d applied %d dropped %v; want 6, 5, none", st.Version, st.Counters.Applied, st.Counters.Dropped)
	}
	if snap, err := as.Store.Get(context.Background(), "m", 0); err != nil || snap.Version != 6 {
		t.Errorf("store newest: %v, %v; want v6", snap, err)
	}
}

// A step retrying its acknowledgement ends when the primary closes: the
// forward fails (publish_failed) and Close returns (it waits for steps).
func TestReplicatedPublishRetryEndsAtClose(t *testing.T) {
	as, p, sess := newAckPrimary(t)
	as.ackCalled = make(chan struct{}, 1)
	as.set(0, 1<<30)
	done := make(chan error, 1)
	go func() {
		_, err := forwardOne(p, sess, 1)
		done <- err
	}()
	select {
	case <-as.ackCalled: // retrying
	case err := <-done:
		t.Fatalf("the forward ended (%v) without acknowledging again", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("forward retrying at close: %v, want not acknowledged", err)
	}
}

// commitStore is an ackStore that commits a push and leaves its
// acknowledgement to the caller (store.Committer, as replica.Fenced does
// on a cluster): the acknowledgement waits for gate, or fails not
// acknowledged when its context ends first, as Fenced's wait for the
// standbys does.
type commitStore struct {
	*ackStore
	gate chan struct{}
}

func (c *commitStore) PushCommitted(ctx context.Context, req store.PushRequest) (store.Info, func(context.Context) error, error) {
	info, err := c.ackStore.Store.Push(ctx, req)
	if err != nil {
		return info, nil, err
	}
	return info, func(ctx context.Context) error {
		select {
		case <-c.gate:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", store.ErrNotAcknowledged, ctx.Err())
		}
	}, nil
}

// A step committed on a cluster is acknowledged after Forward returns:
// the call that forwarded it (a remote secondary's RPC) has ended by
// then, and its context with it. The acknowledgement must outlive it: the
// step is applied once the standbys acknowledge, and the model steps on.
func TestCommittedStepSettlesAfterItsCallerEnded(t *testing.T) {
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	pushModel(t, mem, "m", testLayout(3))
	cs := &commitStore{ackStore: &ackStore{Store: mem}, gate: make(chan struct{})}
	p, err := NewPrimary(PrimaryConfig{Store: store.Owned{Store: cs, Owner: "reducer"}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.Register(context.Background(), ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	sess, _, err := p.Attach(context.Background(), Secondary{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	id := reduce.ID{Client: "c", Seq: 1}
	if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
		t.Fatal(err)
	}
	v, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(3, "c", 1)})
	if err != nil || v != 2 {
		t.Fatalf("forward: v%d, %v; want v2 committed", v, err)
	}
	cancel() // the forwarding call is over
	if st := p.Stats().Models["m"]; st.Counters.Applied != 0 {
		t.Fatalf("applied %d before the acknowledgement", st.Counters.Applied)
	}
	close(cs.gate) // the standbys acknowledge
	testkit.Eventually(t, 10*time.Second, "the step applied once acknowledged", func() bool {
		st := p.Stats().Models["m"]
		if st.Counters.DroppedTotal() != 0 {
			t.Fatalf("the step was dropped: %v", st.Counters.Dropped)
		}
		return st.Counters.Applied == 1 && st.Version == 2
	})
	if v, err := forwardOne(p, sess, 2); err != nil || v != 3 {
		t.Fatalf("the next step: v%d, %v; want v3", v, err)
	}
}
