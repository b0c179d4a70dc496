// Package storetest is the shared test suite every store.Store
// implementation runs (in-memory, file-backed), plus helpers to build
// model blobs. Call Run from the implementation's tests.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Opener returns a fresh, empty store configured by cfg. The suite closes
// it; the opener may register more cleanup with t.Cleanup.
type Opener func(t *testing.T, cfg store.Config) store.Store

// Blob returns the safetensors encoding of a small two-tensor state dict
// whose values derive from seed, with metadata {"seed": seed}. floats sets
// the size of the larger tensor.
func Blob(t testing.TB, seed uint64, floats int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	w := make([]float32, floats)
	for i := range w {
		w[i] = rng.Float32()
	}
	b := []float32{float32(seed), -1}
	sd, err := tensor.NewStateDict(
		tensor.FromFloat32s("layer.weight", []int64{int64(floats)}, w),
		tensor.FromFloat32s("layer.bias", []int64{2}, b),
	)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := safetensors.Encode(sd, map[string]string{"seed": fmt.Sprint(seed)})
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// ctx returns a context with a generous deadline for one test.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, o Opener, cfg store.Config) store.Store {
	s := o(t, cfg)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// MustPush pushes and fails the test on error.
func MustPush(t testing.TB, s store.Store, req store.PushRequest) store.Info {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Push(c, req)
	if err != nil {
		t.Fatalf("Push(%s v%d expect %d epoch %d): %v", req.Name, req.Version, req.Expect, req.Epoch, err)
	}
	return info
}

// State is a comparable summary of everything a store holds.
type State struct {
	Infos []store.Info
	Blobs map[string][]byte // "name@version" → blob
}

// Capture records s's complete readable state.
func Capture(t testing.TB, s store.Store) State {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	infos, err := s.List(c)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	st := State{Infos: infos, Blobs: map[string][]byte{}}
	for _, in := range infos {
		for _, v := range in.Retained {
			snap, err := s.Get(c, in.Name, v)
			if err != nil {
				t.Fatalf("Get(%s, %d): %v", in.Name, v, err)
			}
			st.Blobs[fmt.Sprintf("%s@%d", in.Name, v)] = snap.Blob
		}
	}
	return st
}

// Diff reports the first difference between two states, or "".
func (a State) Diff(b State) string {
	same := len(a.Infos) == len(b.Infos)
	for i := 0; same && i < len(a.Infos); i++ {
		x, y := a.Infos[i], b.Infos[i]
		same = x.Name == y.Name && x.Version == y.Version && x.Epoch == y.Epoch && x.Bytes == y.Bytes &&
			x.Created.Equal(y.Created) && fmt.Sprint(x.Retained) == fmt.Sprint(y.Retained) && x.Owner == y.Owner
	}
	if !same {
		return fmt.Sprintf("infos differ:\n  %v\n  %v", a.Infos, b.Infos)
	}
	if len(a.Blobs) != len(b.Blobs) {
		return fmt.Sprintf("%d blobs vs %d", len(a.Blobs), len(b.Blobs))
	}
	for k, v := range a.Blobs {
		if !bytes.Equal(v, b.Blobs[k]) {
			return fmt.Sprintf("blob %s differs", k)
		}
	}
	return ""
}

// fixedClock is a clock that advances one second per call.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// Run runs the whole suite against the implementation o opens.
func Run(t *testing.T, o Opener) { run(t, o, false) }

// RunRemote runs the suite against a client of a remote store: the same
// rules, except that snapshots are the caller's own copies (no aliasing
// between readers) and carry no Seq.
func RunRemote(t *testing.T, o Opener) { run(t, o, true) }

func run(t *testing.T, o Opener, remote bool) {
	t.Run("PushGet", func(t *testing.T) { testPushGet(t, o) })
	t.Run("CompareAndSet", func(t *testing.T) { testCAS(t, o) })
	t.Run("EpochFencing", func(t *testing.T) { testEpoch(t, o) })
	t.Run("BadInputLeavesStoreUnchanged", func(t *testing.T) { testBadInput(t, o) })
	t.Run("UnknownName", func(t *testing.T) { testUnknown(t, o) })
	t.Run("Retention", func(t *testing.T) { testRetention(t, o) })
	t.Run("GetIfNewer", func(t *testing.T) { testGetIfNewer(t, o) })
	if !remote {
		t.Run("SnapshotsShared", func(t *testing.T) { testShared(t, o) })
		t.Run("UntakenVersionsGoBack", func(t *testing.T) { testRecycle(t, o) })
		t.Run("LentVersionsGoBackWhenReturned", func(t *testing.T) { testLend(t, o) })
	}
	t.Run("ConcurrentWritersOneWins", func(t *testing.T) { testRace(t, o) })
	t.Run("WatchersUnderFastWriter", func(t *testing.T) { testWatchers(t, o, remote) })
	t.Run("WaitForNewModel", func(t *testing.T) { testWaitNew(t, o) })
	t.Run("List", func(t *testing.T) { testList(t, o) })
	t.Run("Ownership", func(t *testing.T) { testOwnership(t, o) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, o) })
	t.Run("Close", func(t *testing.T) { testClose(t, o) })
}

