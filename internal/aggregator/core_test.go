package aggregator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/infoval"
	"github.com/rlhub/rlhub/internal/tensor"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func sizes(sh []Share) []int64 {
	out := make([]int64, len(sh))
	for i, s := range sh {
		out[i] = s.Rows
	}
	return out
}

func TestSplitExactAndProportional(t *testing.T) {
	ids := []string{"a", "b", "c"}
	for _, tc := range []struct {
		rows    int64
		weights []int64
		want    []int64
	}{
		{48, []int64{8, 16, 24}, []int64{8, 16, 24}}, // exactly the demand
		{10, []int64{1, 1, 1}, []int64{4, 3, 3}},     // ties go to the earlier learner
		{96, []int64{8, 16, 24}, []int64{16, 32, 48}},
		{7, []int64{0, 5, 0}, []int64{0, 7, 0}},
		{2, []int64{1, 1, 1}, []int64{1, 1, 0}},
		{0, []int64{1, 2, 3}, []int64{0, 0, 0}},
		{5, []int64{1, 1, 3}, []int64{1, 1, 3}},
		{6, []int64{1, 1, 3}, []int64{1, 1, 4}}, // remainders .2 .2 .6: the largest wins
	} {
		got, err := Split(tc.rows, ids, tc.weights)
		if err != nil {
			t.Fatalf("Split(%d, %v): %v", tc.rows, tc.weights, err)
		}
		if !slices.Equal(sizes(got), tc.want) {
			t.Errorf("Split(%d, %v) sizes = %v, want %v", tc.rows, tc.weights, sizes(got), tc.want)
		}
		for i, s := range got {
			if s.Learner != ids[i] {
				t.Errorf("share %d is %q, want %q (recorded order)", i, s.Learner, ids[i])
			}
		}
	}
}

// TestSplitTilesEveryRow checks on random inputs that shares are contiguous,
// in order, and cover [0, rows) exactly once.
func TestSplitTilesEveryRow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(8)
		ids := make([]string, n)
		w := make([]int64, n)
		for i := range n {
			ids[i] = string(rune('a' + i))
			w[i] = r.Int64N(100)
		}
		w[r.IntN(n)]++ // at least one positive
		rows := r.Int64N(10000)
		if r.IntN(10) == 0 {
			rows = 1<<40 + r.Int64N(1000) // large values must not overflow
		}
		sh, err := Split(rows, ids, w)
		if err != nil {
			t.Fatal(err)
		}
		var pos int64
		for i, s := range sh {
			if s.Start != pos || s.Rows < 0 {
				t.Fatalf("Split(%d, %v): share %d = %+v, want start %d", rows, w, i, s, pos)
			}
			if w[i] == 0 && s.Rows != 0 {
				t.Fatalf("Split(%d, %v): learner with weight 0 got %d rows", rows, w, s.Rows)
			}
			pos += s.Rows
		}
		if pos != rows {
			t.Fatalf("Split(%d, %v) covers %d rows", rows, w, pos)
		}
	}
}

func TestSplitErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ids     []string
		weights []int64
		rows    int64
		want    error
	}{
		{"no learners", nil, nil, 4, errs.ErrUnavailable},
		{"length mismatch", []string{"a"}, []int64{1, 2}, 4, errs.ErrInvalid},
		{"negative weight", []string{"a", "b"}, []int64{1, -2}, 4, errs.ErrInvalid},
		{"all zero", []string{"a", "b"}, []int64{0, 0}, 4, errs.ErrInvalid},
		{"negative rows", []string{"a"}, []int64{1}, -1, errs.ErrInvalid},
	} {
		if _, err := Split(tc.rows, tc.ids, tc.weights); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestResplitKeepsTheFailedRange(t *testing.T) {
	got, err := Resplit(Share{Learner: "b", Start: 8, Rows: 16}, []string{"a", "c"}, []int64{8, 24})
	if err != nil {
		t.Fatal(err)
	}
	want := []Share{{"a", 8, 4}, {"c", 12, 12}}
	if !slices.Equal(got, want) {
		t.Fatalf("Resplit = %v, want %v", got, want)
	}
}

func testBatch(t *testing.T, rows int64) *tensor.StateDict {
	t.Helper()
	x := tensor.NewF32("x", rows, 3)
	xs, _ := x.Float32s()
	for i := range xs {
		xs[i] = float32(i)
	}
	y := tensor.NewF32("y", rows)
	ys, _ := y.Float32s()
	for i := range ys {
		ys[i] = float32(-i)
	}
	sd, err := tensor.NewStateDict(x, y)
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

func TestBatchRowsAndSliceRows(t *testing.T) {
	b := testBatch(t, 5)
	n, err := BatchRows(b)
	if err != nil || n != 5 {
		t.Fatalf("BatchRows = %d, %v", n, err)
	}
	s := SliceRows(b, 2, 2)
	x, _ := s.Get("x").Float32s()
	y, _ := s.Get("y").Float32s()
	if !slices.Equal(x, []float32{6, 7, 8, 9, 10, 11}) || !slices.Equal(y, []float32{-2, -3}) {
		t.Fatalf("slice rows [2,4): x %v y %v", x, y)
	}
	if s.Get("x").Shape[0] != 2 || b.Get("x").Shape[0] != 5 {
		t.Fatal("SliceRows changed the batch's shape or made a wrong one")
	}

	bad, _ := tensor.NewStateDict(tensor.NewF32("x", 4, 2), tensor.NewF32("y", 5))
	scalar, _ := tensor.NewStateDict(tensor.NewF32("s"))
	for name, sd := range map[string]*tensor.StateDict{"mismatch": bad, "scalar": scalar, "empty": {}} {
		if _, err := BatchRows(sd); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: BatchRows err = %v, want ErrInvalid", name, err)
		}
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMergeDemand(t *testing.T) {
	ids := []string{"a", "b", "c"}
	ds := []*rlhubv1.Demand{
		{BatchSize: 8, Fields: mustStruct(t, map[string]any{"dim": 3, "buffer": "main"})},
		{BatchSize: 16, Fields: mustStruct(t, map[string]any{"dim": 3, "buffer": "main"})},
		{BatchSize: 24, Fields: mustStruct(t, map[string]any{"dim": 3, "buffer": "main"})},
	}
	got, err := MergeDemand(ids, ds)
	if err != nil {
		t.Fatal(err)
	}
	if got.BatchSize != 48 || !proto.Equal(got.Fields, ds[0].Fields) {
		t.Fatalf("merged demand = %v", got)
	}
	ds[2].Fields = mustStruct(t, map[string]any{"dim": 4, "buffer": "main"})
	_, err = MergeDemand(ids, ds)
	if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), `learner "c"`) || !strings.Contains(err.Error(), `"dim"`) {
		t.Fatalf("disagreeing demand: err = %v, want ErrInvalid naming learner c and dim", err)
	}
	ds[2].Fields = mustStruct(t, map[string]any{"dim": 3})
	if _, err := MergeDemand(ids, ds); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), `"buffer"`) {
		t.Fatalf("missing field: err = %v", err)
	}
	if _, err := MergeDemand(ids[:1], []*rlhubv1.Demand{{BatchSize: -1}}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("negative batch size: err = %v", err)
	}
}

var homog = map[string]bool{"learner_step": true, "task_id": true, "buffer_id": true}

var strict = Merge{Rule: RuleStrict, Homogeneous: homog}

