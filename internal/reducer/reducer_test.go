package reducer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// replay recomputes a run sequentially with plain loops: for each applied
// step in version order, sum the members' gradients in reduction order
// (float32, starting from zero, each times its weight), apply the
// reduction, clip by the float64 global norm, step the optimizer.
func replay(t *testing.T, init *tensor.StateDict, mc ModelConfig, recs []applyRec, grad func(reduce.ID) *tensor.StateDict) *tensor.StateDict {
	t.Helper()
	mc.Model = "m"
	if err := mc.validate(); err != nil {
		t.Fatal(err)
	}
	params := init.Clone()
	opt, err := optim.New(mc.Optimizer, params)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].version < recs[j].version })
	for _, r := range recs {
		sum := params.Clone()
		for _, tn := range sum.Tensors() {
			clear(f32(t, sum, tn.Name))
		}
		for i, id := range r.members {
			g := grad(id)
			for _, tn := range sum.Tensors() {
				s, x := f32(t, sum, tn.Name), f32(t, g, tn.Name)
				for j := range s {
					s[j] += r.weights[i] * x[j]
				}
			}
		}
		var ss float64
		for _, tn := range sum.Tensors() {
			s := f32(t, sum, tn.Name)
			if mc.Reduction == reduce.Mean {
				k := float32(1 / float64(len(r.members)))
				for j := range s {
					s[j] *= k
				}
			}
			for _, v := range s {
				ss += float64(v) * float64(v)
			}
		}
		if norm := math.Sqrt(ss); mc.GradientMax > 0 && mc.GradientMax/(norm+1e-6) < 1 { // torch's clip_grad_norm_
			k := float32(mc.GradientMax / (norm + 1e-6))
			for _, tn := range sum.Tensors() {
				s := f32(t, sum, tn.Name)
				for j := range s {
					s[j] *= k
				}
			}
		}
		if err := opt.Step(params, sum); err != nil {
			t.Fatal(err)
		}
	}
	return params
}

// TestConcurrentClientsTwoSecondaries: 4 clients push 30 gradients each,
// concurrently, through two secondaries. Every gradient is applied exactly
// once; the final weights equal a sequential replay of the same batches in
// the same order (tolerance: 1e-6 relative; the sums are bit-exact, only the
// clip factor's float64 norm is summed in another order); the counters add
// up.
func TestConcurrentClientsTwoSecondaries(t *testing.T) {
	forTransports(t, testConcurrentClientsTwoSecondaries)
}

func testConcurrentClientsTwoSecondaries(t *testing.T, transport string) {
	const n, clients, pushes = 64, 4, 30
	init := fill(testLayout(n), rand.New(rand.NewPCG(1, 2)), 1)
	e := newTestEnv(t, Config{Secondaries: 2, BatchSize: 3, MaxWait: 2 * time.Millisecond, MaxQueue: 64}, init)
	e.transport = transport
	defer e.checkTransport()
	mc := ModelConfig{Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}, Reduction: reduce.Mean, GradientMax: 0.5}
	e.register(mc)
	waitAttached(t, e.svc.Primary(), 2)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	used := make([]map[string]int, clients)
	errc := make(chan error, clients)
	for c := range clients {
		id := fmt.Sprintf("client-%d", c)
		cl := e.client(id, 0)
		used[c] = map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := uint64(1); s <= pushes; s++ {
				base := e.newest().Version
				rc, err := cl.PushGrad(ctx, "m", base, gradFor(n, id, s))
				if err != nil {
					errc <- fmt.Errorf("%s seq %d: %w", id, s, err)
					return
				}
				if rc.Seq != s {
					errc <- fmt.Errorf("%s: seq %d, want %d", id, rc.Seq, s)
					return
				}
				used[c][rc.ID]++
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := e.waitSettled()

	e.mu.Lock()
	recs := slices.Clone(e.applied)
	e.mu.Unlock()
	seen := map[reduce.ID]int{}
	for _, r := range recs {
		for _, id := range r.members {
			seen[id]++
		}
	}
	if len(seen) != clients*pushes {
		t.Fatalf("%d distinct gradients applied, want %d", len(seen), clients*pushes)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("%v applied %d times", id, k)
		}
	}
	for c := range clients {
		if len(used[c]) != 2 {
			t.Logf("client %d used secondaries %v (random choice)", c, used[c])
		}
	}
	if st.Total.Pushed != clients*pushes || st.Total.Applied != clients*pushes || st.Total.DroppedTotal() != 0 {
		t.Fatalf("counters: %+v", st.Total)
	}
	if st.Total.Reduced != st.Total.Applied || st.Total.Steps != uint64(len(recs)) {
		t.Fatalf("reduced %d applied %d steps %d (%d applies seen)", st.Total.Reduced, st.Total.Applied, st.Total.Steps, len(recs))
	}
	for _, part := range []string{"secondary/s0", "secondary/s1"} {
		if st.Parts[part].Pushed == 0 {
			t.Errorf("%s took no pushes: %+v", part, st.Parts)
		}
	}

	want := replay(t, init, mc, recs, func(id reduce.ID) *tensor.StateDict { return gradFor(n, id.Client, id.Seq) })
	got := e.newest()
	if got.Version != 1+uint64(len(recs)) {
		t.Fatalf("store at version %d after %d steps from 1", got.Version, len(recs))
	}
	var maxRel float64
	for _, name := range []string{"fc.weight", "fc.bias"} {
		g, w := f32(t, got.Tensors, name), f32(t, want, name)
		for i := range g {
			d := math.Abs(float64(g[i]-w[i])) / math.Max(1e-3, math.Abs(float64(w[i])))
			maxRel = max(maxRel, d)
			if d > 1e-6 {
				t.Fatalf("%s[%d] = %v, sequential reference %v", name, i, g[i], w[i])
			}
		}
	}
	t.Logf("%d steps over %d gradients; max relative difference to the sequential reference %.2g", len(recs), len(seen), maxRel)
}

