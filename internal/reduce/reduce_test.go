package reduce

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

func layout() *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 5, 3), tensor.NewF32("b", 3))
	return sd
}

func randGrad(r *rand.Rand) *tensor.StateDict {
	sd := layout().Clone()
	for _, t := range sd.Tensors() {
		f, _ := t.Float32s()
		for i := range f {
			f[i] = float32(r.NormFloat64())
		}
	}
	return sd
}

// TestBatchSumMatchesPlainLoop: the batch sum equals a plain float32 loop in
// Add order bit for bit (weight 1), and weight×g for other weights.
func TestBatchSumMatchesPlainLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	b := NewBatch(layout())
	var gs []*tensor.StateDict
	weights := []float32{1, 1, 0.5, 1, 0.25}
	t0 := time.Unix(100, 0)
	for i, w := range weights {
		g := randGrad(r)
		gs = append(gs, g)
		if _, err := CheckGradient(layout(), g); err != nil {
			t.Fatal(err)
		}
		b.Add(ID{"c", uint64(i)}, g, w, t0.Add(time.Duration(i)*time.Second))
	}
	if b.Len() != 5 || !b.First().Equal(t0) {
		t.Fatalf("len %d first %v", b.Len(), b.First())
	}
	for _, name := range []string{"w", "b"} {
		got, _ := b.Sum().Get(name).Float32s()
		for j := range got {
			var want float32
			for i, g := range gs {
				x, _ := g.Get(name).Float32s()
				want += weights[i] * x[j]
			}
			if math.Abs(float64(got[j]-want)) > 1e-6*math.Abs(float64(want))+1e-7 {
				t.Fatalf("%s[%d] = %v, plain loop %v", name, j, got[j], want)
			}
		}
	}
	b.Reset()
	if b.Len() != 0 {
		t.Fatal("reset left members")
	}
	// After Reset the first Add overwrites, with or without a weight.
	g0 := randGrad(r)
	b.Add(ID{"c", 9}, g0, 0.5, t0)
	w0, _ := b.Sum().Get("w").Float32s()
	x0, _ := g0.Get("w").Float32s()
	for j := range w0 {
		if math.Abs(float64(w0[j]-0.5*x0[j])) > 1e-7 {
			t.Fatalf("after reset w[%d] = %v, want %v", j, w0[j], 0.5*x0[j])
		}
	}
	b.Reset()
	// Weight-1 adds are exact.
	g1, g2 := randGrad(r), randGrad(r)
	b.Add(ID{"c", 10}, g1, 1, t0)
	b.Add(ID{"c", 11}, g2, 1, t0)
	got, _ := b.Sum().Get("w").Float32s()
	x1, _ := g1.Get("w").Float32s()
	x2, _ := g2.Get("w").Float32s()
	for j := range got {
		if got[j] != x1[j]+x2[j] {
			t.Fatalf("w[%d] = %v, want exactly %v", j, got[j], x1[j]+x2[j])
		}
	}
}

// TestBatchAdopt: a batch started with Adopt holds the same sum, bit for
// bit, as one started with Add into zeros, writes into the adopted
// gradient, and hands it back on Reset; the batch then works from its own
// buffer again.
func TestBatchAdopt(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	t0 := time.Unix(100, 0)
	for _, w0 := range []float32{1, 0.5} {
		g0, g1, g2 := randGrad(r), randGrad(r), randGrad(r)
		ref := NewBatch(layout())
		ref.Add(ID{"c", 0}, g0, w0, t0)
		ref.Add(ID{"c", 1}, g1, 1, t0)
		ref.Add(ID{"c", 2}, g2, 0.25, t0)

		adopted := g0.Clone()
		b := NewBatch(layout())
		b.Adopt(ID{"c", 0}, adopted, w0, t0)
		b.Add(ID{"c", 1}, g1, 1, t0.Add(time.Second))
		b.Add(ID{"c", 2}, g2, 0.25, t0.Add(2*time.Second))
		if b.Sum() != adopted || b.Len() != 3 || !b.First().Equal(t0) {
			t.Fatalf("adopted batch: sum is the gradient %v, len %d, first %v", b.Sum() == adopted, b.Len(), b.First())
		}
		for _, name := range []string{"w", "b"} {
			got, _ := b.Sum().Get(name).Float32s()
			want, _ := ref.Sum().Get(name).Float32s()
			for j := range got {
				if got[j] != want[j] {
					t.Fatalf("weight %v: %s[%d] = %v, Add from zero gives %v", w0, name, j, got[j], want[j])
				}
			}
		}
		if !b.Reset() {
			t.Fatal("Reset did not hand the adopted gradient back")
		}
		b.Add(ID{"c", 3}, g1, 1, t0)
		if b.Sum() == adopted {
			t.Fatal("Add after Reset wrote into the released gradient")
		}
		got, _ := b.Sum().Get("w").Float32s()
		x1, _ := g1.Get("w").Float32s()
		if !slices.Equal(got, x1) || b.Reset() {
			t.Fatal("own-buffer batch after an adopted one")
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Adopt into a non-empty batch did not panic")
		}
	}()
	b := NewBatch(layout())
	b.Add(ID{"c", 0}, randGrad(r), 1, t0)
	b.Adopt(ID{"c", 1}, randGrad(r), 1, t0)
}

