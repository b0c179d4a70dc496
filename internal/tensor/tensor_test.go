package tensor

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestDTypeNamesRoundTrip(t *testing.T) {
	for d := BOOL; d < numDTypes; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
		if d.Size() == 0 {
			t.Errorf("%v has size 0", d)
		}
	}
	if _, err := ParseDType("F4"); err == nil {
		t.Error("ParseDType(F4) succeeded; sub-byte types are unsupported")
	}
}

func TestByteLen(t *testing.T) {
	tests := []struct {
		dt    DType
		shape []int64
		want  int64
		ok    bool
	}{
		{F32, []int64{2, 3}, 24, true},
		{F32, nil, 4, true},
		{BF16, []int64{0, 5}, 0, true},
		{F64, []int64{-1}, 0, false},
		{F32, []int64{math.MaxInt64 / 2}, 0, false},
		{U8, []int64{1 << 40, 1 << 40}, 0, false},
		{Invalid, []int64{1}, 0, false},
	}
	for _, tt := range tests {
		got, ok := ByteLen(tt.dt, tt.shape)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ByteLen(%v, %v) = %d, %v; want %d, %v", tt.dt, tt.shape, got, ok, tt.want, tt.ok)
		}
	}
}

func TestFloat32ViewAliases(t *testing.T) {
	tt := NewF32("w", 2, 2)
	v, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	v[3] = 1.5
	if got := math.Float32frombits(uint32(tt.Data[12]) | uint32(tt.Data[13])<<8 | uint32(tt.Data[14])<<16 | uint32(tt.Data[15])<<24); got != 1.5 {
		t.Fatalf("write through view not visible in Data: %v", got)
	}
	if _, err := BytesAsFloat32s(AlignedBytes(9)[1:]); err == nil {
		t.Fatal("unaligned view succeeded")
	}
	if _, err := (&Tensor{Name: "x", DType: F16, Shape: []int64{2}, Data: make([]byte, 4)}).Float32s(); err == nil {
		t.Fatal("F16 tensor viewed as float32")
	}
}

func TestStateDictRules(t *testing.T) {
	sd, err := NewStateDict(NewF32("a", 3), NewF32("b", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := sd.Add(NewF32("a", 1)); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("duplicate add: %v", err)
	}
	if err := sd.Add(&Tensor{Name: "bad", DType: F32, Shape: []int64{3}, Data: make([]byte, 8)}); err == nil {
		t.Fatal("inconsistent tensor accepted")
	}
	if sd.Len() != 2 || sd.ByteSize() != 20 || sd.Get("b") == nil || sd.Get("zz") != nil {
		t.Fatalf("state dict contents wrong: len %d size %d", sd.Len(), sd.ByteSize())
	}
	c := sd.Clone()
	c.Get("a").Data[0] = 9
	if sd.Get("a").Data[0] == 9 {
		t.Fatal("Clone shares data")
	}
	other, _ := NewStateDict(NewF32("a", 3), NewF32("b", 2, 1))
	if err := other.CheckLayout(sd); err == nil || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("CheckLayout = %v, want shape mismatch on b", err)
	}
	if err := c.CheckLayout(sd); err != nil {
		t.Fatalf("CheckLayout of clone: %v", err)
	}
}

// TestStateDictLargeAndSmall checks lookups and duplicate detection on both
// sides of the size where the name index appears.
func TestStateDictLargeAndSmall(t *testing.T) {
	for _, n := range []int{1, smallDict - 1, smallDict, smallDict + 1, 100} {
		for _, made := range []bool{false, true} {
			sd := &StateDict{}
			if made {
				sd = MakeStateDict(n)
			}
			for i := range n {
				if err := sd.Add(NewF32(fmt.Sprintf("t%03d", i), 1)); err != nil {
					t.Fatalf("n=%d: add %d: %v", n, i, err)
				}
			}
			for i := range n {
				name := fmt.Sprintf("t%03d", i)
				if got := sd.Get(name); got == nil || got.Name != name {
					t.Fatalf("n=%d made=%v: Get(%s) = %v", n, made, name, got)
				}
				if err := sd.Add(NewF32(name, 1)); err == nil {
					t.Fatalf("n=%d made=%v: duplicate %s accepted", n, made, name)
				}
			}
			if sd.Get("missing") != nil || sd.Len() != n {
				t.Fatalf("n=%d: Get(missing) found something or Len %d", n, sd.Len())
			}
			c := sd.Clone()
			if c.Get(fmt.Sprintf("t%03d", n-1)) == nil {
				t.Fatalf("n=%d: clone lost a name", n)
			}
		}
	}
}

// TestNewStateDictUnchecked: a dict built from a trusted slice keeps its
// order and finds every name, with and without the name index, and then
// still rejects duplicates added later.
func TestNewStateDictUnchecked(t *testing.T) {
	for _, n := range []int{0, 1, smallDict, smallDict + 1, 100} {
		ts := make([]*Tensor, n)
		for i := range ts {
			ts[i] = NewF32(fmt.Sprintf("t%03d", n-i), 1)
		}
		sd := NewStateDictUnchecked(ts)
		if sd.Len() != n {
			t.Fatalf("n=%d: Len %d", n, sd.Len())
		}
		for i, want := range ts {
			if sd.At(i) != want || sd.Get(want.Name) != want {
				t.Fatalf("n=%d: tensor %d (%s) not at its place", n, i, want.Name)
			}
		}
		if sd.Get("missing") != nil {
			t.Fatalf("n=%d: Get(missing) found something", n)
		}
		if n > 0 {
			if err := sd.Add(NewF32(ts[0].Name, 1)); err == nil {
				t.Fatalf("n=%d: duplicate %s accepted after NewStateDictUnchecked", n, ts[0].Name)
			}
		}
		if err := sd.Add(NewF32("new", 1)); err != nil || sd.Get("new") == nil || sd.Len() != n+1 {
			t.Fatalf("n=%d: Add after NewStateDictUnchecked: %v", n, err)
		}
	}
}