func testPushGet(t *testing.T, o Opener) {
	clk := &fixedClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := open(t, o, store.Config{Now: clk.Now})
	blob := Blob(t, 1, 100)
	want := bytes.Clone(blob)
	info := MustPush(t, s, store.PushRequest{Name: "policy", Version: 3, Expect: 0, Epoch: 2, Blob: blob})
	if info.Name != "policy" || info.Version != 3 || info.Epoch != 2 || info.Bytes != int64(len(want)) || fmt.Sprint(info.Retained) != "[3]" {
		t.Errorf("Push info = %+v", info)
	}
	if !info.Created.Equal(time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)) {
		t.Errorf("Created = %v, want the injected clock's first tick", info.Created)
	}
	for _, v := range []uint64{0, 3} {
		snap, err := s.Get(ctx(t), "policy", v)
		if err != nil {
			t.Fatalf("Get(policy, %d): %v", v, err)
		}
		if snap.Name != "policy" || snap.Version != 3 || snap.Epoch != 2 || !bytes.Equal(snap.Blob, want) {
			t.Errorf("Get(policy, %d) = %s v%d e%d %d bytes", v, snap.Name, snap.Version, snap.Epoch, len(snap.Blob))
		}
		if snap.Tensors == nil || snap.Tensors.Len() != 2 || snap.Tensors.Get("layer.bias") == nil {
			t.Fatalf("Get: tensors not decoded: %v", snap.Tensors)
		}
		bias, err := snap.Tensors.Get("layer.bias").Float32s()
		if err != nil || bias[0] != 1 || bias[1] != -1 {
			t.Errorf("bias = %v, %v; want [1 -1]", bias, err)
		}
		if snap.Metadata["seed"] != "1" {
			t.Errorf("metadata = %v", snap.Metadata)
		}
		if !snap.Created.Equal(info.Created) {
			t.Errorf("snapshot Created %v != info Created %v", snap.Created, info.Created)
		}
	}
}

func wantStale(t *testing.T, err error, curV, curE uint64, what string) {
	t.Helper()
	var se *errs.StaleError
	if !errors.As(err, &se) || !errors.Is(err, errs.ErrStale) {
		t.Fatalf("%s: err = %v, want *errs.StaleError", what, err)
	}
	if se.CurrentVersion != curV || se.CurrentEpoch != curE {
		t.Errorf("%s: StaleError current = v%d e%d, want v%d e%d", what, se.CurrentVersion, se.CurrentEpoch, curV, curE)
	}
}