// TestBatchSumFinite: SumFinite holds while every add's result is finite
// and turns false when an add overflows, in the first tensor or the last,
// weighted or not, whether the batch started with Add (fresh or reused
// buffer) or Adopt; Adopt with a weight above 1 is "not known"; an empty
// or reset batch is never finite.
func TestBatchSumFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	t0 := time.Unix(100, 0)
	huge := func(name string) *tensor.StateDict {
		g := randGrad(r)
		f, _ := g.Get(name).Float32s()
		f[len(f)-1] = 3e38
		return g
	}
	b := NewBatch(layout())
	if b.SumFinite() {
		t.Fatal("empty batch reports a finite sum")
	}
	for _, start := range []string{"add", "add again (reused buffer)", "adopt"} {
		for _, name := range []string{"w", "b"} {
			for _, w := range []float32{1, 0.75} {
				if start == "adopt" {
					b.Adopt(ID{"c", 0}, huge(name), 1, t0)
				} else {
					b.Add(ID{"c", 0}, huge(name), w, t0)
				}
				if !b.SumFinite() {
					t.Fatalf("%s, %s, weight %v: one finite gradient not finite", start, name, w)
				}
				b.Add(ID{"c", 1}, randGrad(r), w, t0)
				if !b.SumFinite() {
					t.Fatalf("%s, %s, weight %v: finite sum of two reported non-finite", start, name, w)
				}
				b.Add(ID{"c", 2}, huge(name), 1, t0) // 3e38·(1 or 0.75) + 3e38 overflows
				if b.SumFinite() {
					t.Fatalf("%s, %s, weight %v: overflowing sum reported finite", start, name, w)
				}
				b.Add(ID{"c", 3}, randGrad(r), 1, t0)
				if b.SumFinite() {
					t.Fatalf("%s, %s, weight %v: an add after the overflow made the sum finite again", start, name, w)
				}
				b.Reset()
				if b.SumFinite() {
					t.Fatalf("%s: reset batch reports a finite sum", start)
				}
			}
		}
	}
	b.Adopt(ID{"c", 0}, randGrad(r), 2, t0)
	if b.SumFinite() {
		t.Fatal("Adopt with weight 2 (could overflow) reports a finite sum")
	}
}

func TestFlushDue(t *testing.T) {
	f := Flush{Size: 3, MaxWait: 10 * time.Millisecond}
	b := NewBatch(layout())
	t0 := time.Unix(0, 0)
	if f.Due(b, t0.Add(time.Hour)) {
		t.Fatal("empty batch due")
	}
	if _, ok := f.Deadline(b); ok {
		t.Fatal("empty batch has a deadline")
	}
	g := layout().Clone()
	b.Add(ID{"a", 1}, g, 1, t0)
	if f.Due(b, t0.Add(9*time.Millisecond)) {
		t.Fatal("due before max wait")
	}
	if !f.Due(b, t0.Add(10*time.Millisecond)) {
		t.Fatal("not due at max wait")
	}
	if d, _ := f.Deadline(b); !d.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("deadline %v", d)
	}
	b.Add(ID{"a", 2}, g, 1, t0)
	b.Add(ID{"a", 3}, g, 1, t0)
	if !f.Due(b, t0) {
		t.Fatal("full batch not due")
	}
}

func TestCheckGradient(t *testing.T) {
	l := layout()
	wrongShape, _ := tensor.NewStateDict(tensor.NewF32("w", 3, 5), tensor.NewF32("b", 3))
	missing, _ := tensor.NewStateDict(tensor.NewF32("w", 5, 3))
	wrongType, _ := tensor.NewStateDict(tensor.NewF32("w", 5, 3), &tensor.Tensor{Name: "b", DType: tensor.F64, Shape: []int64{3}, Data: make([]byte, 24)})
	nan := l.Clone()
	f, _ := nan.Get("b").Float32s()
	f[2] = float32(math.Inf(-1))
	for name, c := range map[string]struct {
		g      *tensor.StateDict
		nonfin bool
	}{"shape": {wrongShape, false}, "missing": {missing, false}, "dtype": {wrongType, false}, "inf": {nan, true}} {
		nf, err := CheckGradient(l, c.g)
		if !errors.Is(err, errs.ErrInvalid) || nf != c.nonfin {
			t.Errorf("%s: nonFinite=%v err=%v", name, nf, err)
		}
	}
	if _, err := CheckGradient(l, l.Clone()); err != nil {
		t.Fatal(err)
	}
}

