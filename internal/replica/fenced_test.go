package replica_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// stuckStandby is a term's Fenced store (epoch 7) on a memory store whose
// one registered standby, s1, never follows: no write is acknowledged
// (each waits ackTimeout) until the test stores another list in standbys
// and refreshes src.
func stuckStandby(t *testing.T, ackTimeout time.Duration) (*replica.Fenced, *replica.Source, *atomic.Value) {
	t.Helper()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	standbys := new(atomic.Value)
	standbys.Store([]string{"s1"})
	src, err := replica.NewSource(replica.SourceConfig{DataDir: t.TempDir(), Acks: replica.AcksAll, AckTimeout: ackTimeout,
		Standbys: func(context.Context) ([]string, error) { return standbys.Load().([]string), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return &replica.Fenced{Store: mem, Epoch: 7, Source: src}, src, standbys
}

// A version whose acknowledgement has not come is invisible to every
// read, and stays so when it fails; the next acknowledged version makes
// both visible, at the term's epoch whatever the writer asked for.
func TestFencedHidesUnacknowledgedVersions(t *testing.T) {
	f, src, standbys := stuckStandby(t, 300*time.Millisecond)
	ctx := context.Background()

	done := make(chan error, 1)
	go func() {
		_, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: 0, Epoch: 99, Blob: storetest.Blob(t, 1, 8)})
		done <- err
	}()
	// While the push waits, and after it failed, no read shows v1.
	deadline := time.After(10 * time.Second)
	for waiting := true; waiting; {
		select {
		case err := <-done:
			if !errors.Is(err, errs.ErrUnavailable) {
				t.Fatalf("unacknowledged push: %v, want Unavailable", err)
			}
			waiting = false
		case <-deadline:
			t.Fatal("the push neither failed nor was acknowledged")
		default:
		}
		if _, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
			t.Fatalf("Get of an unacknowledged version: %v, want NotFound", err)
		}
		if s, err := f.GetIfNewer(ctx, "m", 0); s != nil || err != nil && !errors.Is(err, errs.ErrNotFound) {
			t.Fatalf("GetIfNewer of an unacknowledged version: %v %v", s, err)
		}
		if infos, _ := f.List(ctx); len(infos) != 0 {
			t.Fatalf("List shows %+v", infos)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := f.WaitNewer(wctx, "m", 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer returned a hidden version: %v", err)
	}
	// The writer pushes v1 again (Python's client retries an Unavailable
	// push): the same bytes are acknowledged again, and fail as the first
	// push did; other bytes are refused as not newer. Either way v1 stays
	// hidden: a reader must not get a version no standby may hold.
	if _, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: storetest.Blob(t, 1, 8)}); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("push of v1 again: %v, want not acknowledged", err)
	}
	if _, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: storetest.Blob(t, 5, 8)}); !errors.Is(err, errs.ErrStale) {
		t.Fatalf("push of other bytes as v1: %v, want stale", err)
	}
	if _, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("after the pushes again, Get: %v, want NotFound (v1 hidden)", err)
	}
	if infos, _ := f.List(ctx); len(infos) != 0 {
		t.Fatalf("after the pushes again, List shows %+v", infos)
	}

	standbys.Store([]string(nil))                    // the standby left: nothing to wait for
	if err := src.RefreshStandbys(ctx); err != nil { // what the node does every quarter lease
		t.Fatal(err)
	}
	got := make(chan *store.Snapshot, 1)
	go func() {
		s, err := f.WaitNewer(ctx, "m", 0)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	if _, err := f.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 8)}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s.Version != 2 || s.Epoch != 7 {
			t.Fatalf("watcher got v%d epoch %d, want v2 at the term's epoch 7", s.Version, s.Epoch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher never saw the acknowledged version")
	}
	if s, err := f.Get(ctx, "m", 1); err != nil || s.Version != 1 {
		t.Fatalf("v1 after v2 was acknowledged: %v %v", s, err)
	}
}