func val(t *testing.T, v any) *rlhubv1.Value {
	t.Helper()
	out, err := infoval.From(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMergeInfoStrict(t *testing.T) {
	parts := []InfoPart{
		{"a", val(t, map[string]any{"loss": 1.5, "prio": []any{0.1, 0.2}, "learner_step": 7, "task_id": "t1", "ok": true, "sub": map[string]any{"k": 1}})},
		{"b", val(t, map[string]any{"loss": 2.5, "prio": []any{0.3}, "learner_step": 7, "task_id": "t1", "ok": false, "sub": map[string]any{"k": 2}})},
		{"c", val(t, map[string]any{"loss": 3.5, "prio": []any{}, "learner_step": 7, "task_id": "t1", "ok": true, "sub": map[string]any{"k": 3}})},
	}
	got, err := MergeInfo(parts, strict)
	if err != nil {
		t.Fatal(err)
	}
	want := val(t, map[string]any{
		"loss": []any{1.5, 2.5, 3.5}, "prio": []any{0.1, 0.2, 0.3}, "learner_step": 7, "task_id": "t1",
		"ok": []any{true, false, true}, "sub": []any{map[string]any{"k": 1}, map[string]any{"k": 2}, map[string]any{"k": 3}},
	})
	if !proto.Equal(got, want) {
		t.Fatalf("merged info =\n%v\nwant\n%v", infoval.To(got), infoval.To(want))
	}
	// One learner: scalars still become lists, so the shape does not depend
	// on how many learners there were.
	one, err := MergeInfo(parts[:1], strict)
	if err != nil || len(one.GetMapValue().GetFields()["loss"].GetListValue().GetValues()) != 1 {
		t.Fatalf("one learner: %v, %v", one, err)
	}
}

func TestMergeInfoStrictMalformed(t *testing.T) {
	base := func() map[string]any { return map[string]any{"loss": 1.0, "learner_step": 7, "task_id": "t1"} }
	for _, tc := range []struct {
		name   string
		edit   func(m map[string]any)
		wants  []string
		direct *rlhubv1.Value
	}{
		{"homogeneous differs", func(m map[string]any) { m["learner_step"] = 8 }, []string{`"learner_step"`, `learner "b"`, "8"}, nil},
		{"kind differs", func(m map[string]any) { m["loss"] = "oops" }, []string{`"loss"`, `learner "b"`, "string"}, nil},
		{"list vs scalar", func(m map[string]any) { m["loss"] = []any{1.0} }, []string{`"loss"`, "list"}, nil},
		{"missing key", func(m map[string]any) { delete(m, "loss") }, []string{`lacks key "loss"`, `learner "b"`}, nil},
		{"extra key", func(m map[string]any) { m["extra"] = 1 }, []string{`key "extra"`, `learner "b"`}, nil},
		{"value without kind", nil, []string{`"loss"`, "no value"},
			&rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: &rlhubv1.ValueMap{Fields: map[string]*rlhubv1.Value{
				"loss": {}, "learner_step": infoval.Int(7), "task_id": infoval.String("t1")}}}}},
		{"not a map", nil, []string{`learner "b"`, "wants a map"}, infoval.Int(3)},
	} {
		b := tc.direct
		if b == nil {
			m := base()
			tc.edit(m)
			b = val(t, m)
		}
		_, err := MergeInfo([]InfoPart{{"a", val(t, base())}, {"b", b}}, strict)
		if !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
			continue
		}
		for _, w := range tc.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %q does not mention %s", tc.name, err, w)
			}
		}
	}
}