func TestStaleness(t *testing.T) {
	cases := []struct {
		rule          Staleness
		base, current uint64
		weight        float32
		err           error
	}{
		{Staleness{}, 0, 100, 1, nil},
		{Staleness{Policy: Drop, MaxLag: 2}, 8, 10, 1, nil},
		{Staleness{Policy: Drop, MaxLag: 2}, 7, 10, 0, errs.ErrStale},
		{Staleness{Policy: Drop}, 10, 10, 1, nil},
		{Staleness{Policy: DownWeight}, 7, 10, 0.25, nil},
		{Staleness{Policy: DownWeight, MaxLag: 2}, 7, 10, 0, errs.ErrStale},
		{Staleness{Policy: DownWeight, MaxLag: 2}, 9, 10, 0.5, nil},
		{Staleness{}, 11, 10, 0, errs.ErrInvalid},
	}
	for i, c := range cases {
		if err := c.rule.Validate(); err != nil {
			t.Fatal(err)
		}
		w, err := c.rule.Weigh("m", c.base, c.current, 1)
		if w != c.weight || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("case %d: weight %v err %v, want %v %v", i, w, err, c.weight, c.err)
		}
	}
	var se *errs.StaleError
	_, err := Staleness{Policy: Drop}.Weigh("m", 1, 3, 7)
	if !errors.As(err, &se) || se.CurrentVersion != 3 || se.CurrentEpoch != 7 {
		t.Fatalf("stale error %v", err)
	}
	if err := (&Staleness{Policy: "maybe"}).Validate(); !errors.Is(err, errs.ErrInvalid) {
		t.Fatal(err)
	}
}

func TestLedger(t *testing.T) {
	l := NewLedger(2)
	a1, a2 := ID{"a", 1}, ID{"a", 2}
	if err := l.Claim(a1, 1); err != nil {
		t.Fatal(err)
	}
	// A retry at another secondary (session 2) while pending: refused.
	if err := l.Claim(a1, 2); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("claim pending elsewhere: %v, want ErrAborted (retry later)", err)
	}
	// The batch is forwarded by session 2 wrongly: refused.
	if err := l.CheckPending([]ID{a1}, 2); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("check in wrong session: %v", err)
	}
	if err := l.CheckPending([]ID{a1}, 1); err != nil {
		t.Fatal(err)
	}
	l.MarkApplied([]ID{a1})
	if err := l.Claim(a1, 2); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("claim applied: %v", err)
	}
	// Session 1 dies with a2 pending: released, claimable by session 2,
	// and session 1 can no longer forward it.
	_ = l.Claim(a2, 1)
	if got := l.EndSession(1); !slices.Equal(got, []ID{a2}) {
		t.Fatalf("EndSession released %v", got)
	}
	if err := l.CheckPending([]ID{a2}, 1); !errors.Is(err, errs.ErrAborted) {
		t.Fatal("ended session may still forward")
	}
	if err := l.Claim(a2, 2); err != nil {
		t.Fatal(err)
	}
	// Release lets a failed push be retried.
	if !l.Release(a2, 2) || l.Claim(a2, 3) != nil {
		t.Fatal("release/reclaim failed")
	}
	// Compaction keeps refusing old applied ids through the floor.
	for s := uint64(10); s < 20; s++ {
		_ = l.Claim(ID{"b", s}, 5)
		l.MarkApplied([]ID{{"b", s}})
	}
	for s := uint64(10); s < 20; s++ {
		if err := l.Claim(ID{"b", s}, 6); !errors.Is(err, errs.ErrExists) {
			t.Fatalf("seq %d after compaction: %v", s, err)
		}
	}
	if n := len(l.clients["b"].entries); n > 4 {
		t.Fatalf("ledger keeps %d entries for b, window 2", n)
	}
	if l.Pending() != 1 {
		t.Fatalf("pending %d, want 1 (a2)", l.Pending())
	}
}

