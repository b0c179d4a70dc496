// Package infoval converts between Go values and rlhubv1.Value, the
// JSON-like value learners return as info. Unlike google.protobuf.Struct it
// keeps integers apart from floats, so an integer a learner reports comes
// back to the coordinator as the same integer.
package infoval

import (
	"fmt"
	"math"
	"reflect"
	"slices"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// maxDepth bounds nesting on both conversions (a cycle or a hostile value
// must not exhaust the stack).
const maxDepth = 64

// From converts a Go value: nil, bool, any integer type (an unsigned one
// above MaxInt64 is an error), float32/float64, string, a slice or array of
// any of these, a map with string keys, or a *rlhubv1.Value (cloned by
// reference: it is used as is). Anything else is an error naming its type.
func From(v any) (*rlhubv1.Value, error) { return from(reflect.ValueOf(v), 0) }

// Map is From for a map[string]any; a nil map gives an empty map value.
func Map(m map[string]any) (*rlhubv1.Value, error) {
	if m == nil {
		return &rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: &rlhubv1.ValueMap{}}}, nil
	}
	return From(m)
}

func from(r reflect.Value, depth int) (*rlhubv1.Value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("info nested deeper than %d", maxDepth)
	}
	if !r.IsValid() {
		return Null(), nil
	}
	if pv, ok := r.Interface().(*rlhubv1.Value); ok {
		if pv == nil {
			return Null(), nil
		}
		return pv, nil
	}
	switch r.Kind() {
	case reflect.Interface, reflect.Pointer:
		if r.IsNil() {
			return Null(), nil
		}
		return from(r.Elem(), depth+1)
	case reflect.Bool:
		return &rlhubv1.Value{Kind: &rlhubv1.Value_BoolValue{BoolValue: r.Bool()}}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return Int(r.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := r.Uint()
		if u > math.MaxInt64 {
			return nil, fmt.Errorf("integer %d does not fit in int64", u)
		}
		return Int(int64(u)), nil
	case reflect.Float32, reflect.Float64:
		return Float(r.Float()), nil
	case reflect.String:
		return String(r.String()), nil
	case reflect.Slice, reflect.Array:
		if r.Kind() == reflect.Slice && r.IsNil() {
			return List(), nil
		}
		out := make([]*rlhubv1.Value, r.Len())
		for i := range out {
			e, err := from(r.Index(i), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return List(out...), nil
	case reflect.Map:
		if r.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("info map with %s keys (want string keys)", r.Type().Key())
		}
		m := &rlhubv1.ValueMap{Fields: make(map[string]*rlhubv1.Value, r.Len())}
		it := r.MapRange()
		for it.Next() {
			e, err := from(it.Value(), depth+1)
			if err != nil {
				return nil, err
			}
			m.Fields[it.Key().String()] = e
		}
		return &rlhubv1.Value{Kind: &rlhubv1.Value_MapValue{MapValue: m}}, nil
	}
	return nil, fmt.Errorf("cannot put a %s into info", r.Type())
}

// To converts back: nil, int64, float64, string, bool, []any or
// map[string]any. A Value with no kind set becomes nil; nesting deeper than
// the bound is cut off as nil (values that arrived over the network were
// checked by Check).
func To(v *rlhubv1.Value) any { return to(v, 0) }

func to(v *rlhubv1.Value, depth int) any {
	if depth > maxDepth {
		return nil
	}
	switch k := v.GetKind().(type) {
	case *rlhubv1.Value_IntValue:
		return k.IntValue
	case *rlhubv1.Value_FloatValue:
		return k.FloatValue
	case *rlhubv1.Value_StringValue:
		return k.StringValue
	case *rlhubv1.Value_BoolValue:
		return k.BoolValue
	case *rlhubv1.Value_ListValue:
		out := make([]any, len(k.ListValue.GetValues()))
		for i, e := range k.ListValue.GetValues() {
			out[i] = to(e, depth+1)
		}
		return out
	case *rlhubv1.Value_MapValue:
		out := make(map[string]any, len(k.MapValue.GetFields()))
		for key, e := range k.MapValue.GetFields() {
			out[key] = to(e, depth+1)
		}
		return out
	}
	return nil
}

// Check reports the first value nested deeper than the bound.
func Check(v *rlhubv1.Value) error {
	var walk func(*rlhubv1.Value, int) error
	walk = func(v *rlhubv1.Value, depth int) error {
		if depth > maxDepth {
			return fmt.Errorf("info nested deeper than %d", maxDepth)
		}
		switch k := v.GetKind().(type) {
		case *rlhubv1.Value_ListValue:
			for _, e := range k.ListValue.GetValues() {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		case *rlhubv1.Value_MapValue:
			for _, e := range k.MapValue.GetFields() {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(v, 0)
}

// Null, Int, Float, String and List build values.
func Null() *rlhubv1.Value { return &rlhubv1.Value{Kind: &rlhubv1.Value_NullValue{NullValue: true}} }

// Int returns an integer value.
func Int(i int64) *rlhubv1.Value { return &rlhubv1.Value{Kind: &rlhubv1.Value_IntValue{IntValue: i}} }

// Float returns a floating-point value.
func Float(f float64) *rlhubv1.Value {
	return &rlhubv1.Value{Kind: &rlhubv1.Value_FloatValue{FloatValue: f}}
}

// String returns a string value.
func String(s string) *rlhubv1.Value {
	return &rlhubv1.Value{Kind: &rlhubv1.Value_StringValue{StringValue: s}}
}

// List returns a list value holding vs (not copied).
func List(vs ...*rlhubv1.Value) *rlhubv1.Value {
	return &rlhubv1.Value{Kind: &rlhubv1.Value_ListValue{ListValue: &rlhubv1.ValueList{Values: vs}}}
}

// Kind names a value's kind: "null", "int", "float", "string", "bool",
// "list", "map", or "" when none is set.
func Kind(v *rlhubv1.Value) string {
	switch v.GetKind().(type) {
	case *rlhubv1.Value_NullValue:
		return "null"
	case *rlhubv1.Value_IntValue:
		return "int"
	case *rlhubv1.Value_FloatValue:
		return "float"
	case *rlhubv1.Value_StringValue:
		return "string"
	case *rlhubv1.Value_BoolValue:
		return "bool"
	case *rlhubv1.Value_ListValue:
		return "list"
	case *rlhubv1.Value_MapValue:
		return "map"
	}
	return ""
}

// Keys returns a map value's keys, sorted; nil for any other value.
func Keys(v *rlhubv1.Value) []string {
	m := v.GetMapValue().GetFields()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