func testCAS(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	// A new model must be pushed with Expect 0 (or ExpectAny).
	_, err := s.Push(ctx(t), store.PushRequest{Name: "m", Version: 1, Expect: 5, Blob: Blob(t, 1, 4)})
	wantStale(t, err, 0, 0, "expect 5 on a new model")
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: Blob(t, 1, 4)})
	before := Capture(t, s)
	for _, tc := range []struct {
		name            string
		version, expect uint64
	}{
		{"expect 0 when it exists", 2, 0},
		{"wrong expectation", 3, 2},
		{"same version", 1, 1},
		{"lower version", 1, ExpectAnyForTest},
		{"equal version with any", 1, store.ExpectAny},
	} {
		_, err := s.Push(ctx(t), store.PushRequest{Name: "m", Version: tc.version, Expect: tc.expect, Blob: Blob(t, 9, 4)})
		wantStale(t, err, 1, 0, tc.name)
		if d := Capture(t, s).Diff(before); d != "" {
			t.Fatalf("%s changed the store: %s", tc.name, d)
		}
	}
	MustPush(t, s, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 10, Expect: store.ExpectAny, Blob: Blob(t, 10, 4)})
	snap, err := s.Get(ctx(t), "m", 0)
	if err != nil || snap.Version != 10 {
		t.Fatalf("newest = %v, %v; want version 10", snap, err)
	}
}

// ExpectAnyForTest is store.ExpectAny, named for table readability.
const ExpectAnyForTest = store.ExpectAny

func testEpoch(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Epoch: 1, Blob: Blob(t, 1, 4)})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 2, Expect: 1, Epoch: 3, Blob: Blob(t, 2, 4)})
	before := Capture(t, s)
	// A deposed writer (epoch 2 < 3) is refused even with a higher version
	// and a correct expectation.
	_, err := s.Push(ctx(t), store.PushRequest{Name: "m", Version: 100, Expect: 2, Epoch: 2, Blob: Blob(t, 3, 4)})
	wantStale(t, err, 2, 3, "older epoch")
	_, err = s.Push(ctx(t), store.PushRequest{Name: "m", Version: 100, Expect: store.ExpectAny, Epoch: 0, Blob: Blob(t, 3, 4)})
	wantStale(t, err, 2, 3, "older epoch with ExpectAny")
	if d := Capture(t, s).Diff(before); d != "" {
		t.Fatalf("fenced push changed the store: %s", d)
	}
	// The same epoch and a newer one may continue.
	MustPush(t, s, store.PushRequest{Name: "m", Version: 3, Expect: 2, Epoch: 3, Blob: Blob(t, 3, 4)})
	info := MustPush(t, s, store.PushRequest{Name: "m", Version: 4, Expect: 3, Epoch: 7, Blob: Blob(t, 4, 4)})
	if info.Epoch != 7 {
		t.Errorf("epoch after push = %d, want 7", info.Epoch)
	}
	// Epochs are per model.
	MustPush(t, s, store.PushRequest{Name: "other", Version: 1, Expect: 0, Epoch: 0, Blob: Blob(t, 4, 4)})
}