// DI-engine's rule, case by case (python/tests/test_aggregator_merge.py
// checks it against a Python reference through the real hub).
func TestMergeInfoDIEngine(t *testing.T) {
	di := NewMerge(RuleDIEngine, DefaultHomogeneousKeys)
	parts := []InfoPart{
		{"a", val(t, map[string]any{"n": 1, "x": 0.5, "s": "a", "b": true, "z": nil, "l": []any{1, 2}, "learner_step": 3, "learner_done": false,
			"d": map[string]any{"k": 1, "buffer_id": "b0", "deep": map[string]any{"v": []any{"p"}}}})},
		{"b", val(t, map[string]any{"n": 2, "x": 1.5, "s": "b", "b": false, "z": nil, "l": []any{3}, "learner_step": 4, "learner_done": true,
			"d": map[string]any{"k": 2, "buffer_id": "b1", "deep": map[string]any{"v": []any{}}}, "only_b": 1})},
		{"c", val(t, map[string]any{"n": "mixed", "x": 2, "s": "c", "b": true, "z": 5, "l": []any{}, "learner_step": 5, "learner_done": false,
			"d": map[string]any{"k": 3, "buffer_id": "b2", "deep": map[string]any{"v": []any{"q", "r"}}}})},
	}
	got, err := MergeInfo(parts, di)
	if err != nil {
		t.Fatal(err)
	}
	want := val(t, map[string]any{
		"n": []any{1, 2, "mixed"}, "x": []any{0.5, 1.5, 2}, "s": []any{"a", "b", "c"}, "b": []any{true, false, true},
		"z": []any{nil, nil, 5}, "l": []any{1, 2, 3}, "learner_step": 3, "learner_done": false,
		"d": map[string]any{"k": []any{1, 2, 3}, "buffer_id": "b0", "deep": map[string]any{"v": []any{"p", "q", "r"}}},
	})
	if !proto.Equal(got, want) {
		t.Fatalf("merged info =\n%v\nwant\n%v", infoval.To(got), infoval.To(want))
	}
	if _, ok := got.GetMapValue().GetFields()["n"].GetListValue().GetValues()[0].GetKind().(*rlhubv1.Value_IntValue); !ok {
		t.Fatal("an int came back as something else")
	}
	// Top-level values that are not maps follow the same rule.
	top, err := MergeInfo([]InfoPart{{"a", val(t, []any{1})}, {"b", val(t, []any{2, 3})}}, di)
	if err != nil || !proto.Equal(top, val(t, []any{1, 2, 3})) {
		t.Fatalf("top-level lists: %v, %v", infoval.To(top), err)
	}
	for _, tc := range []struct {
		name  string
		a, b  any
		wants []string
	}{
		{"list then scalar", map[string]any{"l": []any{1}}, map[string]any{"l": 2}, []string{`"l"`, `learner "b"`, "concatenate"}},
		{"map then scalar", map[string]any{"d": map[string]any{"k": 1}}, map[string]any{"d": 2}, []string{`"d"`, `learner "b"`, "map"}},
		{"missing key", map[string]any{"d": map[string]any{"k": 1}}, map[string]any{"d": map[string]any{}}, []string{`"d"`, `lacks key "k"`, `learner "b"`}},
		{"no kind", map[string]any{"k": 1}, map[string]any{"k": &rlhubv1.Value{}}, []string{`"k"`, "no value"}},
	} {
		_, err := MergeInfo([]InfoPart{{"a", val(t, tc.a)}, {"b", val(t, tc.b)}}, di)
		if !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
			continue
		}
		for _, w := range tc.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %q does not mention %s", tc.name, err, w)
			}
		}
	}
}

func TestMergeWithOptions(t *testing.T) {
	hub := NewMerge(RuleDIEngine, DefaultHomogeneousKeys)
	m, err := hub.With(&rlhubv1.MergeOptions{Rule: "strict", SetHomogeneousKeys: true, HomogeneousKeys: []string{"epoch"}})
	if err != nil || m.Rule != RuleStrict || !slices.Equal(m.Keys(), []string{"epoch"}) {
		t.Fatalf("With = %v, %v", m, err)
	}
	if m, _ := hub.With(&rlhubv1.MergeOptions{}); m.Rule != RuleDIEngine || len(m.Keys()) != 4 {
		t.Fatalf("empty options changed the merge: %v", m)
	}
	if _, err := hub.With(&rlhubv1.MergeOptions{Rule: "bogus"}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("bad rule: %v", err)
	}
	if _, err := hub.With(&rlhubv1.MergeOptions{SetHomogeneousKeys: true, HomogeneousKeys: []string{""}}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
}

func ok(learner string) Outcome {
	return Outcome{Info: &rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: &rlhubv1.ValueMap{Fields: map[string]*rlhubv1.Value{"who": infoval.String(learner)}}}}}
}