// blockingStore holds every model push until release is closed.
type blockingStore struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		return store.Info{}, ctx.Err()
	}
	return b.Store.Push(ctx, req)
}

// TestRejections: each bad push is a clear gRPC error, counted under its
// reason, and leaves the model unchanged.
func TestRejections(t *testing.T) { forTransports(t, testRejections) }

func testRejections(t *testing.T, transport string) {
	const n = 8
	init := fill(testLayout(n), rand.New(rand.NewPCG(3, 4)), 1)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond, MaxGradBytes: 4 << 10}, init)
	e.transport = transport
	defer e.checkTransport()
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}, Staleness: reduce.Staleness{Policy: reduce.Drop, MaxLag: 1}})
	waitAttached(t, e.svc.Primary(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("rej", 1)

	// One good push so version 2 exists and a duplicate can be tried.
	if _, err := c.PushSeq(ctx, "m", 1, 1, gradFor(n, "rej", 1)); err != nil {
		t.Fatal(err)
	}
	e.waitSettled()
	before := e.newest()
	if before.Version != 2 {
		t.Fatalf("version %d after one push", before.Version)
	}
	// Version 3, so base 1 is 2 behind (limit 1).
	if _, err := c.PushSeq(ctx, "m", 2, 2, gradFor(n, "rej", 2)); err != nil {
		t.Fatal(err)
	}
	e.waitSettled()
	before = e.newest()

	nan := gradFor(n, "rej", 9)
	f32(t, nan, "fc.bias")[1] = float32(math.NaN())
	inf := gradFor(n, "rej", 10)
	f32(t, inf, "fc.weight")[3] = float32(math.Inf(1))
	wrongShape, _ := tensor.NewStateDict(tensor.NewF32("fc.weight", 4, n), tensor.NewF32("fc.bias", 4))
	wrongDType, _ := tensor.NewStateDict(tensor.NewF32("fc.weight", n, 4), &tensor.Tensor{Name: "fc.bias", DType: tensor.F16, Shape: []int64{4}, Data: make([]byte, 8)})
	extra, _ := tensor.NewStateDict(tensor.NewF32("fc.weight", n, 4), tensor.NewF32("fc.bias", 4), tensor.NewF32("other", 1))

	cases := []struct {
		name   string
		model  string
		base   uint64
		seq    uint64
		g      *tensor.StateDict
		code   codes.Code
		is     error
		reason reduce.Reason
	}{
		{"unknown model", "nope", 3, 20, gradFor(n, "rej", 20), codes.NotFound, errs.ErrNotFound, reduce.ReasonUnknownModel},
		{"wrong shape", "m", 3, 21, wrongShape, codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonInvalid},
		{"wrong dtype", "m", 3, 22, wrongDType, codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonInvalid},
		{"extra tensor", "m", 3, 23, extra, codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonInvalid},
		{"NaN", "m", 3, 24, nan, codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonNonFinite},
		{"Inf", "m", 3, 25, inf, codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonNonFinite},
		{"too stale", "m", 1, 26, gradFor(n, "rej", 26), codes.FailedPrecondition, errs.ErrStale, reduce.ReasonStale},
		{"future version", "m", 9, 27, gradFor(n, "rej", 27), codes.InvalidArgument, errs.ErrInvalid, reduce.ReasonInvalid},
		{"duplicate", "m", 3, 2, gradFor(n, "rej", 2), codes.AlreadyExists, errs.ErrExists, reduce.ReasonDuplicate},
		{"oversize", "m", 3, 28, gradFor(400, "rej", 28), codes.ResourceExhausted, errs.ErrFull, reduce.ReasonInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prev := e.svc.Stats().Total
			_, err := c.PushSeq(ctx, tc.model, tc.base, tc.seq, tc.g)
			if grpcerr.Code(err) != tc.code || !errors.Is(err, tc.is) {
				t.Fatalf("got %v (code %v), want %v matching %v", err, grpcerr.Code(err), tc.code, tc.is)
			}
			t.Logf("error: %v", err)
			st := e.waitSettled().Total
			if got := st.Dropped[tc.reason] - prev.Dropped[tc.reason]; got != 1 || st.Pushed != prev.Pushed+1 {
				t.Fatalf("dropped[%s] +%d, pushed +%d; want +1, +1", tc.reason, got, st.Pushed-prev.Pushed)
			}
			after := e.newest()
			if after.Version != before.Version || !slices.Equal(after.Blob, before.Blob) {
				t.Fatalf("model changed: version %d → %d", before.Version, after.Version)
			}
		})
	}
	// The NaN push's claim was released: the same seq, fixed, is accepted.
	if _, err := c.PushSeq(ctx, "m", 3, 24, gradFor(n, "rej", 24)); err != nil {
		t.Fatalf("retry of a refused seq: %v", err)
	}
	e.waitSettled()
	if v := e.newest().Version; v != before.Version+1 {
		t.Fatalf("version %d after the fixed retry, want %d", v, before.Version+1)
	}
}