// TestLedgerLostIsProvisional: an id lost with its session is reported lost
// once, may be claimed again, and is reported revived when that retry is
// applied; lost again before being applied, it is not reported twice.
func TestLedgerLostIsProvisional(t *testing.T) {
	l := NewLedger(2)
	a, b, c := ID{"a", 1}, ID{"a", 2}, ID{"a", 3}
	for _, id := range []ID{a, b, c} {
		if err := l.Claim(id, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.EndSession(1); !slices.Equal(got, []ID{a, b, c}) {
		t.Fatalf("EndSession(1) = %v, want all three lost", got)
	}
	if l.Pending() != 0 {
		t.Fatalf("pending %d after the session ended", l.Pending())
	}
	// a: retried at session 2 and applied → revived.
	// b: retried at session 2, whose session ends too → not lost twice.
	// c: retried at session 2, released (push failed) → lost again, still once.
	for _, id := range []ID{a, b, c} {
		if err := l.Claim(id, 2); err != nil {
			t.Fatalf("retry of lost %v: %v", id, err)
		}
	}
	if err := l.Claim(a, 3); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("a retry pending at 2 claimed at 3: %v", err)
	}
	if err := l.CheckPending([]ID{a}, 2); err != nil {
		t.Fatal(err)
	}
	if got := l.MarkApplied([]ID{a}); got != 1 {
		t.Fatalf("MarkApplied of a lost retry revived %d, want 1", got)
	}
	if !l.Release(c, 2) {
		t.Fatal("release of c")
	}
	if got := l.EndSession(2); len(got) != 0 {
		t.Fatalf("EndSession(2) reported %v lost again", got)
	}
	// Applied once, never again; b and c can still be retried, and
	// applying them revives each once.
	if err := l.Claim(a, 4); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("claim of applied a: %v", err)
	}
	if got := l.MarkApplied(nil); got != 0 {
		t.Fatal("revived from nothing")
	}
	_ = l.Claim(b, 4)
	_ = l.Claim(c, 4)
	if got := l.MarkApplied([]ID{b, c}); got != 2 {
		t.Fatalf("revived %d, want 2", got)
	}
	// A fresh id applied normally is not a revival.
	_ = l.Claim(ID{"a", 4}, 4)
	if got := l.MarkApplied([]ID{{"a", 4}}); got != 0 {
		t.Fatalf("revived %d, want 0", got)
	}
}

// A pending claim below what compaction would settle keeps the floor
// under it: released (its push broke mid-body), its retry is claimed and
// applied, not refused as already applied (ALREADY_EXISTS, which the
// client takes as applied: a gradient lost and counted nowhere).
func TestLedgerFloorStaysBelowAPendingClaim(t *testing.T) {
	l := NewLedger(2)
	c1 := ID{"c", 1}
	if err := l.Claim(c1, 1); err != nil {
		t.Fatal(err)
	}
	for s := uint64(2); s <= 9; s++ {
		id := ID{"c", s}
		if err := l.Claim(id, 1); err != nil {
			t.Fatal(err)
		}
		l.MarkApplied([]ID{id})
	}
	if !l.Release(c1, 1) {
		t.Fatal("release of the pending seq 1")
	}
	if err := l.Claim(c1, 2); err != nil {
		t.Fatalf("retry of seq 1, released and never applied: %v", err)
	}
	l.MarkApplied([]ID{c1})
	// Settled now, the floor may pass it: the entries shrink to the window.
	for s := uint64(10); s <= 13; s++ {
		id := ID{"c", s}
		_ = l.Claim(id, 2)
		l.MarkApplied([]ID{id})
	}
	if n := len(l.clients["c"].entries); n > 4 {
		t.Fatalf("%d entries kept for c with window 2 once nothing is pending", n)
	}
	for s := uint64(1); s <= 13; s++ {
		if err := l.Claim(ID{"c", s}, 3); !errors.Is(err, errs.ErrExists) {
			t.Fatalf("applied seq %d claimed again: %v", s, err)
		}
	}
}

// A claim released before anything of its client was applied leaves no
// trace: pushes under ever new client ids refused after their claim (a
// bad body) do not grow the ledger.
func TestLedgerForgetsClientsWithNothingRemembered(t *testing.T) {
	l := NewLedger(2)
	for i := range 100 {
		id := ID{fmt.Sprintf("x%d", i), 1}
		if err := l.Claim(id, 1); err != nil {
			t.Fatal(err)
		}
		if !l.Release(id, 1) {
			t.Fatal("release")
		}
	}
	if n := len(l.clients); n != 0 {
		t.Fatalf("%d clients remembered after 100 released claims", n)
	}
}