var errGone = errors.New("gone")

func TestPlanResplitsAcrossRounds(t *testing.T) {
	p, err := NewPlan(48, []string{"a", "b", "c"}, []int64{8, 16, 24}, PolicyResplit)
	if err != nil {
		t.Fatal(err)
	}
	// Round 1: b fails.
	if err := p.Report([]Outcome{ok("a"), {Err: errGone}, ok("c")}); err != nil {
		t.Fatal(err)
	}
	if got, want := p.Pending(), []Share{{"a", 8, 4}, {"c", 12, 12}}; !slices.Equal(got, want) {
		t.Fatalf("round 2 = %v, want %v", got, want)
	}
	// Round 2: c fails too; its piece goes to a.
	if err := p.Report([]Outcome{ok("a"), {Err: errGone}}); err != nil {
		t.Fatal(err)
	}
	if got, want := p.Pending(), []Share{{"a", 12, 12}}; !slices.Equal(got, want) {
		t.Fatalf("round 3 = %v, want %v", got, want)
	}
	if err := p.Report([]Outcome{ok("a")}); err != nil {
		t.Fatal(err)
	}
	if len(p.Pending()) != 0 || p.Resplits() != 2 || !slices.Equal(p.Failed(), []string{"b", "c"}) {
		t.Fatalf("pending %v resplits %d failed %v", p.Pending(), p.Resplits(), p.Failed())
	}
	resp, err := p.Result(Merge{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range resp.Shares {
		got = append(got, fmt.Sprintf("%s[%d,%d)", s.LearnerId, s.RowStart, s.RowStart+s.Rows))
	}
	// c's original share [24,48) succeeded in round 1; row order.
	if want := []string{"a[0,8)", "a[8,12)", "a[12,24)", "c[24,48)"}; !slices.Equal(got, want) {
		t.Fatalf("shares %v, want %v", got, want)
	}
	if who := strs(field(resp.Info, "who")); !slices.Equal(who, []string{"a", "a", "a", "c"}) {
		t.Fatalf("info in row order = %v", who)
	}
}

func TestPlanFailures(t *testing.T) {
	p, _ := NewPlan(10, []string{"a", "b"}, []int64{1, 1}, PolicyFail)
	if err := p.Report([]Outcome{ok("a"), {Err: fmt.Errorf("learner %q: %w", "b", errGone)}}); !errors.Is(err, errGone) || !strings.Contains(err.Error(), `learner "b"`) {
		t.Fatalf("fail policy: %v", err)
	}
	p, _ = NewPlan(10, []string{"a", "b"}, []int64{1, 1}, PolicyResplit)
	if err := p.Report([]Outcome{{Err: errGone}, {Err: errGone}}); !errors.Is(err, errs.ErrUnavailable) || !errors.Is(err, errGone) {
		t.Fatalf("no survivors: %v", err)
	}
	// Survivors that asked for nothing still take the rows.
	p, _ = NewPlan(10, []string{"a", "b"}, []int64{1, 0}, PolicyResplit)
	if got := p.Pending(); len(got) != 1 || got[0].Rows != 10 {
		t.Fatalf("zero-weight learner got a share: %v", got)
	}
	if err := p.Report([]Outcome{{Err: errGone}}); err != nil {
		t.Fatal(err)
	}
	if got, want := p.Pending(), []Share{{"b", 0, 10}}; !slices.Equal(got, want) {
		t.Fatalf("re-split onto a zero-weight survivor = %v, want %v", got, want)
	}
}