// A push that committed its version and could not acknowledge it, pushed
// again once the standbys can acknowledge, is acknowledged: the client's
// retry gets the version (visible, at the term's epoch), not a refusal of
// its own version as stale. A retry from another owner is refused.
func TestFencedRetriedPushIsAcknowledgedAgain(t *testing.T) {
	f, src, standbys := stuckStandby(t, 200*time.Millisecond)
	ctx := context.Background()
	push := func(owner string) (store.Info, error) {
		return f.Push(ctx, store.PushRequest{Name: "m", Version: 3, Expect: store.ExpectAny, Owner: owner, Blob: storetest.Blob(t, 3, 8)})
	}
	if _, err := push(""); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("first push: %v, want not acknowledged", err)
	}
	standbys.Store([]string(nil)) // the stuck standby left
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := push("someone"); !errors.Is(err, errs.ErrStale) && !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("the same bytes from another owner: %v, want a refusal", err)
	}
	if _, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("v3 visible after another owner's refused push: %v", err)
	}
	info, err := push("")
	if err != nil {
		t.Fatalf("the push again: %v, want it acknowledged", err)
	}
	if info.Version != 3 || info.Epoch != 7 {
		t.Fatalf("the push again answered %+v, want v3 at epoch 7", info)
	}
	s, err := f.Get(ctx, "m", 0)
	if err != nil || s.Version != 3 || s.Epoch != 7 {
		t.Fatalf("Get after the push again: %v %v, want v3 at epoch 7", s, err)
	}
}

// listCounter is a store that keeps an owner index and counts Lists.
type listCounter struct {
	*store.Memory
	lists atomic.Int64
}

func (l *listCounter) List(ctx context.Context) ([]store.Info, error) {
	l.lists.Add(1)
	return l.Memory.List(ctx)
}