func testBadInput(t *testing.T, o Opener) {
	s := open(t, o, store.Config{MaxModelBytes: 4096, MaxNameBytes: 16})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: Blob(t, 1, 4)})
	before := Capture(t, s)
	good := Blob(t, 2, 4)
	corrupt := bytes.Clone(good)
	copy(corrupt[8:], `{"x":`) // break the JSON header
	badOffsets := bytes.Clone(good)
	badOffsets[0]++ // header length now points past the JSON
	for _, tc := range []struct {
		name string
		req  store.PushRequest
		want error
	}{
		{"empty name", store.PushRequest{Name: "", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"bad name", store.PushRequest{Name: "../etc", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"long name", store.PushRequest{Name: "abcdefghijklmnopq", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"version 0", store.PushRequest{Name: "m", Version: 0, Expect: store.ExpectAny, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"corrupt blob", store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: corrupt}, errs.ErrInvalid},
		{"bad header length", store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: badOffsets}, errs.ErrInvalid},
		{"truncated blob", store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: good[:len(good)-3]}, errs.ErrInvalid},
		{"empty blob", store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: nil}, errs.ErrInvalid},
		{"oversize", store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: Blob(t, 2, 2000)}, errs.ErrFull},
		{"version 2^64-1", store.PushRequest{Name: "m", Version: ^uint64(0), Expect: store.ExpectAny, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"epoch 2^64-1", store.PushRequest{Name: "m", Version: 2, Expect: 1, Epoch: ^uint64(0), Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"version over MaxVersion", store.PushRequest{Name: "m", Version: store.MaxVersion + 1, Expect: store.ExpectAny, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"version jump over MaxStep", store.PushRequest{Name: "m", Version: 1 + store.MaxStep + 1, Expect: 1, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
		{"epoch jump over MaxStep", store.PushRequest{Name: "m", Version: 2, Expect: 1, Epoch: store.MaxStep + 1, Blob: Blob(t, 2, 4)}, errs.ErrInvalid},
	} {
		_, err := s.Push(ctx(t), tc.req)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if d := Capture(t, s).Diff(before); d != "" {
			t.Fatalf("%s changed the store: %s", tc.name, d)
		}
	}
	if p, ok := s.(store.Prechecker); ok {
		if err := p.Precheck("m", 5000); !errors.Is(err, errs.ErrFull) {
			t.Errorf("Precheck oversize = %v, want ErrFull", err)
		}
		if err := p.Precheck("a b", 10); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("Precheck bad name = %v, want ErrInvalid", err)
		}
		if err := p.Precheck("m", 4096); err != nil {
			t.Errorf("Precheck at the limit = %v", err)
		}
	}
	// The bounds are inclusive: a jump of exactly MaxStep lands.
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1 + store.MaxStep, Expect: 1, Epoch: store.MaxStep, Blob: Blob(t, 2, 4)})
}

// testOwnership checks rule 6 on a store that records owners.
func testOwnership(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	c, ok := s.(store.Claimer)
	if !ok {
		t.Skip("store records no owners")
	}
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Blob: Blob(t, 1, 4)})
	if err := c.Claim(ctx(t), "m", "reducer"); err != nil {
		t.Fatal(err)
	}
	if err := c.Claim(ctx(t), "m", "reducer"); err != nil {
		t.Fatalf("second claim by the owner: %v", err)
	}
	if err := c.Claim(ctx(t), "m", "ars"); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("claim of an owned model by another: %v, want ErrPermission", err)
	}
	before := Capture(t, s)
	for _, owner := range []string{"", "ars"} {
		_, err := s.Push(ctx(t), store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Owner: owner, Claim: true, Blob: Blob(t, 2, 4)})
		if !errors.Is(err, errs.ErrPermission) {
			t.Fatalf("push by %q over a model owned by reducer: %v, want ErrPermission", owner, err)
		}
		if d := Capture(t, s).Diff(before); d != "" {
			t.Fatalf("a refused push changed the store: %s", d)
		}
	}
	info := MustPush(t, s, store.PushRequest{Name: "m", Version: 2, Expect: 1, Owner: "reducer", Blob: Blob(t, 2, 4)})
	if info.Owner != "reducer" {
		t.Fatalf("Info.Owner = %q", info.Owner)
	}
	if err := c.Release(ctx(t), "m", "ars"); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("release by a non-owner: %v", err)
	}
	if err := c.Release(ctx(t), "m", "reducer"); err != nil {
		t.Fatal(err)
	}
	MustPush(t, s, store.PushRequest{Name: "m", Version: 3, Expect: 2, Blob: Blob(t, 3, 4)})

	// A push that creates a model and claims it is one step.
	MustPush(t, s, store.PushRequest{Name: "run", Version: 1, Owner: "ars", Claim: true, Blob: Blob(t, 1, 4)})
	if _, err := s.Push(ctx(t), store.PushRequest{Name: "run", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)}); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("anonymous push over a claimed run: %v", err)
	}
	// A claim of a model with no versions yet reserves the name.
	if err := c.Claim(ctx(t), "later", "reducer"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(ctx(t), store.PushRequest{Name: "later", Version: 1, Blob: Blob(t, 1, 4)}); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("anonymous push to a reserved name: %v", err)
	}
	MustPush(t, s, store.PushRequest{Name: "later", Version: 1, Owner: "reducer", Blob: Blob(t, 1, 4)})
}