// TestBoundedQueue: with the primary stuck publishing, a secondary holds at
// most MaxQueue gradients and refuses the next with ResourceExhausted; once
// the primary moves, everything held is applied.
func TestBoundedQueue(t *testing.T) { forTransports(t, testBoundedQueue) }

func testBoundedQueue(t *testing.T, transport string) {
	const n = 4
	init := fill(testLayout(n), rand.New(rand.NewPCG(5, 6)), 1)
	mem, _ := store.NewMemory(store.Config{})
	bs := &blockingStore{Store: mem, entered: make(chan struct{}, 1), release: make(chan struct{})}
	pushModel(t, mem, "m", init)
	e := newTestEnv(t, Config{Store: bs, Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond, MaxQueue: 2}, init)
	e.transport = transport
	defer e.checkTransport()
	e.st = mem
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}})
	waitAttached(t, e.svc.Primary(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("q", 1)

	if _, err := c.PushSeq(ctx, "m", 1, 1, gradFor(n, "q", 1)); err != nil {
		t.Fatal(err)
	}
	<-bs.entered // batch 1 is stuck in the publish
	if _, err := c.PushSeq(ctx, "m", 1, 2, gradFor(n, "q", 2)); err != nil {
		t.Fatal(err) // held in the next batch
	}
	_, err := c.PushSeq(ctx, "m", 1, 3, gradFor(n, "q", 3))
	if grpcerr.Code(err) != codes.ResourceExhausted || !errors.Is(err, errs.ErrFull) {
		t.Fatalf("third push: %v, want ResourceExhausted", err)
	}
	st := e.svc.Stats()
	if st.QueueDepth != 2 || st.Total.Dropped[reduce.ReasonFull] != 1 {
		t.Fatalf("queue depth %d, full drops %d", st.QueueDepth, st.Total.Dropped[reduce.ReasonFull])
	}
	if v := e.newest().Version; v != 1 {
		t.Fatalf("model moved to %d while the publish was stuck", v)
	}
	close(bs.release)
	st = e.waitSettled()
	if st.Total.Applied != 2 || e.newest().Version != 3 {
		t.Fatalf("after release: applied %d, version %d", st.Total.Applied, e.newest().Version)
	}
	// The refused seq can be pushed again now.
	if _, err := c.PushSeq(ctx, "m", 3, 3, gradFor(n, "q", 3)); err != nil {
		t.Fatal(err)
	}
	e.waitSettled()
}

// fakeClock fires timers only when advanced.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) At(t time.Time) (<-chan time.Time, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if !t.After(f.now) {
		c <- f.now
	} else {
		f.timers = append(f.timers, fakeTimer{t, c})
	}
	return c, func() {}
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	keep := f.timers[:0]
	for _, tm := range f.timers {
		if !tm.at.After(f.now) {
			tm.c <- f.now
		} else {
			keep = append(keep, tm)
		}
	}
	f.timers = keep
}

