package aggregator

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/infoval"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// MergeRule chooses how the learners' infos of one Learn merge.
type MergeRule int

const (
	// RuleDIEngine (the zero value) is DI-engine's
	// LearnerAggregator.merge_info, decided by the first learner's value
	// (row order): null, int, float, string or bool → the list of every
	// learner's value, as they are; list → the lists concatenated (every
	// learner's must be a list); map → merged key by key, recursively, over
	// the first learner's keys (every learner's must be a map holding them;
	// keys only later learners have are dropped, as DI-engine does), a
	// homogeneous key at any depth taking the first learner's value; a value
	// with no kind → an error.
	RuleDIEngine MergeRule = iota
	// RuleStrict is rlhub's earlier, checked merge: the infos are maps with
	// the same keys; a homogeneous (top-level) key must be equal everywhere
	// and stays single; any other key's lists concatenate and any other
	// value becomes one list element, its kind (number, string, bool, map,
	// list, null) the same everywhere.
	RuleStrict
)

// ParseMergeRule parses "di-engine" or "strict".
func ParseMergeRule(s string) (MergeRule, error) {
	switch s {
	case "di-engine":
		return RuleDIEngine, nil
	case "strict":
		return RuleStrict, nil
	}
	return 0, fmt.Errorf("%w: merge rule %q: want di-engine or strict", errs.ErrInvalid, truncate(s))
}

func (r MergeRule) String() string {
	if r == RuleStrict {
		return "strict"
	}
	return "di-engine"
}

// Merge is a merge rule with its homogeneous keys.
type Merge struct {
	Rule        MergeRule
	Homogeneous map[string]bool
}

// NewMerge builds a Merge from a key list.
func NewMerge(rule MergeRule, homogeneous []string) Merge {
	m := Merge{Rule: rule, Homogeneous: make(map[string]bool, len(homogeneous))}
	for _, k := range homogeneous {
		m.Homogeneous[k] = true
	}
	return m
}

// Keys returns the homogeneous keys, sorted.
func (m Merge) Keys() []string {
	keys := make([]string, 0, len(m.Homogeneous))
	for k := range m.Homogeneous {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// With applies a task's MergeOptions over m (the hub's). Errors wrap
// errs.ErrInvalid.
func (m Merge) With(o *rlhubv1.MergeOptions) (Merge, error) {
	if o == nil {
		return m, nil
	}
	out := m
	if o.Rule != "" {
		r, err := ParseMergeRule(o.Rule)
		if err != nil {
			return Merge{}, err
		}
		out.Rule = r
	}
	if o.SetHomogeneousKeys {
		if len(o.HomogeneousKeys) > 256 {
			return Merge{}, fmt.Errorf("%w: %d homogeneous keys (at most 256)", errs.ErrInvalid, len(o.HomogeneousKeys))
		}
		for _, k := range o.HomogeneousKeys {
			if k == "" || len(k) > 128 {
				return Merge{}, fmt.Errorf("%w: homogeneous key %q: want 1 to 128 bytes", errs.ErrInvalid, truncate(k))
			}
		}
		out = NewMerge(out.Rule, o.HomogeneousKeys)
	}
	return out, nil
}

// InfoPart is one learner's info for one share.
type InfoPart struct {
	Learner string
	Info    *rlhubv1.Value
}

// MergeInfo merges infos given in row order by m's rule (see MergeRule).
// The result shares no memory with the parts. Errors wrap errs.ErrInvalid
// and name the learner and the key path.
func MergeInfo(parts []InfoPart, m Merge) (*rlhubv1.Value, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("%w: no info to merge", errs.ErrInvalid)
	}
	for _, p := range parts {
		if err := infoval.Check(p.Info); err != nil {
			return nil, fmt.Errorf("%w: learner %q: %v", errs.ErrInvalid, p.Learner, err)
		}
	}
	if m.Rule == RuleStrict {
		return mergeStrict(parts, m.Homogeneous)
	}
	vals := make([]*rlhubv1.Value, len(parts))
	learners := make([]string, len(parts))
	for i, p := range parts {
		vals[i], learners[i] = p.Info, p.Learner
	}
	return mergeDI(nil, learners, vals, m.Homogeneous)
}

func clone(v *rlhubv1.Value) *rlhubv1.Value { return proto.Clone(v).(*rlhubv1.Value) }

// mergeDI is DI-engine's merge_info over one key path.
func mergeDI(path []string, learners []string, vals []*rlhubv1.Value, homog map[string]bool) (*rlhubv1.Value, error) {
	for i, v := range vals {
		if infoval.Kind(v) == "" {
			return nil, fmt.Errorf("%w: learner %q info%s has no value (want null, int, float, string, bool, list or map)",
				errs.ErrInvalid, learners[i], showPath(path))
		}
	}
	switch vals[0].GetKind().(type) {
	case *rlhubv1.Value_ListValue:
		var out []*rlhubv1.Value
		for i, v := range vals {
			l, ok := v.GetKind().(*rlhubv1.Value_ListValue)
			if !ok {
				return nil, fmt.Errorf("%w: info%s is a list on learner %q but a %s on learner %q: cannot concatenate",
					errs.ErrInvalid, showPath(path), learners[0], infoval.Kind(v), learners[i])
			}
			for _, e := range l.ListValue.GetValues() {
				out = append(out, clone(e))
			}
		}
		return infoval.List(out...), nil
	case *rlhubv1.Value_MapValue:
		first := vals[0].GetMapValue()
		out := &rlhubv1.ValueMap{Fields: make(map[string]*rlhubv1.Value, len(first.GetFields()))}
		for _, k := range infoval.Keys(vals[0]) {
			if homog[k] {
				out.Fields[k] = clone(first.Fields[k])
				continue
			}
			sub := make([]*rlhubv1.Value, len(vals))
			for i, v := range vals {
				mv, ok := v.GetKind().(*rlhubv1.Value_MapValue)
				if !ok {
					return nil, fmt.Errorf("%w: info%s is a map on learner %q but a %s on learner %q",
						errs.ErrInvalid, showPath(path), learners[0], infoval.Kind(v), learners[i])
				}
				e, ok := mv.MapValue.GetFields()[k]
				if !ok {
					return nil, fmt.Errorf("%w: learner %q info%s lacks key %q that learner %q reports",
						errs.ErrInvalid, learners[i], showPath(path), truncate(k), learners[0])
				}
				sub[i] = e
			}
			merged, err := mergeDI(append(path, k), learners, sub, homog)
			if err != nil {
				return nil, err
			}
			out.Fields[k] = merged
		}
		return &rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: out}}, nil
	}
	// null, int, float, string, bool: the values as they are.
	out := make([]*rlhubv1.Value, len(vals))
	for i, v := range vals {
		out[i] = clone(v)
	}
	return infoval.List(out...), nil
}

