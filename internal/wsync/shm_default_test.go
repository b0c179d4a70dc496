//go:build linux

package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// shmDefaultCollector is a Receiver copying into weights through a
// Failover over the default ShmDialer; reader is the Failover's current
// shm.Reader.
func shmDefaultCollector(t *testing.T, path string, weights *tensor.StateDict, check func(*store.Snapshot) error) (*Receiver, *Failover, func() *shm.Reader) {
	t.Helper()
	var mu sync.Mutex
	var reader *shm.Reader
	def := ShmDialer("relay-shm", path, "m")
	f, err := NewFailover(FailoverConfig{Logger: testkit.Logger(), Dialers: []Dialer{{Name: def.Name,
		Dial: func(ctx context.Context, have uint64) (Source, io.Closer, error) {
			src, closer, err := def.Dial(ctx, have)
			if err == nil {
				mu.Lock()
				reader = src.(*shm.Reader)
				mu.Unlock()
			}
			return src, closer, err
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	apply := CopyInto(weights)
	r, err := NewReceiver(ReceiverConfig{Source: f, Apply: func(s *store.Snapshot) error {
		if err := apply(s); err != nil {
			return err
		}
		if check != nil {
			return check(s)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r, f, func() *shm.Reader { mu.Lock(); defer mu.Unlock(); return reader }
}

// threeSlots is a segment of model "m" with 3 slots of 64 KiB (one lease
// entry), closed when the test ends.
func threeSlots(t *testing.T) (*shm.Writer, string) {
	t.Helper()
	path := wsynctest.ShmPath(t)
	w, err := shm.Create(shm.Config{Path: path, Name: "m", Capacity: 64 << 10, Slots: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, path
}

// weightsOf is n float32s named "w", zero.
func weightsOf(name string, n int) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.NewF32(name, int64(n)))
	return sd
}

// The default shm collector (ShmDialer + CopyInto) is a lease reader: each
// version goes from the leased slot straight into the collector's weights,
// whole, and the slot is given back right after the apply. Against a
// writer publishing flat out into 3 slots, every version applied is in the
// weights byte for byte when the apply returns.
func TestShmDialerDefaultLeasesIntoTheWeights(t *testing.T) {
	ctx := context.Background()
	w, path := threeSlots(t)
	const n = 4000
	weights := weightsOf("w", n)
	whole := func(s *store.Snapshot) error {
		// The weights, not the snapshot: the copy the collector keeps.
		want := make([]byte, 4*n)
		wsynctest.Fill(want, s.Version)
		if string(weights.Tensors()[0].Data) != string(want) {
			return fmt.Errorf("the weights after applying v%d are not v%d's bytes", s.Version, s.Version)
		}
		return nil
	}
	r, _, reader := shmDefaultCollector(t, path, weights, whole)
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, n)); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Poll(ctx); !ok || err != nil {
		t.Fatalf("Poll at v1 = %v, %v", ok, err)
	}
	rd := reader()
	if !rd.Leasing() || rd.CopyReason() != "" {
		t.Fatalf("the default shm source copies (%q); want a lease reader", rd.CopyReason())
	}
	if cur := r.Current(); cur == nil || cur.Version != 1 || cur.Blob != nil || cur.Tensors != nil {
		t.Fatalf("Current() = %+v; want v1 without the released slot's bytes", cur)
	}
	// Flat out: the receiver follows while the writer publishes.
	const last = 300
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	for v := uint64(2); v <= last; v++ {
		if err := w.Publish(ctx, wsynctest.Snap(t, "m", v, n)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the receiver at the last version", func() bool { return r.Version() == last })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want the apply never to fail", err)
	}
	st := rd.Stats()
	if st.InPlace != st.Reads || st.Released != st.Reads || st.Reads < 2 {
		t.Fatalf("reader stats %+v; want every read leased and released", st)
	}
	t.Logf("%d versions published, %d applied (leased, copied, released), %d lease retries", last, st.Reads, st.Retries)
}

// A version whose names or shapes differ from the weights is refused
// with errs.ErrInvalid and leaves the weights and the version as they
// were; the lease is still given back.
func TestShmDialerDefaultRefusesAMismatchUnchanged(t *testing.T) {
	ctx := context.Background()
	w, path := threeSlots(t)
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, 1000)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what    string
		weights *tensor.StateDict
	}{{"shape", weightsOf("w", 999)}, {"name", weightsOf("b", 1000)}} {
		data := c.weights.Tensors()[0].Data
		wsynctest.Fill(data, 77)
		before := append([]byte(nil), data...)
		r, f, reader := shmDefaultCollector(t, path, c.weights, nil)
		ok, err := r.Poll(ctx)
		if ok || !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("%s mismatch: Poll = %v, %v; want ErrInvalid", c.what, ok, err)
		}
		if string(data) != string(before) || r.Version() != 0 || r.Current() != nil {
			t.Fatalf("%s mismatch changed the weights or the version (v%d)", c.what, r.Version())
		}
		if st := reader().Stats(); !reader().Leasing() || st.Released != 1 {
			t.Fatalf("%s mismatch: reader stats %+v; want the refused version leased and released", c.what, st)
		}
		f.Close() // frees the lease entry for the next case
	}
}