// testDelete checks Deleter on a store that has it.
func testDelete(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	d, ok := s.(store.Deleter)
	if !ok {
		t.Skip("store cannot delete")
	}
	if err := d.Delete(ctx(t), "nope"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Delete unknown = %v, want ErrNotFound", err)
	}
	if err := d.Delete(ctx(t), "../x"); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("Delete bad name = %v, want ErrInvalid", err)
	}
	MustPush(t, s, store.PushRequest{Name: "m", Version: 7, Epoch: 5, Blob: Blob(t, 1, 4)})
	MustPush(t, s, store.PushRequest{Name: "keep", Version: 1, Blob: Blob(t, 1, 4)})
	if c, ok := s.(store.Claimer); ok {
		if err := c.Claim(ctx(t), "m", "reducer"); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Delete(ctx(t), "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx(t), "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
	infos, err := s.List(ctx(t))
	if err != nil || len(infos) != 1 || infos[0].Name != "keep" {
		t.Fatalf("List after Delete = %v, %v; want only keep", infos, err)
	}
	// Gone with its epoch and owner: version 1 at epoch 0 creates it anew.
	info := MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: Blob(t, 2, 4)})
	if info.Version != 1 || info.Epoch != 0 || info.Owner != "" {
		t.Fatalf("push after Delete: %+v", info)
	}
}

func testUnknown(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	if _, err := s.Get(ctx(t), "nope", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("Get unknown = %v, want ErrNotFound", err)
	}
	if _, err := s.GetIfNewer(ctx(t), "nope", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("GetIfNewer unknown = %v, want ErrNotFound", err)
	}
	MustPush(t, s, store.PushRequest{Name: "m", Version: 5, Expect: 0, Blob: Blob(t, 1, 4)})
	if _, err := s.Get(ctx(t), "m", 4); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("Get unknown version = %v, want ErrNotFound", err)
	}
	// A watcher on an unknown name does not make it listed.
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	if _, err := s.WaitNewer(c, "ghost", 0); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitNewer(cancelled) = %v, want context.Canceled", err)
	}
	infos, err := s.List(ctx(t))
	if err != nil || len(infos) != 1 || infos[0].Name != "m" {
		t.Errorf("List = %v, %v; want only m", infos, err)
	}
}

func testRetention(t *testing.T, o Opener) {
	s := open(t, o, store.Config{Retain: 2})
	for v := uint64(1); v <= 5; v++ {
		MustPush(t, s, store.PushRequest{Name: "m", Version: v * 10, Expect: (v - 1) * 10, Blob: Blob(t, v, 8)})
	}
	infos, err := s.List(ctx(t))
	if err != nil || len(infos) != 1 || fmt.Sprint(infos[0].Retained) != "[40 50]" {
		t.Fatalf("List = %v, %v; want retained [40 50]", infos, err)
	}
	if _, err := s.Get(ctx(t), "m", 30); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("Get dropped version = %v, want ErrNotFound", err)
	}
	snap, err := s.Get(ctx(t), "m", 40)
	if err != nil || !bytes.Equal(snap.Blob, Blob(t, 4, 8)) {
		t.Errorf("Get retained version 40: %v", err)
	}
}

