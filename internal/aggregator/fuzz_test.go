package aggregator

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/errs"
)

// FuzzMergeInfo feeds learner infos (as JSON) to MergeInfo: it never
// panics, fails only with ErrInvalid, and on success every non-homogeneous
// key holds exactly the parts' elements (lists contribute their length,
// anything else one).
func FuzzMergeInfo(f *testing.F) {
	f.Add(`{"loss":1,"task_id":"t","p":[1,2]}`, `{"loss":2,"task_id":"t","p":[]}`)
	f.Add(`{"loss":1}`, `{"loss":"x"}`)
	f.Add(`{"task_id":"t"}`, `{"task_id":"u"}`)
	f.Add(`{"a":{"b":[1]}}`, `{"a":{"b":[2]}}`)
	f.Add(`{"a":null}`, `{"a":null}`)
	f.Add(`{}`, `{"x":true}`)
	f.Fuzz(func(t *testing.T, ja, jb string) {
		var a, b structpb.Struct
		if protojson.Unmarshal([]byte(ja), &a) != nil || protojson.Unmarshal([]byte(jb), &b) != nil {
			return
		}
		merged, err := MergeInfo([]InfoPart{{"a", &a}, {"b", &b}}, homog)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for k, v := range merged.Fields {
			if homog[k] {
				continue
			}
			want := 0
			for _, s := range []*structpb.Struct{&a, &b} {
				if l, ok := s.Fields[k].Kind.(*structpb.Value_ListValue); ok {
					want += len(l.ListValue.GetValues())
				} else {
					want++
				}
			}
			if got := len(v.GetListValue().GetValues()); got != want {
				t.Fatalf("key %q merged to %d elements, want %d", k, got, want)
			}
		}
		if len(merged.Fields) != len(a.Fields) {
			t.Fatalf("merged %d keys from parts with %d", len(merged.Fields), len(a.Fields))
		}
	})
}
