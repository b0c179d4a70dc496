package infoval

import (
	"math"
	"reflect"
	"strings"
	"testing"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestRoundTripKeepsIntegers(t *testing.T) {
	in := map[string]any{
		"big": int64(1<<62 + 1), "u": uint32(7), "f": 0.5, "f32": float32(0.25), "s": "x", "b": true, "n": nil,
		"l": []int{1, 2}, "m": map[string]any{"deep": []any{int8(-3), "y"}},
	}
	v, err := From(in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"big": int64(1<<62 + 1), "u": int64(7), "f": 0.5, "f32": 0.25, "s": "x", "b": true, "n": nil,
		"l": []any{int64(1), int64(2)}, "m": map[string]any{"deep": []any{int64(-3), "y"}},
	}
	if got := To(v); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip = %#v\nwant %#v", got, want)
	}
	if Kind(v.GetMapValue().Fields["big"]) != "int" || Kind(v.GetMapValue().Fields["f"]) != "float" {
		t.Fatal("int and float kinds mixed up")
	}
}

func TestFromRejects(t *testing.T) {
	deep := any(1)
	for range 70 {
		deep = []any{deep}
	}
	for name, tc := range map[string]struct {
		v    any
		want string
	}{
		"uint64 overflow": {uint64(math.MaxUint64), "does not fit"},
		"int keys":        {map[int]int{1: 2}, "string keys"},
		"channel":         {make(chan int), "cannot put"},
		"too deep":        {deep, "deeper than"},
	} {
		if _, err := From(tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", name, err, tc.want)
		}
	}
}

func TestCheckBoundsNesting(t *testing.T) {
	v := Int(1)
	for range 70 {
		v = List(v)
	}
	if err := Check(v); err == nil {
		t.Fatal("Check accepted 70 levels")
	}
	if err := Check(&rlhubv1.Value{}); err != nil {
		t.Fatalf("Check of an empty value: %v", err)
	}
}
