package aggregator

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/infoval"
)

// FuzzMergeInfo feeds learner infos (as JSON) to MergeInfo under both
// rules: it never panics and fails only with ErrInvalid. Under the strict
// rule, on success every non-homogeneous key holds exactly the parts'
// elements (lists contribute their length, anything else one).
func FuzzMergeInfo(f *testing.F) {
	f.Add(`{"loss":1,"task_id":"t","p":[1,2]}`, `{"loss":2,"task_id":"t","p":[]}`)
	f.Add(`{"loss":1}`, `{"loss":"x"}`)
	f.Add(`{"task_id":"t"}`, `{"task_id":"u"}`)
	f.Add(`{"a":{"b":[1]}}`, `{"a":{"b":[2]}}`)
	f.Add(`{"a":null}`, `{"a":null}`)
	f.Add(`{}`, `{"x":true}`)
	f.Add(`[1]`, `3`)
	f.Fuzz(func(t *testing.T, ja, jb string) {
		var ga, gb any
		if json.Unmarshal([]byte(ja), &ga) != nil || json.Unmarshal([]byte(jb), &gb) != nil {
			return
		}
		a, err1 := infoval.From(ga)
		b, err2 := infoval.From(gb)
		if err1 != nil || err2 != nil {
			return
		}
		parts := []InfoPart{{"a", a}, {"b", b}}
		if _, err := MergeInfo(parts, Merge{Rule: RuleDIEngine, Homogeneous: homog}); err != nil && !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("di-engine: error %v does not wrap ErrInvalid", err)
		}
		merged, err := MergeInfo(parts, strict)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("strict: error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for k, v := range merged.GetMapValue().GetFields() {
			if homog[k] {
				continue
			}
			want := 0
			for _, s := range []any{ga, gb} {
				if l, ok := s.(map[string]any)[k].([]any); ok {
					want += len(l)
				} else {
					want++
				}
			}
			if got := len(v.GetListValue().GetValues()); got != want {
				t.Fatalf("key %q merged to %d elements, want %d", k, got, want)
			}
		}
		if len(merged.GetMapValue().GetFields()) != len(ga.(map[string]any)) {
			t.Fatalf("merged %d keys from parts with %d", len(merged.GetMapValue().GetFields()), len(ga.(map[string]any)))
		}
	})
}