// showPath renders a key path for an error: ` key "a"."b"`, or "" at the top.
func showPath(path []string) string {
	if len(path) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(" key ")
	for i, k := range path {
		if i > 0 {
			b.WriteByte('.')
		}
		fmt.Fprintf(&b, "%q", truncate(k))
		if b.Len() > 256 {
			b.WriteString("…")
			break
		}
	}
	return b.String()
}

// truncate bounds a string echoed in an error.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// strictKind is the kind the strict rule compares: ints and floats are
// both numbers.
func strictKind(v *rlhubv1.Value) string {
	switch k := infoval.Kind(v); k {
	case "int", "float":
		return "number"
	default:
		return k
	}
}

func mergeStrict(parts []InfoPart, homog map[string]bool) (*rlhubv1.Value, error) {
	for _, p := range parts {
		if _, ok := p.Info.GetKind().(*rlhubv1.Value_MapValue); !ok {
			return nil, fmt.Errorf("%w: learner %q info is a %s; the strict merge wants a map", errs.ErrInvalid, p.Learner, infoval.Kind(p.Info))
		}
	}
	first := parts[0].Info.GetMapValue().GetFields()
	keys := infoval.Keys(parts[0].Info)
	for _, p := range parts {
		info := p.Info.GetMapValue().GetFields()
		for k, v := range info {
			if _, ok := first[k]; !ok {
				return nil, fmt.Errorf("%w: learner %q info has key %q that learner %q lacks", errs.ErrInvalid, p.Learner, truncate(k), parts[0].Learner)
			}
			if infoval.Kind(v) == "" {
				return nil, fmt.Errorf("%w: learner %q info key %q has no value", errs.ErrInvalid, p.Learner, truncate(k))
			}
		}
		for _, k := range keys {
			if _, ok := info[k]; !ok {
				return nil, fmt.Errorf("%w: learner %q info lacks key %q that learner %q reports", errs.ErrInvalid, p.Learner, truncate(k), parts[0].Learner)
			}
		}
	}
	out := &rlhubv1.ValueMap{Fields: make(map[string]*rlhubv1.Value, len(keys))}
	for _, k := range keys {
		v0 := first[k]
		if homog[k] {
			for _, p := range parts {
				v := p.Info.GetMapValue().GetFields()[k]
				if !proto.Equal(v, v0) {
					return nil, fmt.Errorf("%w: homogeneous info key %q is %s on learner %q but %s on learner %q",
						errs.ErrInvalid, truncate(k), show(v), p.Learner, show(v0), parts[0].Learner)
				}
			}
			out.Fields[k] = clone(v0)
			continue
		}
		var list []*rlhubv1.Value
		for _, p := range parts {
			v := p.Info.GetMapValue().GetFields()[k]
			if strictKind(v) != strictKind(v0) {
				return nil, fmt.Errorf("%w: info key %q is a %s on learner %q but a %s on learner %q",
					errs.ErrInvalid, truncate(k), strictKind(v), p.Learner, strictKind(v0), parts[0].Learner)
			}
			if l, ok := v.Kind.(*rlhubv1.Value_ListValue); ok {
				for _, e := range l.ListValue.GetValues() {
					list = append(list, clone(e))
				}
			} else {
				list = append(list, clone(v))
			}
		}
		out.Fields[k] = infoval.List(list...)
	}
	return &rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: out}}, nil
}

func show(v *rlhubv1.Value) string {
	s := fmt.Sprint(infoval.To(v))
	if len(s) > 64 {
		return "a " + infoval.Kind(v)
	}
	return s
}
