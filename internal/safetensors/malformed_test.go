package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
)

// blob assembles prefix + header + data without any checking, so tests can
// build every kind of broken input.
func blob(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

// withLen is a blob whose length prefix claims n instead of the truth.
func withLen(n uint64, rest string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, n), rest...)
}

const okEntry = `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`

type malformedCase struct {
	name string
	in   []byte
	opt  Options
	want string // substring of the error message
}

func malformedCases() []malformedCase {
	d8, d12, d16 := make([]byte, 8), make([]byte, 12), make([]byte, 16)
	return []malformedCase{
		{"empty input", nil, Options{}, "too short for the 8-byte header length"},
		{"truncated prefix", []byte{8, 0, 0}, Options{}, "too short for the 8-byte header length"},
		{"truncated header", withLen(100, `{"a":`), Options{}, "exceeds the 5 bytes after the prefix"},
		{"truncated data", blob(`{`+okEntry+`}`, d8[:5]), Options{}, "beyond the 5 data bytes"},
		{"huge header length", withLen(1<<60, "{}"), Options{}, "exceeds the limit of 100000000"},
		{"header length just over option", blob(`{`+okEntry+`}`, d8), Options{MaxHeaderBytes: 16}, "exceeds the limit of 16"},
		{"header length zero", withLen(0, ""), Options{}, "too short for a JSON object"},
		{"header length max uint64", withLen(^uint64(0), "{}"), Options{}, "exceeds the limit"},
		{"lying offsets beyond data", blob(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, d8), Options{}, "beyond the 8 data bytes"},
		{"offsets end before begin", blob(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}`, d8), Options{}, "gap in data"},
		{"offsets reversed at start", blob(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"c":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, d8[:4]), Options{}, "end before they begin"},
		{"overlap", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, d12), Options{}, "overlap the previous tensor"},
		{"same offsets twice", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8), Options{}, "overlap the previous tensor"},
		{"gap between tensors", blob(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, d12), Options{}, "gap in data before offset 8"},
		{"gap at start", blob(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, d8), Options{}, "gap in data before offset 4"},
		{"trailing bytes", blob(`{`+okEntry+`}`, d12), Options{}, "4 trailing data bytes"},
		{"data but no tensors", blob(`{}`, d8), Options{}, "8 trailing data bytes"},
		{"bad JSON: not JSON", blob(`hello, world`, nil), Options{}, `expected '{'`},
		{"bad JSON: unterminated object", blob(`{`+okEntry, d8), Options{}, "header ends, expected ',' or '}'"},
		{"bad JSON: missing value", blob(`{"a":}`, nil), Options{}, `expected '{'`},
		{"bad JSON: trailing comma", blob(`{`+okEntry+`,}`, d8), Options{}, `expected '"'`},
		{"bad JSON: missing comma", blob(`{`+okEntry+` "b":{}}`, d8), Options{}, "expected ',' or '}'"},
		{"bad JSON: garbage after object", blob(`{`+okEntry+`}x`, d8), Options{}, "unexpected bytes after the header object"},
		{"bad JSON: two objects", blob(`{`+okEntry+`}{}`, d8), Options{}, "unexpected bytes after the header object"},
		{"bad JSON: array header", blob(`[]`, nil), Options{}, `expected '{'`},
		{"bad JSON: unterminated string", blob(`{"abc`, nil), Options{}, "header key: header ends inside a string"},
		{"bad JSON: control character in name", blob("{\"a\tb\":{}}", nil), Options{}, "control character"},
		{"bad JSON: bad escape", blob(`{"a\x":{}}`, nil), Options{}, `bad escape \x`},
		{"bad JSON: lone surrogate", blob(`{"a\ud800":{}}`, nil), Options{}, "lone UTF-16 surrogate"},
		{"bad JSON: leading zero", blob(`{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}`, d8), Options{}, "leading zero"},
		{"bad JSON: float shape", blob(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, d8), Options{}, "is not an integer"},
		{"negative dimension", blob(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, d8), Options{}, "expected a non-negative integer"},
		{"offset beyond int64", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9223372036854775808]}}`, d8), Options{}, "not a non-negative 63-bit integer"},
		{"offset just beyond int64", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9223372036854775808]}}`, d8), Options{}, "not a non-negative 63-bit integer"},
		{"offset far beyond uint64", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,123456789012345678901234567890]}}`, d8), Options{}, "not a non-negative 63-bit integer"},
		{"offset at int64 max", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9223372036854775807]}}`, d8), Options{}, "beyond the 8 data bytes"},
		{"three data_offsets", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, d8), Options{}, "exactly two numbers"},
		{"one data_offset", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, d8), Options{}, "exactly two numbers"},
		{"duplicate names", blob(`{`+okEntry+`,`+okEntry+`}`, d16), Options{}, `duplicate key "a"`},
		{"duplicate names via escape", blob(`{`+okEntry+`,"\u0061":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, d16), Options{}, `duplicate key "a"`},
		{"duplicate metadata", blob(`{"__metadata__":{},"__metadata__":{}}`, nil), Options{}, "duplicate key"},
		{"duplicate metadata key", blob(`{"__metadata__":{"k":"1","k":"2"}}`, nil), Options{}, `duplicate __metadata__ key "k"`},
		{"metadata not strings", blob(`{"__metadata__":{"k":1}}`, nil), Options{}, `expected '"'`},
		{"metadata an array", blob(`{"__metadata__":["k"]}`, nil), Options{}, "must be an object of strings"},
		{"duplicate field", blob(`{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8), Options{}, "duplicate dtype"},
		{"missing field", blob(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, d8), Options{}, "needs dtype, shape and data_offsets"},
		{"unknown field", blob(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]}}`, d8), Options{}, `unknown field "stride"`},
		{"unknown dtype", blob(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}}`, d8), Options{}, `unknown dtype "F4"`},
		{"lower-case dtype", blob(`{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, d8), Options{}, `unknown dtype "f32"`},
		{"non-UTF-8 name", blob("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d8), Options{}, "not valid UTF-8"},
		{"non-UTF-8 metadata", blob("{\"__metadata__\":{\"k\":\"\xc3\"}}", nil), Options{}, "not valid UTF-8"},
		{"empty name", blob(`{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8), Options{}, "empty tensor name"},
		{"shape × size too big", blob(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, d8), Options{}, "shape [3] × F32 is 12 bytes but data_offsets [0,8] hold 8"},
		{"shape × size too small", blob(`{"a":{"dtype":"F64","shape":[],"data_offsets":[0,4]}}`, d8[:4]), Options{}, "is 8 bytes but"},
		{"shape overflows", blob(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}}`, d8), Options{}, "overflows"},
		{"too many tensors", blob(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, d8[:2]), Options{MaxTensors: 1}, "2 tensors exceeds the limit of 1"},
	}
}

func TestMalformedInputs(t *testing.T) {
	for _, tc := range malformedCases() {
		t.Run(tc.name, func(t *testing.T) {
			before := bytes.Clone(tc.in)
			f, err := DecodeOptions(tc.in, tc.opt)
			if err == nil {
				t.Fatalf("decoded %d tensors, want an error containing %q", f.Tensors.Len(), tc.want)
			}
			if !errors.Is(err, errs.ErrInvalid) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not wrap errs.ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
			if f != nil {
				t.Errorf("got a File alongside the error")
			}
			if !bytes.Equal(before, tc.in) {
				t.Errorf("Decode modified its input")
			}
		})
	}
}

// TestWellFormedEdgeCases pins what is accepted: the format's corner cases
// must not be rejected by an over-strict decoder.
func TestWellFormedEdgeCases(t *testing.T) {
	cases := []struct {
		name    string
		in      []byte
		tensors int
	}{
		{"empty header", blob(`{}`, nil), 0},
		{"padded and spaced", blob(" \n{ \"a\" : { \"dtype\" : \"F32\" , \"shape\" : [ 2 ] , \"data_offsets\" : [ 0 , 8 ] } }\t\r\n  ", make([]byte, 8)), 1},
		{"fields in any order", blob(`{"a":{"data_offsets":[0,8],"shape":[2],"dtype":"F32"}}`, make([]byte, 8)), 1},
		{"null metadata", blob(`{"__metadata__":null,`+okEntry+`}`, make([]byte, 8)), 1},
		{"header order differs from data order", blob(`{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1, 2}), 2},
		{"zero-size tensors share an offset", blob(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}`, nil), 2},
		{"escaped name", blob(`{"\u00e9\ud83d\ude00\n":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}`, []byte{7}), 1},
		{"scalar", blob(`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 8)), 1},
	}
	for _, tc := range cases {
		f, err := Decode(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if f.Tensors.Len() != tc.tensors {
			t.Errorf("%s: %d tensors, want %d", tc.name, f.Tensors.Len(), tc.tensors)
		}
	}
	// More than 12 entries (where sorting stops being insertion sort), in
	// reverse data order, each zero-size tensor sharing its offset with a
	// non-empty one.
	var hb strings.Builder
	hb.WriteString("{")
	for i := 19; i >= 0; i-- {
		if i < 19 {
			hb.WriteString(",")
		}
		fmt.Fprintf(&hb, `"t%d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]},"z%d":{"dtype":"F32","shape":[0],"data_offsets":[%d,%d]}`, i, i, i+1, i, i, i)
	}
	hb.WriteString("}")
	f, err := Decode(blob(hb.String(), make([]byte, 20)))
	if err != nil {
		t.Fatalf("zero-size tensors sharing offsets: %v", err)
	}
	if n := f.Tensors.Names(); len(n) != 40 || n[0] != "z0" || n[1] != "t0" || n[39] != "t19" {
		t.Errorf("file order %v", n)
	}
	f, err = Decode(blob(`{"\u00e9\ud83d\ude00\n":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}`, []byte{7}))
	if err != nil || f.Tensors.At(0).Name != "é😀\n" {
		t.Errorf("escaped name decoded as %q, %v", f.Tensors.At(0).Name, err)
	}
}

// TestErrorsDoNotEchoUnboundedInput: a peer's header names tensors and
// shapes of any length (within the header's 16 MiB); the errors quoted
// them whole, and they reached logs and replies. Names are quoted and
// cut, shapes cut with their rank.
func TestErrorsDoNotEchoUnboundedInput(t *testing.T) {
	long := strings.Repeat("n", 100_000)
	rank := "[" + strings.Repeat("1,", 20_000) + "3]"
	for name, in := range map[string][]byte{
		"long name, offsets beyond the data": blob(`{"`+long+`":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, nil),
		"long name, a gap":                   blob(`{"`+long+`":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)),
		"huge rank, wrong size":              blob(`{"a":{"dtype":"F32","shape":`+rank+`,"data_offsets":[0,8]}}`, make([]byte, 8)),
		"long unknown dtype":                 blob(`{"a":{"dtype":"`+long+`","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)),
		"long unknown field":                 blob(`{"a":{"`+long+`":1,"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)),
	} {
		_, err := Decode(in)
		if !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
			continue
		}
		if n := len(err.Error()); n > 600 {
			t.Errorf("%s: an error of %d bytes echoes the input", name, n)
		}
	}
}
