package safetensors

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/rlhub/rlhub/internal/errs"
)

// seeds are the Python vectors, the malformed table and the edge cases: the
// starting corpus of both fuzz targets (plus testdata/fuzz/FuzzDecode).
func seeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, b := range loadVectors(f) {
		out = append(out, b)
	}
	for _, tc := range malformedCases() {
		out = append(out, tc.in)
	}
	out = append(out,
		blob(`{}`, nil),
		blob(`{"__metadata__":{"a":"\u00e9"},"x":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}`, make([]byte, 4)),
		blob(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}),
		// Once accepted by the fast path as if "{}" did not close the object.
		blob(`{}"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}),
	)
	return out
}

// FuzzDecode: Decode never panics, never modifies its input, rejects with
// ErrInvalid, and whatever it accepts tiles the buffer exactly, aliases it,
// and survives a canonical re-encode → decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		before := bytes.Clone(in)
		file, err := Decode(in)
		if !bytes.Equal(before, in) {
			t.Fatal("Decode modified its input")
		}
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("error %v does not wrap errs.ErrInvalid", err)
			}
			return
		}
		pos := 8 + int(file.HeaderLen)
		for _, tn := range file.Tensors.Tensors() {
			if len(tn.Data) > 0 && unsafe.SliceData(tn.Data) != &in[pos] {
				t.Fatalf("tensor %q does not alias the input at offset %d", tn.Name, pos)
			}
			if err := tn.Validate(); err != nil {
				t.Fatal(err)
			}
			pos += len(tn.Data)
		}
		if pos != len(in) {
			t.Fatalf("tensors cover %d of %d bytes", pos, len(in))
		}
		again, err := Encode(file.Tensors, file.Metadata)
		if err != nil {
			t.Fatalf("re-encoding a decoded file: %v", err)
		}
		g, err := Decode(again)
		if err != nil {
			t.Fatalf("decoding the re-encoding: %v", err)
		}
		if len(g.Metadata) != len(file.Metadata) {
			t.Fatalf("metadata %q became %q", file.Metadata, g.Metadata)
		}
		for k, v := range file.Metadata {
			if g.Metadata[k] != v {
				t.Fatalf("metadata %q became %q", file.Metadata, g.Metadata)
			}
		}
		if g.Tensors.Len() != file.Tensors.Len() {
			t.Fatalf("%d tensors became %d", file.Tensors.Len(), g.Tensors.Len())
		}
		for _, a := range file.Tensors.Tensors() {
			b := g.Tensors.Get(a.Name)
			if b == nil || !b.SameLayout(a) || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("tensor %q changed in the round trip", a.Name)
			}
		}
		if third, err := Encode(g.Tensors, g.Metadata); err != nil || !bytes.Equal(third, again) {
			t.Fatalf("encoding is not canonical: %v", err)
		}
	})
}

// FuzzHeaderParsers checks the hand-written header parser against the
// encoding/json-based reference: they accept the same headers (except lone
// surrogate escapes, which only the fast parser rejects) and agree on every
// entry and metadata value. It also checks parseHeader's fast path for the
// writers' layout against its general parser (checkCanonical).
func FuzzHeaderParsers(f *testing.F) {
	for _, s := range seeds(f) {
		if len(s) >= 8 {
			n := min(uint64(len(s)-8), uint64(s[0])|uint64(s[1])<<8|uint64(s[2])<<16)
			f.Add(s[8 : 8+n])
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkCanonical(t, raw)
		got, err := parseHeader(raw)
		want, refErr := parseHeaderRef(raw)
		switch {
		case err != nil && refErr != nil:
			return
		case err == nil && refErr != nil:
			t.Fatalf("fast parser accepted what the reference rejects (%v): %q", refErr, raw)
		case err != nil && refErr == nil:
			if !strings.Contains(err.Error(), "surrogate") {
				t.Fatalf("fast parser rejected what the reference accepts: %v: %q", err, raw)
			}
			return
		}
		if !errors.Is(err, errs.ErrInvalid) && err != nil {
			t.Fatal(err)
		}
		if len(got.entries) != len(want.entries) || (len(got.entries) > 0 && !reflect.DeepEqual(got.entries, want.entries)) {
			t.Fatalf("entries differ:\n got %+v\nwant %+v", got.entries, want.entries)
		}
		if len(got.metadata) != len(want.metadata) || (got.metadata == nil) != (want.metadata == nil) {
			t.Fatalf("metadata differ: %q vs %q", got.metadata, want.metadata)
		}
		for k, v := range want.metadata {
			if got.metadata[k] != v {
				t.Fatalf("metadata differ: %q vs %q", got.metadata, want.metadata)
			}
		}
	})
}