// TestMaxWaitFlush: a batch short of reduce_batch_size is forwarded when
// max_wait passes on the injected clock, and not before.
func TestMaxWaitFlush(t *testing.T) {
	const n = 4
	clk := &fakeClock{now: time.Unix(1000, 0)}
	init := fill(testLayout(n), rand.New(rand.NewPCG(7, 8)), 1)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 3, MaxWait: time.Second, Clock: clk}, init)
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}, Reduction: reduce.Sum})
	waitAttached(t, e.svc.Primary(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("w", 1)
	for s := uint64(1); s <= 2; s++ {
		if _, err := c.PushSeq(ctx, "m", 1, s, gradFor(n, "w", s)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(999 * time.Millisecond)
	// Nothing may be published yet: the batch holds 2 of 3.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if snap, err := e.st.WaitNewer(short, "m", 1); err == nil {
		t.Fatalf("version %d published before max_wait", snap.Version)
	}
	clk.Advance(time.Millisecond)
	snap, err := e.st.WaitNewer(ctx, "m", 1)
	if err != nil {
		t.Fatal(err)
	}
	// OnApply runs after the publish that WaitNewer saw: wait for it.
	e.waitSettled()
	testkit.Eventually(t, 20*time.Second, "OnApply", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.applied) > 0
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	if snap.Version != 2 || len(e.applied) != 1 || len(e.applied[0].members) != 2 {
		t.Fatalf("version %d, applies %+v", snap.Version, e.applied)
	}
}

// TestStalenessDownWeight: a gradient one version behind is reduced with
// weight 1/2, reported back to the client.
func TestStalenessDownWeight(t *testing.T) {
	const n = 4
	init := fill(testLayout(n), rand.New(rand.NewPCG(9, 9)), 1)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, init)
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 1}, Reduction: reduce.Sum, Staleness: reduce.Staleness{Policy: reduce.DownWeight}})
	waitAttached(t, e.svc.Primary(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("d", 1)
	if _, err := c.PushSeq(ctx, "m", 1, 1, gradFor(n, "d", 1)); err != nil {
		t.Fatal(err)
	}
	e.waitSettled()
	before := e.newest()
	rc, err := c.PushSeq(ctx, "m", 1, 2, gradFor(n, "d", 2))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Weight != 0.5 || rc.Version != 2 {
		t.Fatalf("receipt %+v, want weight 0.5 at version 2", rc)
	}
	e.waitSettled()
	after := e.newest()
	g := gradFor(n, "d", 2)
	for _, name := range []string{"fc.weight", "fc.bias"} {
		p0, p1, x := f32(t, before.Tensors, name), f32(t, after.Tensors, name), f32(t, g, name)
		for i := range p0 {
			if want := p0[i] + float32(-1)*(0.5*x[i]); p1[i] != want {
				t.Fatalf("%s[%d] = %v, want %v", name, i, p1[i], want)
			}
		}
	}
}

// newSGDPrimary is a primary over an in-memory store holding model "m"
// (testLayout(3), version 1), registered with cfg and SGD at lr 0.1. Both
// close when the test ends.
func newSGDPrimary(t *testing.T, cfg ModelConfig) (store.Store, *Primary) {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pushModel(t, st, "m", testLayout(3))
	p, err := NewPrimary(PrimaryConfig{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg.Model, cfg.Optimizer = "m", optim.Config{Kind: optim.SGD, LR: 0.1}
	if _, _, err := p.Register(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return st, p
}

// TestLostRevivedWhenRetryApplied: a gradient pending at a secondary whose
// session ends is counted lost; when a retry of the same (client, seq) is
// admitted by another secondary and applied, the primary takes the lost
// count back, so per distinct gradient it is applied or lost, never both.
// A second gradient lost twice (its retry's session ends too) counts once.
func TestLostRevivedWhenRetryApplied(t *testing.T) {
	_, p := newSGDPrimary(t, ModelConfig{})
	ctx := context.Background()
	lost := func() uint64 { return p.Stats().Counters.Dropped[reduce.ReasonLost] }
	a, b := reduce.ID{Client: "c", Seq: 1}, reduce.ID{Client: "c", Seq: 2}

	s1, _, _ := p.Attach(ctx, Secondary{ID: "s1"})
	for _, id := range []reduce.ID{a, b} {
		if _, _, err := p.Admit(ctx, s1, "m", id, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A retry while a is pending at s1 must be told to retry later, not
	// ALREADY_EXISTS, which clients take as "an earlier attempt got
	// through": s1 may yet lose it.
	sx, _, _ := p.Attach(ctx, Secondary{ID: "sx"})
	if _, _, err := p.Admit(ctx, sx, "m", a, 0, 0); !errors.Is(err, errs.ErrAborted) || grpcerr.Code(err) != codes.Aborted {
		t.Fatalf("retry of a pending elsewhere: %v, want Aborted", err)
	}
	p.Detach(sx)
	p.Detach(s1) // the secondary died holding a and b
	if got := lost(); got != 2 {
		t.Fatalf("lost %d after the session ended, want 2", got)
	}

	s2, _, _ := p.Attach(ctx, Secondary{ID: "s2"})
	for _, id := range []reduce.ID{a, b} {
		if _, _, err := p.Admit(ctx, s2, "m", id, 0, 0); err != nil {
			t.Fatalf("retry of lost %v: %v", id, err)
		}
	}
	if _, err := p.Forward(ctx, Batch{Session: s2, Model: "m", Members: []reduce.ID{a}, Weights: []float32{1},
		Sum: gradFor(3, "c", 1)}); err != nil {
		t.Fatal(err)
	}
	c := p.Stats().Counters
	if c.Applied != 1 || c.Dropped[reduce.ReasonLost] != 1 {
		t.Fatalf("after the retry of a was applied: applied %d lost %d, want 1 and 1", c.Applied, c.Dropped[reduce.ReasonLost])
	}
	p.Detach(s2) // b's retry is lost too: still one lost gradient
	if got := lost(); got != 1 {
		t.Fatalf("lost %d after b was lost twice, want 1", got)
	}
	s3, _, _ := p.Attach(ctx, Secondary{ID: "s3"})
	if _, _, err := p.Admit(ctx, s3, "m", b, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Forward(ctx, Batch{Session: s3, Model: "m", Members: []reduce.ID{b}, Weights: []float32{1},
		Sum: gradFor(3, "c", 2)}); err != nil {
		t.Fatal(err)
	}
	if c := p.Stats().Counters; c.Applied != 2 || c.DroppedTotal() != 0 {
		t.Fatalf("both applied in the end: applied %d dropped %v, want 2 and none", c.Applied, c.Dropped)
	}
	if _, _, err := p.Admit(ctx, s3, "m", a, 0, 0); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("a third attempt of applied a: %v", err)
	}
}

// TestForwardRefusesNonFiniteSum: a forwarded sum that overflowed to Inf
// (or holds NaN) is refused with InvalidArgument before anything changes,
// with or without clipping (the clipping norm is the check then), and the
// batch's members stay pending, so the same batch, finite, is applied.
func TestForwardRefusesNonFiniteSum(t *testing.T) {
	for _, clip := range []float64{0, 1} {
		st, p := newSGDPrimary(t, ModelConfig{GradientMax: clip, Reduction: reduce.Sum})
		ctx := context.Background()
		sess, _, _ := p.Attach(ctx, Secondary{ID: "s"})
		ids := []reduce.ID{{Client: "c", Seq: 1}, {Client: "c", Seq: 2}}
		for _, id := range ids {
			if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		for _, bad := range []float32{float32(math.Inf(1)), float32(math.NaN())} {
			sum := gradFor(3, "c", 1)
			f32(t, sum, "fc.weight")[5] = bad
			_, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: ids, Weights: []float32{1, 1}, Sum: sum})
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("clip %v: forward of a sum holding %v: %v", clip, bad, err)
			}
		}
		if v, _ := st.Get(ctx, "m", 0); v.Version != 1 {
			t.Fatalf("clip %v: version %d after refused forwards", clip, v.Version)
		}
		if v, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: ids, Weights: []float32{1, 1}, Sum: gradFor(3, "c", 1)}); err != nil || v != 2 {
			t.Fatalf("clip %v: finite forward of the same batch: version %d, %v", clip, v, err)
		}
	}
}

// TestOverflowingBatchIsRefused: two finite gradients whose sum overflows
// float32 pass the secondary's checks, and the secondary must not vouch for
// their sum (Batch.SumFinite): the primary, which does not clip here and so
// skips its own pass over a sum vouched for, refuses it, the members count
// as non-finite and the model is unchanged; a finite batch then steps it.
// A batch of two gradients that do not overflow is vouched for and applied.
func TestOverflowingBatchIsRefused(t *testing.T) {
	const n = 8
	init := fill(testLayout(n), rand.New(rand.NewPCG(5, 6)), 1)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 2, MaxWait: time.Minute}, init)
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}, Reduction: reduce.Sum})
	waitAttached(t, e.svc.Primary(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.client("ovf", 1)
	before := e.newest()
	for seq := uint64(1); seq <= 2; seq++ {
		g := gradFor(n, "ovf", seq)
		f32(t, g, "fc.bias")[2] = 3e38
		if _, err := c.PushSeq(ctx, "m", before.Version, seq, g); err != nil {
			t.Fatalf("push %d (finite, admitted): %v", seq, err)
		}
	}
	st := e.waitSettled().Total
	if st.Dropped[reduce.ReasonNonFinite] != 2 || st.Applied != 0 {
		t.Fatalf("overflowing batch: dropped %v, applied %d; want 2 non-finite, 0 applied", st.Dropped, st.Applied)
	}
	if after := e.newest(); after.Version != before.Version || !slices.Equal(after.Blob, before.Blob) {
		t.Fatalf("model changed by an overflowing batch: version %d → %d", before.Version, after.Version)
	}
	for seq := uint64(3); seq <= 4; seq++ {
		if _, err := c.PushSeq(ctx, "m", before.Version, seq, gradFor(n, "ovf", seq)); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.waitSettled().Total; st.Applied != 2 {
		t.Fatalf("finite batch after the refused one: applied %d, want 2", st.Applied)
	}
	got := e.newest()
	if got.Version != before.Version+1 {
		t.Fatalf("version %d after a finite batch, want %d", got.Version, before.Version+1)
	}
	sd, err := safetensors.Decode(got.Blob)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range sd.Tensors.Tensors() {
		f, _ := tn.Float32s()
		if i := kernels.FirstNonFinite(f); i >= 0 {
			t.Fatalf("%s[%d] = %v after a finite batch", tn.Name, i, f[i])
		}
	}
}

// blockedPublish starts a primary over a store that holds every publish
// until released (blockingStore), registers model "m" (SGD), attaches
// secondary s1, admits gradient c/1 and forwards it in ctx from a
// goroutine; it returns once version 2 is being published, with release
// (ends the publish; idempotent, and run at cleanup before the primary
// closes) and the forward's outcome to come on done.
func blockedPublish(t *testing.T, ctx context.Context) (p *Primary, s1 uint64, release func(), done <-chan error) {
	t.Helper()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	pushModel(t, mem, "m", testLayout(3))
	bs := &blockingStore{Store: mem, entered: make(chan struct{}, 1), release: make(chan struct{})}
	p, err = NewPrimary(PrimaryConfig{Store: bs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	release = sync.OnceFunc(func() { close(bs.release) })
	t.Cleanup(release) // before the primary's Close, failed or not: the publish must end
	if _, _, err := p.Register(context.Background(), ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	s1, _, _ = p.Attach(context.Background(), Secondary{ID: "s1"})
	a := reduce.ID{Client: "c", Seq: 1}
	if _, _, err := p.Admit(context.Background(), s1, "m", a, 0, 0); err != nil {
		t.Fatal(err)
	}
	forwarded := make(chan error, 1)
	go func() {
		_, err := p.Forward(ctx, Batch{Session: s1, Model: "m", Members: []reduce.ID{a}, Weights: []float32{1}, Sum: gradFor(3, "c", 1)})
		forwarded <- err
	}()
	<-bs.entered
	return p, s1, release, forwarded
}

// TestForwardPublishOutlivesItsSender: a secondary that dies (its Forward
// context ends) while the primary publishes its batch does not fail the
// step: the members were settled as applied, the version is published,
// and the model keeps taking batches from other secondaries.
func TestForwardPublishOutlivesItsSender(t *testing.T) {
	ctx := context.Background()
	fctx, die := context.WithCancel(ctx)
	p, s1, release, done := blockedPublish(t, fctx)
	die() // the sender's stream ends mid-publish
	p.Detach(s1)
	release()
	if err := <-done; err != nil {
		t.Fatalf("forward whose sender died mid-publish: %v", err)
	}
	s2, _, _ := p.Attach(ctx, Secondary{ID: "s2"})
	b := reduce.ID{Client: "c", Seq: 2}
	if _, _, err := p.Admit(ctx, s2, "m", b, 0, 0); err != nil {
		t.Fatal(err)
	}
	if v, err := p.Forward(ctx, Batch{Session: s2, Model: "m", Members: []reduce.ID{b}, Weights: []float32{1}, Sum: gradFor(3, "c", 2)}); err != nil || v != 3 {
		t.Fatalf("next forward: version %d, %v; want 3", v, err)
	}
	if c := p.Stats().Counters; c.Applied != 2 || c.DroppedTotal() != 0 {
		t.Fatalf("applied %d, dropped %v; want 2 and none", c.Applied, c.Dropped)
	}
}

// TestAdmitDuringPublishAnswersTheVersionSeen: while version 2 is being
// published (visible in the store to a reader that races the primary), a
// gradient computed on it is admitted at version 2, the version it was
// weighed against, not answered with version 1; once published, the same.
func TestAdmitDuringPublishAnswersTheVersionSeen(t *testing.T) {
	ctx := context.Background()
	p, s1, release, done := blockedPublish(t, ctx) // version 2 is being published
	w, v, err := p.Admit(ctx, s1, "m", reduce.ID{Client: "c", Seq: 2}, 2, 0)
	if err != nil || w != 1 || v != 2 {
		t.Fatalf("admitted on the version being published: weight %v, version %d, %v; want 1, 2", w, v, err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, v, err := p.Admit(ctx, s1, "m", reduce.ID{Client: "c", Seq: 3}, 2, 0); err != nil || v != 2 {
		t.Fatalf("admitted after the publish: version %d, %v; want 2", v, err)
	}
}

// TestRemoteSecondaryUsesTheDataPlane: with the secondary in a service of
// its own (as `rlhub serve --role reducer` runs it), a client's pushes reach
// it on its data plane and its batch sums reach the primary on the
// primary's; the result equals the same pushes and forwards through gRPC.
func TestRemoteSecondaryUsesTheDataPlane(t *testing.T) {
	const n, pushes = 32, 6
	init := fill(testLayout(n), rand.New(rand.NewPCG(8, 9)), 1)
	final := map[string][]byte{}
	for _, transport := range []string{TransportAuto, TransportGRPC} {
		e := newTestEnv(t, Config{Secondaries: -1}, init) // the primary only
		e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1, Momentum: 0.9}})
		sec := &testEnv{t: t, st: e.st, model: "m"}
		sec.start(Config{Primary: e.addr, ForwardTransport: transport, Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond})
		t.Cleanup(sec.stop)
		waitAttached(t, e.svc.Primary(), 1)
		sec.transport, e.transport = transport, transport
		c := e.client("remote", 0)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for s := uint64(1); s <= pushes; s++ { // one at a time: a fixed order of steps
			rc, err := c.PushSeq(ctx, "m", 0, s, gradFor(n, "remote", s))
			if err != nil {
				cancel()
				t.Fatalf("%s: push %d: %v", transport, s, err)
			}
			if rc.Addr != sec.addr {
				t.Fatalf("pushed to %s, want the remote secondary %s", rc.Addr, sec.addr)
			}
			testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%s: version %d", transport, 1+s), func() bool { return e.newest().Version == 1+s })
		}
		cancel()
		pushed, forwarded := sec.bulk.Requests(), e.bulk.Requests()
		// A push the client retried (a back-pressure refusal on a loaded
		// machine) reaches the secondary's data plane twice; every step is
		// forwarded once.
		if transport == TransportAuto && (pushed < pushes || forwarded != pushes) {
			t.Fatalf("data plane: %d pushes at the secondary, %d forwards at the primary; want at least %d and exactly %d", pushed, forwarded, pushes, pushes)
		}
		if transport == TransportGRPC && pushed+forwarded != 0 {
			t.Fatalf("TransportGRPC: %d pushes and %d forwards on the data plane", pushed, forwarded)
		}
		final[transport] = e.newest().Blob
	}
	if !slices.Equal(final[TransportAuto], final[TransportGRPC]) {
		t.Fatal("the model after the same pushes differs between the data plane and gRPC")
	}
}

// TestStepsWriteIntoVersionsNoReaderTook: with nobody reading, every
// version the store drops comes back to the primary and a later step
// writes into it: after the first Retain+1 steps (which fill the store and
// wait for its first drop), every step reuses a blob. The model still
// equals the same steps computed apart.
func TestStepsWriteIntoVersionsNoReaderTook(t *testing.T) {
	st, p := newSGDPrimary(t, ModelConfig{})
	ctx := context.Background()
	sess, _, _ := p.Attach(ctx, Secondary{ID: "s"})
	ref := testLayout(3) // the model newSGDPrimary pushed, stepped apart
	refOpt, err := optim.New(optim.Config{Kind: optim.SGD, LR: 0.1}, ref)
	if err != nil {
		t.Fatal(err)
	}
	const steps, retain = 12, 3 // newSGDPrimary's store keeps the default 3
	for s := uint64(1); s <= steps; s++ {
		id := reduce.ID{Client: "c", Seq: s}
		if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(3, "c", s)}); err != nil {
			t.Fatal(err)
		}
		if err := refOpt.Step(ref, gradFor(3, "c", s)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := p.BlobsReused("m"), uint64(steps-(retain+1)); got != want {
		t.Fatalf("%d steps wrote into a given-back blob, want %d", got, want)
	}
	snap, err := st.Get(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fc.weight", "fc.bias"} {
		if got, want := f32(t, snap.Tensors, name), f32(t, ref, name); !slices.Equal(got, want) {
			t.Fatalf("version %d %s = %v, the steps computed apart give %v", snap.Version, name, got, want)
		}
	}
}

// TestTakenVersionsStayPutWhileBlobsAreReused: a client pushes while a
// reader takes every third version it sees; the primary reuses the
// blobs of the versions nobody took, and every version the reader took
// keeps its bytes to the end. The model equals the sequential replay.
func TestTakenVersionsStayPutWhileBlobsAreReused(t *testing.T) {
	const n, pushes = 512, 60
	init := fill(testLayout(n), rand.New(rand.NewPCG(4, 4)), 1)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, init)
	mc := ModelConfig{Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}
	e.register(mc)
	waitAttached(t, e.svc.Primary(), 1)
	c := e.client("c", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type taken struct {
		snap *store.Snapshot
		was  []byte
	}
	var seen []taken
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Microsecond):
			}
			// List names the newest version without taking it; the
			// reader takes every third, so most are left to reuse
			// however the machine's load paces the two loops.
			infos, err := e.st.List(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			v := infos[0].Version
			if v%3 != 0 || (len(seen) > 0 && seen[len(seen)-1].snap.Version == v) {
				continue
			}
			snap, err := e.st.Get(ctx, "m", v)
			if errors.Is(err, errs.ErrNotFound) {
				continue // dropped meanwhile
			}
			if err != nil {
				t.Error(err)
				return
			}
			seen = append(seen, taken{snap, slices.Clone(snap.Blob)})
		}
	}()
	for s := uint64(1); s <= pushes; s++ {
		if _, err := c.PushSeq(ctx, "m", 0, s, gradFor(n, "c", s)); err != nil {
			t.Fatal(err)
		}
	}
	st := e.waitSettled()
	close(stop)
	<-done
	if st.Total.Applied != pushes {
		t.Fatalf("applied %d of %d", st.Total.Applied, pushes)
	}
	for _, v := range seen {
		if !bytes.Equal(v.snap.Blob, v.was) {
			t.Fatalf("version %d, taken by a reader, changed afterwards", v.snap.Version)
		}
	}
	reused := e.svc.Primary().BlobsReused("m")
	if reused == 0 {
		t.Fatal("no step reused a blob: the test did not exercise reuse")
	}
	e.mu.Lock()
	recs := slices.Clone(e.applied)
	e.mu.Unlock()
	want := replay(t, init, mc, recs, func(id reduce.ID) *tensor.StateDict { return gradFor(n, id.Client, id.Seq) })
	got := e.newest()
	for _, name := range []string{"fc.weight", "fc.bias"} {
		g, w := f32(t, got.Tensors, name), f32(t, want, name)
		for i := range g {
			if d := math.Abs(float64(g[i]-w[i])) / math.Max(1e-3, math.Abs(float64(w[i]))); d > 1e-6 {
				t.Fatalf("%s[%d] = %v, sequential reference %v", name, i, g[i], w[i])
			}
		}
	}
	t.Logf("%d versions taken by the reader, %d steps reused a blob", len(seen), reused)
}
