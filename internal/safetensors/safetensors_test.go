package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

func TestRoundTripAndReferenceOrder(t *testing.T) {
	a := tensor.NewF32("a", 2)
	v, _ := a.Float32s()
	v[0], v[1] = 1, 1
	sd, err := tensor.NewStateDict(
		&tensor.Tensor{Name: "b", DType: tensor.F16, Shape: []int64{3}, Data: make([]byte, 6)},
		a,
		&tensor.Tensor{Name: "c", DType: tensor.I64, Shape: []int64{3}, Data: []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}},
		&tensor.Tensor{Name: "z", DType: tensor.BOOL, Shape: []int64{1}, Data: []byte{0}},
	)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	// What Python's safetensors.numpy.save writes for the same dict.
	wantHeader := `{"c":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},"a":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},"b":{"dtype":"F16","shape":[3],"data_offsets":[32,38]},"z":{"dtype":"BOOL","shape":[1],"data_offsets":[38,39]}}   `
	if got := string(blob[8 : 8+len(wantHeader)]); got != wantHeader {
		t.Fatalf("header\n got %s\nwant %s", got, wantHeader)
	}
	f, err := Decode(blob)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Tensors.Names(); len(got) != 4 || got[0] != "c" || got[3] != "z" {
		t.Fatalf("decoded order %v", got)
	}
	fv, err := f.Tensors.Get("a").Float32s()
	if err != nil || fv[0] != 1 || fv[1] != 1 {
		t.Fatalf("a = %v, %v", fv, err)
	}
	again, _ := Encode(f.Tensors, nil)
	if !bytes.Equal(again, blob) {
		t.Fatal("re-encoding a decoded blob changed its bytes")
	}
	// The pieces a writer sends (Buffers, WriteTo) are the same bytes.
	l, err := Plan(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if joined := bytes.Join(l.Buffers(), nil); !bytes.Equal(joined, blob) {
		t.Fatal("Layout.Buffers joined differ from Encode")
	}
	var w bytes.Buffer
	if n, err := l.WriteTo(&w); err != nil || n != int64(len(blob)) || !bytes.Equal(w.Bytes(), blob) {
		t.Fatalf("Layout.WriteTo wrote %d bytes (%v), not Encode's %d", n, err, len(blob))
	}
}

func TestMetadataSortedAndDecoded(t *testing.T) {
	sd, _ := tensor.NewStateDict(tensor.NewF32("a", 2))
	blob, err := Encode(sd, map[string]string{"x": "1", "a": "2"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"__metadata__":{"a":"2","x":"1"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} `
	if got := string(blob[8 : len(blob)-8]); got != want {
		t.Fatalf("header\n got %q\nwant %q", got, want)
	}
	f, err := Decode(blob)
	if err != nil || f.Metadata["x"] != "1" || f.Metadata["a"] != "2" {
		t.Fatalf("metadata %v, %v", f.Metadata, err)
	}
}

func TestDecodeErrorsWrapInvalid(t *testing.T) {
	_, err := Decode([]byte{1, 2, 3})
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
}

// TestDuplicateNamesInLargeHeaders: the duplicate check switches from a
// linear search to a map past 32 names; both must catch a repeat.
func TestDuplicateNamesInLargeHeaders(t *testing.T) {
	blobOf := func(names []string) []byte {
		var js strings.Builder
		js.WriteString("{")
		for i, name := range names {
			fmt.Fprintf(&js, `%q:{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]},`, name, i, i+1)
		}
		js.WriteString(`"__metadata__":{"a":"b"}}`)
		blob := make([]byte, 8+js.Len()+len(names))
		binary.LittleEndian.PutUint64(blob, uint64(js.Len()))
		copy(blob[8:], js.String())
		return blob
	}
	for _, n := range []int{3, 31, 32, 33, 40, 100} {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("t%03d", i)
		}
		if f, err := Decode(blobOf(names)); err != nil || f.Tensors.Len() != n {
			t.Errorf("n=%d: unique names: %v", n, err)
		}
		names[n-1] = names[0] // repeat the first name last
		_, err := Decode(blobOf(names))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `duplicate key "t000"`) {
			t.Errorf("n=%d: err = %v, want duplicate key t000", n, err)
		}
	}
}