// Fenced forwards the owner index: a quota check on a cluster primary
// reads what an owner holds without listing the store.
func TestFencedForwardsOwnerUsage(t *testing.T) {
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	inner := &listCounter{Memory: mem}
	var s store.Store = &replica.Fenced{Store: inner, Epoch: 3}
	ur, ok := s.(store.UsageReader)
	if !ok {
		t.Fatal("Fenced does not implement store.UsageReader")
	}
	ctx := context.Background()
	blob := storetest.Blob(t, 1, 64)
	for _, name := range []string{"a", "b"} {
		if err := s.(store.Claimer).Claim(ctx, name, "tok:alice"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Push(ctx, store.PushRequest{Name: name, Version: 1, Owner: "tok:alice", Blob: blob}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Push(ctx, store.PushRequest{Name: "c", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	models, bytes, owns, nameBytes := ur.OwnerUsage("tok:alice", "b")
	wm, wb, wo, wn := mem.OwnerUsage("tok:alice", "b")
	if models != 2 || !owns || bytes != wb || nameBytes != wn || models != wm || owns != wo || bytes != 2*nameBytes {
		t.Fatalf("OwnerUsage = %d models %d bytes owns %v (%d bytes); the store says %d %d %v %d", models, bytes, owns, nameBytes, wm, wb, wo, wn)
	}
	if m, _, o, _ := ur.OwnerUsage("tok:bob", "c"); m != 0 || o {
		t.Fatalf("bob holds %d models (owns c: %v), want none", m, o)
	}
	if n := inner.lists.Load(); n != 0 {
		t.Fatalf("the usage reads listed the store %d times", n)
	}
}

// WriteState fences a service's own state like a push: refused before it
// runs on a deposed primary or without the term proof, run once
// otherwise.
func TestFencedWriteState(t *testing.T) {
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var deposed atomic.Bool
	var proofErr atomic.Pointer[error]
	f := &replica.Fenced{Store: mem, Epoch: 4,
		Refusal: func() *cluster.Refusal {
			if deposed.Load() {
				return cluster.NewRefusal(nil)
			}
			return nil
		},
		Proof: func() error {
			if p := proofErr.Load(); p != nil {
				return *p
			}
			return nil
		}}
	var sw store.StateWriter = f
	ran := 0
	write := func() error { ran++; return nil }
	ctx := context.Background()
	if err := sw.WriteState(ctx, write); err != nil || ran != 1 {
		t.Fatalf("WriteState on a primary: %v, ran %d times", err, ran)
	}
	gone := errors.New("etcd unreachable")
	proofErr.Store(&gone)
	if err := sw.WriteState(ctx, write); !errors.Is(err, errs.ErrUnavailable) || ran != 1 {
		t.Fatalf("WriteState without the term proof: %v, ran %d times; want Unavailable before running", err, ran)
	}
	proofErr.Store(nil)
	deposed.Store(true)
	var r *cluster.Refusal
	if err := sw.WriteState(ctx, write); !errors.As(err, &r) || ran != 1 {
		t.Fatalf("WriteState when deposed: %v, ran %d times; want the refusal before running", err, ran)
	}
	deposed.Store(false)
	boom := errors.New("disk full")
	if err := sw.WriteState(ctx, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("WriteState whose write fails: %v", err)
	}
}

// gatedPushes is a memory store whose Push, once gate is set, waits in
// the store until the test closes it (entered says it is there).
type gatedPushes struct {
	*store.Memory
	gate, entered chan struct{}
}

func (g *gatedPushes) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	if gate := g.gate; gate != nil {
		close(g.entered)
		<-gate
	}
	return g.Memory.Push(ctx, req)
}

// A push the store refuses as stale — a writer that lost the race for a
// version, or the retry of an acknowledged push — never hides the version
// readers already have, on the primary that acknowledged it and on a new
// primary whose store followed it; after a Delete, a new push is hidden
// until acknowledged whatever version it has.
func TestFencedStalePushHidesNothing(t *testing.T) {
	ctx := context.Background()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	g := &gatedPushes{Memory: mem}
	push := func(f *replica.Fenced, version uint64, seed uint64) error {
		_, err := f.Push(ctx, store.PushRequest{Name: "m", Version: version, Expect: store.ExpectAny, Blob: storetest.Blob(t, seed, 8)})
		return err
	}
	// newest asserts what readers see of m while a stale push of version
	// waits in the store, and that the push is then refused.
	refusedUnseen := func(f *replica.Fenced, version uint64, want uint64) {
		t.Helper()
		g.gate, g.entered = make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- push(f, version, 99) }()
		<-g.entered
		if s, err := f.Get(ctx, "m", 0); err != nil || s.Version != want {
			t.Errorf("Get during a stale push of v%d: %v %v, want v%d", version, versionOf(s), err, want)
		}
		if s, err := f.GetIfNewer(ctx, "m", want-1); err != nil || s == nil || s.Version != want {
			t.Errorf("GetIfNewer during a stale push of v%d: %v %v, want v%d", version, versionOf(s), err, want)
		}
		if infos, err := f.List(ctx); err != nil || len(infos) != 1 || infos[0].Version != want {
			t.Errorf("List during a stale push of v%d: %+v %v, want v%d", version, infos, err, want)
		}
		close(g.gate)
		g.gate = nil
		if err := <-done; !errors.Is(err, errs.ErrStale) {
			t.Fatalf("stale push of v%d: %v, want stale", version, err)
		}
	}

	f := &replica.Fenced{Store: g, Epoch: 7}
	for v := uint64(1); v <= 2; v++ {
		if err := push(f, v, v); err != nil {
			t.Fatal(err)
		}
	}
	refusedUnseen(f, 2, 2) // the newest, again
	refusedUnseen(f, 1, 2) // an older one

	// A new primary (a new term's Fenced) over the store it followed.
	f = &replica.Fenced{Store: g, Epoch: 8}
	refusedUnseen(f, 2, 2)

	// After a Delete whose acknowledgement never comes, a push of v1 (at
	// or below what was acknowledged before) stays hidden.
	f, src, standbys := stuckStandby(t, 200*time.Millisecond)
	standbys.Store([]string(nil))
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	for v := uint64(1); v <= 2; v++ {
		if err := push(f, v, v); err != nil {
			t.Fatal(err)
		}
	}
	standbys.Store([]string{"s1"})
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, "m"); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("Delete with a stuck standby: %v, want not acknowledged", err)
	}
	if err := push(f, 1, 5); !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("push after the Delete: %v, want not acknowledged", err)
	}
	if s, err := f.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Get after the Delete and an unacknowledged push of v1: %v %v, want NotFound", versionOf(s), err)
	}
}

// versionOf is s's version, "none" for nil.
func versionOf(s *store.Snapshot) string {
	if s == nil {
		return "none"
	}
	return fmt.Sprintf("v%d", s.Version)
}
