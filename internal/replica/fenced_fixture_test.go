package replica_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// fencedFixture is a term's Fenced store (epoch 7) whose standbys the
// test names (setStandbys); s1, registered at first, never follows, so
// that no write is acknowledged while it is listed (each waits 200ms).
type fencedFixture struct {
	t        *testing.T
	f        *replica.Fenced
	src      *replica.Source
	standbys *atomic.Value
}

// newFencedFixture is a fencedFixture over inner, or over a memory store
// of its own if inner is nil (stuckStandby's).
func newFencedFixture(t *testing.T, inner store.Store) *fencedFixture {
	t.Helper()
	f, src, standbys := stuckStandby(t, 200*time.Millisecond)
	if inner != nil {
		f = &replica.Fenced{Store: inner, Epoch: 7, Source: src}
	}
	return &fencedFixture{t: t, f: f, src: src, standbys: standbys}
}

// newGatedFixture is a fencedFixture over a gatedPushes store.
func newGatedFixture(t *testing.T) (*fencedFixture, *gatedPushes) {
	t.Helper()
	g := &gatedPushes{Memory: newMemory(t, store.Config{})}
	return newFencedFixture(t, g), g
}

// newMemory is a memory store with cfg, closed when the test ends.
func newMemory(t *testing.T, cfg store.Config) *store.Memory {
	t.Helper()
	mem, err := store.NewMemory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return mem
}

// setStandbys makes s the registered standbys (none: every write is
// acknowledged at once).
func (x *fencedFixture) setStandbys(s ...string) {
	x.t.Helper()
	x.standbys.Store(s)
	if err := x.src.RefreshStandbys(context.Background()); err != nil {
		x.t.Fatal(err)
	}
}

// next is a push of name's version v on top of v-1, a blob of seed.
func (x *fencedFixture) next(name string, v, seed uint64) store.PushRequest {
	return store.PushRequest{Name: name, Version: v, Expect: v - 1, Blob: storetest.Blob(x.t, seed, 8)}
}

// pushNext pushes next(name, v, seed).
func (x *fencedFixture) pushNext(name string, v, seed uint64) error {
	_, err := x.f.Push(context.Background(), x.next(name, v, seed))
	return err
}

// pushAny pushes version v of m whatever m holds, a blob of seed.
func (x *fencedFixture) pushAny(v, seed uint64) error {
	_, err := x.f.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: storetest.Blob(x.t, seed, 8)})
	return err
}

// pushAcked pushes versions 1 to n of each of names (blobs of seed v) with
// no standby, each acknowledged at once.
func (x *fencedFixture) pushAcked(n uint64, names ...string) {
	x.t.Helper()
	x.setStandbys()
	for _, name := range names {
		for v := uint64(1); v <= n; v++ {
			if err := x.pushNext(name, v, v); err != nil {
				x.t.Fatal(err)
			}
		}
	}
}

// notAcked fails the test unless err, of the push what, says it was not
// acknowledged.
func (x *fencedFixture) notAcked(what string, err error) {
	x.t.Helper()
	if !errors.Is(err, store.ErrNotAcknowledged) {
		x.t.Fatalf("%s: %v, want not acknowledged", what, err)
	}
}

// deleteDuringPush starts pushAny(v, seed), lets it wait in g's store
// while m is deleted, and returns land, which lets it go on and returns
// its error (once the test ends if not before).
func (x *fencedFixture) deleteDuringPush(g *gatedPushes, v, seed uint64) (land func() error) {
	x.t.Helper()
	g.gate, g.entered = make(chan struct{}), make(chan struct{})
	gate := g.gate
	done := make(chan error, 1)
	go func() { done <- x.pushAny(v, seed) }()
	<-g.entered
	g.gate = nil
	var once sync.Once
	var err error
	land = func() error {
		once.Do(func() {
			close(gate)
			err = <-done
		})
		return err
	}
	x.t.Cleanup(func() { _ = land() })
	if err := x.f.Delete(context.Background(), "m"); err != nil {
		x.t.Fatal(err)
	}
	return land
}
