package replica_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A publish waiting for its standbys' acknowledgements ends, not
// acknowledged and naming etcd, once a renewal of the term proof fails —
// here etcd stopped (SIGSTOP: its sockets stay open and it answers
// nothing, what a primary whose machine is cut off sees) — not after the
// ack timeout, and not once the lease is given up (TTL + max(TTL, 5 s)
// without an answer: the keeper's patience, meant to outlast an etcd
// election). Before, a push on a cut-off primary's machine waited until
// the step-down and its client never heard why
// (TestPartitionedPrimaryPublishesNothing).
func TestPublishWaitEndsWithTheTermProof(t *testing.T) {
	e := clustertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, term := electAlone(t, ctx, e, "proofwait")
	defer m.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = term.Hold(ctx) })
	testkit.Eventually(t, 10*time.Second, "the term proof", func() bool { return term.Valid() == nil })

	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	// A registered standby that never follows: no acknowledgement comes.
	// The ack timeout is far beyond the lease's give-up, so the error
	// says which of the three ended the wait.
	const ackTimeout = 90 * time.Second
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Acks: replica.AcksAll, AckTimeout: ackTimeout, Logger: testkit.Logger(),
		Standbys: func(context.Context) ([]string, error) { return []string{"s1"}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	f := &replica.Fenced{Store: mem, Epoch: term.Epoch, Source: src, Proof: term.Valid, Renew: term.Renew, ProofEnded: term.ProofEnded}

	done := make(chan error, 1)
	go func() { // the owner: the test receives from done below
		_, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 8)})
		done <- err
	}()
	testkit.Eventually(t, 10*time.Second, "the push to wait for its acknowledgement", func() bool {
		_, unit := src.Followers()
		return unit >= 1
	})
	select {
	case err := <-done:
		t.Fatalf("the push ended before etcd stopped, with no standby acknowledging: %v", err)
	default:
	}

	e.Stop()
	defer e.Cont()
	var perr error
	select {
	case perr = <-done:
	case <-time.After(ackTimeout + 30*time.Second):
		t.Fatal("the push never ended")
	}
	lost := false
	select {
	case <-term.Lost():
		lost = true
	default:
	}
	if !errors.Is(perr, store.ErrNotAcknowledged) || !strings.Contains(perr.Error(), "etcd cannot confirm this hub's term") {
		t.Fatalf("the waiting push ended with %v (lease given up: %v); want not acknowledged, naming etcd and the term", perr, lost)
	}
	if lost {
		t.Fatal("the push ended only once the lease was given up, not when the term proof ended")
	}
	if err := term.Valid(); err == nil {
		t.Fatal("the push failed for the term proof while the proof holds")
	}
	if s, err := mem.Get(context.Background(), "m", 1); err != nil || s.Version != 1 {
		t.Fatalf("v1 on the primary: %v %v, want it committed (hidden, not acknowledged)", s, err)
	}
	if _, err := f.Get(context.Background(), "m", 1); err == nil {
		t.Fatal("the unacknowledged v1 is visible")
	}
}

// A publish renewing an expired term proof itself (etcd silent: here
// stopped) when the term ends — the node deposing it, which stops the hub
// within a second — is answered at once with the standby refusal, not
// after its renewal's deadline with etcd's error: by then the step-down
// would have cut its connection, unanswered (seen on the lab).
func TestPublishRenewingTheProofEndsWithTheTerm(t *testing.T) {
	e := clustertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, term := electAlone(t, ctx, e, "proofover")
	defer m.Close()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	over, end := context.WithCancel(context.Background())
	defer end()
	var deposed atomic.Bool
	entered := make(chan struct{}, 1)
	f := &replica.Fenced{Store: mem, Epoch: term.Epoch, Proof: term.Valid, Over: over,
		Renew: func(ctx context.Context) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			return term.Renew(ctx)
		},
		Refusal: func() *cluster.Refusal {
			if deposed.Load() {
				return cluster.NewRefusal(nil)
			}
			return nil
		}}
	// No Hold: the proof from the campaign's renewal runs out by itself.
	if err := term.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	e.Stop()
	defer e.Cont()
	testkit.Eventually(t, 10*time.Second, "the term proof to run out", func() bool {
		return errors.Is(term.Valid(), cluster.ErrProofExpired)
	})

	done := make(chan error, 1)
	go func() { // the owner: the test receives from done below
		_, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 8)})
		done <- err
	}()
	testkit.Recv(t, entered, 10*time.Second, "the push to renew the proof itself")
	deposed.Store(true) // what the node's depose does, in this order
	end()
	perr := testkit.Recv(t, done, 30*time.Second, "the push's answer")
	if _, ok := cluster.AsRefusal(perr, nil); !ok {
		t.Fatalf("the push renewing the proof when the term ended: %v, want the standby refusal", perr)
	}
	if s, err := mem.Get(context.Background(), "m", 1); err == nil {
		t.Fatalf("the refused push committed v%d", s.Version)
	}
}

// electAlone joins cluster name on etcd e as its only member (2 s lease)
// and wins its election; the caller closes the member.
func electAlone(t *testing.T, ctx context.Context, e *clustertest.Etcd, name string) (*cluster.Member, *cluster.Term) {
	t.Helper()
	m, err := cluster.Join(ctx, cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name, ID: "p", Addr: "127.0.0.1:1",
		LeaseTTL: 2 * time.Second, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	term, err := m.Campaign(ctx)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, term
}