// A batch naming one claim twice is refused: it would count and weigh the
// gradient twice.
func TestLedgerRefusesABatchNamingAClaimTwice(t *testing.T) {
	l := NewLedger(2)
	a := ID{"a", 1}
	if err := l.Claim(a, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.CheckPending([]ID{a, a}, 1); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("a batch naming %v twice: %v, want ErrInvalid", a, err)
	}
	if err := l.CheckPending([]ID{a}, 1); err != nil {
		t.Fatal(err)
	}
}

func TestCountersRevive(t *testing.T) {
	var c Counters
	c.Drop(ReasonLost, 0)
	if len(c.Dropped) != 0 {
		t.Fatalf("Drop(0) made an entry: %v", c.Dropped)
	}
	c.Drop(ReasonLost, 3)
	c.Revive(ReasonLost, 2)
	if c.Dropped[ReasonLost] != 1 || c.DroppedTotal() != 1 {
		t.Fatalf("after revive: %v", c.Dropped)
	}
	c.Revive(ReasonLost, 1)
	if _, ok := c.Dropped[ReasonLost]; ok {
		t.Fatalf("zero count kept: %v", c.Dropped)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("reviving more than was dropped did not panic")
		}
	}()
	c.Revive(ReasonLost, 1)
}

func TestClipAndMean(t *testing.T) {
	g, _ := tensor.NewStateDict(tensor.FromFloat32s("x", []int64{2}, []float32{3, 4}))
	if n, c := Clip(g, 10); n != 5 || c {
		t.Fatalf("no clip: norm %v clipped %v", n, c)
	}
	if n, c := Clip(g, 1); n != 5 || !c {
		t.Fatalf("clip: norm %v clipped %v", n, c)
	}
	if n := GlobalNorm(g); math.Abs(n-1) > 1e-6 {
		t.Fatalf("norm after clip %v", n)
	}
	// torch.nn.utils.clip_grad_norm_'s factor: max/(norm + 1e-6).
	k := float32(1 / (5 + 1e-6))
	Mean.Finish(g, 4)
	f, _ := g.Get("x").Float32s()
	if f[0] != 3*k*0.25 || f[1] != 4*k*0.25 {
		t.Fatalf("mean %v, want %v", f, []float32{3 * k * 0.25, 4 * k * 0.25})
	}
	// As in torch, a norm at the bound is scaled too, by less than 1e-6/max.
	g, _ = tensor.NewStateDict(tensor.FromFloat32s("x", []int64{2}, []float32{3, 4}))
	if _, c := Clip(g, 5); !c {
		t.Fatal("a norm equal to max: not scaled, as torch scales it")
	}
	if f, _ := g.Get("x").Float32s(); f[0] != 3*float32(5/(5+1e-6)) {
		t.Fatalf("norm at max: %v", f)
	}
}

func TestCountersMerge(t *testing.T) {
	var a, b Counters
	a.Pushed, a.Reduced = 5, 3
	a.Drop(ReasonStale, 2)
	b.Applied, b.Steps = 3, 1
	b.Drop(ReasonStale, 1)
	b.Drop(ReasonLost, 1)
	a.Merge(b)
	if a.Pushed != 5 || a.Applied != 3 || a.Dropped[ReasonStale] != 3 || a.DroppedTotal() != 4 {
		t.Fatalf("merged %+v", a)
	}
	if ReasonOf(&errs.StaleError{}) != ReasonStale || ReasonOf(errs.ErrFull) != ReasonFull {
		t.Fatal("ReasonOf")
	}
}

// With a clock, ForgetIdle forgets the clients idle since before its
// bound that have nothing pending; a client with a pending claim, or used
// since, is kept. A ledger given its clock after it was filled (restored)
// counts its clients as used then.
func TestLedgerForgetIdle(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	l := NewLedger(2)
	l.AddApplied([]ID{{"restored", 1}})
	l.SetClock(clock)
	for _, c := range []string{"a", "b"} {
		if err := l.Claim(ID{c, 1}, 1); err != nil {
			t.Fatal(err)
		}
		l.MarkApplied([]ID{{c, 1}})
	}
	if err := l.Claim(ID{"p", 1}, 1); err != nil { // pending
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	_ = l.Claim(ID{"b", 2}, 1) // b used again
	l.MarkApplied([]ID{{"b", 2}})
	if n := l.ForgetIdle(now.Add(-30 * time.Minute)); n != 2 || l.Clients() != 2 {
		t.Fatalf("forgot %d (restored, a), %d left (b, p), want 2 and 2", n, l.Clients())
	}
	if err := l.Claim(ID{"b", 1}, 2); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("b, used within the bound, forgot its applied seq 1: %v", err)
	}
	if err := l.Claim(ID{"p", 1}, 2); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("p's pending claim was forgotten: %v", err)
	}
}