func testGetIfNewer(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 7, Expect: 0, Blob: Blob(t, 1, 4)})
	for _, than := range []uint64{7, 8, 1000} {
		snap, err := s.GetIfNewer(ctx(t), "m", than)
		if snap != nil || err != nil {
			t.Errorf("GetIfNewer(m, %d) = %v, %v; want not modified (nil, nil)", than, snap, err)
		}
	}
	snap, err := s.GetIfNewer(ctx(t), "m", 6)
	if err != nil || snap == nil || snap.Version != 7 {
		t.Errorf("GetIfNewer(m, 6) = %v, %v; want version 7", snap, err)
	}
}

func testShared(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: Blob(t, 1, 1024)})
	a, err := s.Get(ctx(t), "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.WaitNewer(ctx(t), "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	if &a.Blob[0] != &b.Blob[0] {
		t.Error("two readers got different copies of the same version's bytes")
	}
	w := a.Tensors.Get("layer.weight")
	if w == nil || !bytesWithin(w.Data, a.Blob) {
		t.Error("decoded tensors do not alias the snapshot blob")
	}
}

func bytesWithin(inner, outer []byte) bool {
	if len(inner) == 0 {
		return true
	}
	for i := range outer {
		if &outer[i] == &inner[0] {
			return i+len(inner) <= len(outer)
		}
	}
	return false
}

func testRace(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	const writers = 8
	for round := uint64(1); round <= 20; round++ {
		var wg sync.WaitGroup
		results := make([]error, writers)
		for w := range writers {
			wg.Go(func() {
				_, results[w] = s.Push(ctx(t), store.PushRequest{Name: "race", Version: round, Expect: round - 1, Epoch: 1, Blob: Blob(t, round*100+uint64(w), 16)})
			})
		}
		wg.Wait()
		wins := 0
		for w, err := range results {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, errs.ErrStale):
				var se *errs.StaleError
				if errors.As(err, &se) && se.CurrentVersion != round {
					t.Errorf("round %d writer %d: loser told current version %d, want %d", round, w, se.CurrentVersion, round)
				}
			default:
				t.Errorf("round %d writer %d: %v", round, w, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d writers won, want exactly 1", round, wins)
		}
		snap, err := s.Get(ctx(t), "race", 0)
		if err != nil || snap.Version != round {
			t.Fatalf("round %d: newest = %v, %v", round, snap, err)
		}
	}
}

func testWatchers(t *testing.T, o Opener, remote bool) {
	s := open(t, o, store.Config{Retain: 2})
	const last = 200
	const watchers = 4
	var wg sync.WaitGroup
	seen := make([][]uint64, watchers)
	for w := range watchers {
		wg.Go(func() {
			var after uint64
			for after < last {
				snap, err := s.WaitNewer(ctx(t), "fast", after)
				if err != nil {
					t.Errorf("watcher %d: %v", w, err)
					return
				}
				if !remote && snap.Seq != snap.Version {
					t.Errorf("watcher %d: version %d has Seq %d, want %d (one per push)", w, snap.Version, snap.Seq, snap.Version)
				}
				seen[w] = append(seen[w], snap.Version)
				after = snap.Version
			}
		})
	}
	// A stalled watcher: it took version 1 and does not ask again until the
	// writer is done. The writer must not wait for it.
	stalled := make(chan *store.Snapshot, 1)
	var swg sync.WaitGroup
	swg.Go(func() {
		snap, err := s.WaitNewer(ctx(t), "fast", 0)
		if err != nil {
			t.Errorf("stalled watcher: %v", err)
		}
		stalled <- snap
	})
	for v := uint64(1); v <= last; v++ {
		MustPush(t, s, store.PushRequest{Name: "fast", Version: v, Expect: v - 1, Blob: Blob(t, v, 4)})
	}
	wg.Wait()
	swg.Wait()
	if snap := <-stalled; snap == nil || snap.Version < 1 {
		t.Fatalf("stalled watcher got %v", snap)
	}
	snap, err := s.WaitNewer(ctx(t), "fast", 1)
	if err != nil || snap.Version != last {
		t.Fatalf("stalled watcher asking again got %v, %v; want the newest (%d), skipping the rest", snap, err, last)
	}
	for w, vs := range seen {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Fatalf("watcher %d saw %d after %d", w, vs[i], vs[i-1])
			}
		}
		if len(vs) == 0 || vs[len(vs)-1] != last {
			t.Fatalf("watcher %d ended at %v, want %d", w, vs, last)
		}
	}
}

func testWaitNew(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	got := make(chan *store.Snapshot, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		snap, err := s.WaitNewer(ctx(t), "later", 0)
		if err != nil {
			t.Errorf("WaitNewer: %v", err)
		}
		got <- snap
	})
	MustPush(t, s, store.PushRequest{Name: "later", Version: 4, Expect: 0, Blob: Blob(t, 4, 4)})
	if snap := <-got; snap == nil || snap.Version != 4 {
		t.Fatalf("WaitNewer on a new model got %v, want version 4", snap)
	}
	if _, err := s.WaitNewer(ctx(t), "bad name!", 0); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("WaitNewer(bad name) = %v, want ErrInvalid", err)
	}
}

func testList(t *testing.T, o Opener) {
	s := open(t, o, store.Config{})
	for i, name := range []string{"zeta", "alpha", "mid/dle"} {
		MustPush(t, s, store.PushRequest{Name: name, Version: uint64(i + 1), Expect: 0, Epoch: uint64(i), Blob: Blob(t, uint64(i), 4)})
	}
	infos, err := s.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Name)
		if in.Bytes != int64(len(Blob(t, 0, 4))) || in.Version == 0 || in.Created.IsZero() {
			t.Errorf("info %+v incomplete", in)
		}
	}
	if fmt.Sprint(names) != "[alpha mid/dle zeta]" {
		t.Errorf("List names = %v, want sorted", names)
	}
}

func testClose(t *testing.T, o Opener) {
	s := o(t, store.Config{})
	MustPush(t, s, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: Blob(t, 1, 4)})
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := s.WaitNewer(ctx(t), "m", 1)
		errc <- err
	})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	if err := <-errc; !errors.Is(err, errs.ErrUnavailable) {
		t.Errorf("watcher after Close got %v, want ErrUnavailable", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Push(ctx(t), store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: Blob(t, 2, 4)}); !errors.Is(err, errs.ErrUnavailable) {
		t.Errorf("Push after Close = %v, want ErrUnavailable", err)
	}
}

// testRecycle: rule 5. With Retain 2, a version dropped from the store goes
// back to its writer (the very blob it pushed) only if no reader took it:
// Get, GetIfNewer that returns it and WaitNewer take a version; a
// GetIfNewer that answers "not modified" does not. Recycle runs without
// the store's locks (it calls List).
func testRecycle(t *testing.T, o Opener) {
	s := open(t, o, store.Config{Retain: 2})
	var back []uint64
	pushed := map[uint64][]byte{}
	push := func(v uint64) {
		t.Helper()
		blob := Blob(t, v, 256)
		pushed[v] = blob
		MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: blob, Recycle: func(b []byte) {
			if &b[0] != &pushed[v][0] {
				t.Errorf("v%d: recycled a blob that is not the one pushed", v)
			}
			if _, err := s.List(context.Background()); err != nil { // deadlocks if a lock is held
				t.Errorf("List inside Recycle: %v", err)
			}
			back = append(back, v)
		}})
	}
	want := func(vs ...uint64) {
		t.Helper()
		if fmt.Sprint(back) != fmt.Sprint(vs) {
			t.Fatalf("versions given back %v, want %v", back, vs)
		}
	}
	push(1)
	push(2)
	want()
	push(3) // drops v1, untaken
	want(1)
	if _, err := s.Get(ctx(t), "m", 2); err != nil { // takes v2
		t.Fatal(err)
	}
	if snap, err := s.GetIfNewer(ctx(t), "m", 3); err != nil || snap != nil { // not modified: takes nothing
		t.Fatalf("GetIfNewer(3) = %v, %v", snap, err)
	}
	push(4) // drops v2, taken
	want(1)
	push(5) // drops v3, untaken: the not-modified answer did not take it
	want(1, 3)
	if snap, err := s.WaitNewer(ctx(t), "m", 4); err != nil || snap.Version != 5 { // takes v5
		t.Fatalf("WaitNewer(4) = %v, %v", snap, err)
	}
	if snap, err := s.GetIfNewer(ctx(t), "m", 0); err != nil || snap.Version != 5 {
		t.Fatalf("GetIfNewer(0) = %v, %v", snap, err)
	}
	push(6) // drops v4, untaken
	want(1, 3, 4)
	push(7) // drops v5, taken
	want(1, 3, 4)
	if _, err := s.Get(ctx(t), "m", 0); err != nil { // the newest, v7: taken
		t.Fatal(err)
	}
	push(8) // drops v6
	push(9) // drops v7, taken
	want(1, 3, 4, 6)
}

// testLend: a lent version (store.Lender) is not taken: once dropped it
// goes back to its writer when its last loan is returned, not before, and
// a second call of a release changes nothing. A version lent and also
// taken never goes back. LendNewer waits like WaitNewer.
func testLend(t *testing.T, o Opener) {
	s := open(t, o, store.Config{Retain: 1})
	l, ok := s.(store.Lender)
	if !ok {
		t.Fatalf("%T does not lend", s)
	}
	var back []uint64
	push := func(v uint64) {
		t.Helper()
		MustPush(t, s, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: Blob(t, v, 256),
			Recycle: func([]byte) { back = append(back, v) }})
	}
	want := func(vs ...uint64) {
		t.Helper()
		if fmt.Sprint(back) != fmt.Sprint(vs) {
			t.Fatalf("versions given back %v, want %v", back, vs)
		}
	}
	push(1)
	a, relA, err := l.Lend(ctx(t), "m", 1)
	if err != nil || a.Version != 1 {
		t.Fatalf("Lend(1) = %v, %v", a, err)
	}
	b, relB, err := l.Lend(ctx(t), "m", 0)
	if err != nil || b != a {
		t.Fatalf("Lend(newest) = %v, %v; want the same snapshot", b, err)
	}
	push(2) // drops v1, lent twice
	want()
	relA()
	relA() // a second call is a no-op
	want()
	relB()
	want(1)

	got := make(chan *store.Snapshot, 1)
	var relC func()
	go func() {
		c, rel, err := l.LendNewer(ctx(t), "m", 2)
		if err != nil {
			t.Error(err)
		}
		relC = rel
		got <- c
	}()
	push(3) // drops v2, untaken
	want(1, 2)
	c := <-got
	if c == nil || c.Version != 3 {
		t.Fatalf("LendNewer(2) = %v", c)
	}
	if _, err := s.Get(ctx(t), "m", 3); err != nil { // taken as well
		t.Fatal(err)
	}
	relC()
	push(4) // drops v3: lent and taken
	want(1, 2)
	if _, _, err := l.Lend(ctx(t), "m", 3); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Lend of a dropped version: %v, want not found", err)
	}
	d, relD, err := l.LendNewer(ctx(t), "m", 0)
	if err != nil || d.Version != 4 {
		t.Fatalf("LendNewer(0) = %v, %v", d, err)
	}
	relD() // returned before it is dropped
	push(5)
	want(1, 2, 4)
}

// BeforePush is Store with Check called before every Push, told which
// version is about to be pushed ("before pushing NAME vN"): a test of
// what a writer must have done by then (testkit.StateNames.Check).
type BeforePush struct {
	store.Store
	Check func(when string)
}

// Push checks, then pushes through Store.
func (b BeforePush) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	b.Check(fmt.Sprintf("before pushing %s v%d", req.Name, req.Version))
	return b.Store.Push(ctx, req)
}
