package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/tensor"
)

// This file keeps the first header parser, built on encoding/json's token
// stream, as a slow but obviously-correct reference: FuzzHeaderParsers checks
// that the hand-written parser in header.go accepts what it accepts (except
// lone UTF-16 surrogate escapes, which only header.go rejects, as the Rust
// reference library does) and returns the same entries.

// parseHeaderRef parses the JSON header strictly: one object, unique keys,
// known fields only, trailing spaces allowed (the reference pads with them).
func parseHeaderRef(raw []byte) (*header, error) {
	if !utf8.Valid(raw) {
		return nil, invalidf("header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := expectDelimRef(dec, '{', "header"); err != nil {
		return nil, err
	}
	h := &header{}
	seen := make(map[string]struct{})
	for dec.More() {
		key, err := stringTokenRef(dec, "header key")
		if err != nil {
			return nil, err
		}
		if _, dup := seen[key]; dup {
			return nil, invalidf("duplicate key %q in header", key)
		}
		seen[key] = struct{}{}
		if key == MetadataKey {
			if h.metadata, err = parseMetadataRef(dec); err != nil {
				return nil, err
			}
			continue
		}
		if key == "" {
			return nil, invalidf("empty tensor name")
		}
		e, err := parseEntryRef(dec, key)
		if err != nil {
			return nil, err
		}
		h.entries = append(h.entries, e)
	}
	if err := expectDelimRef(dec, '}', "header"); err != nil {
		return nil, err
	}
	// Only padding may follow the object.
	if len(bytes.Trim(raw[dec.InputOffset():], " \t\r\n")) != 0 {
		return nil, invalidf("unexpected bytes after the header object")
	}
	return h, nil
}

func jsonErrRef(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidf("header JSON ends inside %s", what)
	}
	return invalidf("header JSON malformed in %s: %v", what, err)
}

func expectDelimRef(dec *json.Decoder, d json.Delim, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonErrRef(what, err)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return invalidf("%s: expected %q, got %v", what, rune(d), tok)
	}
	return nil
}

func stringTokenRef(dec *json.Decoder, what string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", jsonErrRef(what, err)
	}
	s, ok := tok.(string)
	if !ok {
		return "", invalidf("%s: expected a string, got %v", what, tok)
	}
	return s, nil
}

func uintTokenRef(dec *json.Decoder, what string) (uint64, error) {
	tok, err := dec.Token()
	if err != nil {
		return 0, jsonErrRef(what, err)
	}
	num, ok := tok.(json.Number)
	if !ok {
		return 0, invalidf("%s: expected a non-negative integer, got %v", what, tok)
	}
	v, ok := parseUint(string(num))
	if !ok {
		return 0, invalidf("%s: %s is not a non-negative 63-bit integer", what, num)
	}
	return v, nil
}

func parseMetadataRef(dec *json.Decoder) (map[string]string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonErrRef(MetadataKey, err)
	}
	if tok == nil { // "__metadata__": null
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalidf("%s must be an object of strings", MetadataKey)
	}
	md := make(map[string]string)
	for dec.More() {
		k, err := stringTokenRef(dec, MetadataKey+" key")
		if err != nil {
			return nil, err
		}
		if _, dup := md[k]; dup {
			return nil, invalidf("duplicate %s key %q", MetadataKey, k)
		}
		v, err := stringTokenRef(dec, MetadataKey+" value of "+k)
		if err != nil {
			return nil, err
		}
		md[k] = v
	}
	if err := expectDelimRef(dec, '}', MetadataKey); err != nil {
		return nil, err
	}
	return md, nil
}

func parseEntryRef(dec *json.Decoder, name string) (entry, error) {
	e := entry{Tensor: tensor.Tensor{Name: name}}
	what := "tensor " + quoteRef(name)
	if err := expectDelimRef(dec, '{', what); err != nil {
		return e, err
	}
	var haveDtype, haveShape, haveOffsets bool
	for dec.More() {
		field, err := stringTokenRef(dec, what+" field")
		if err != nil {
			return e, err
		}
		switch field {
		case "dtype":
			if haveDtype {
				return e, invalidf("%s: duplicate dtype", what)
			}
			haveDtype = true
			s, err := stringTokenRef(dec, what+" dtype")
			if err != nil {
				return e, err
			}
			if e.DType, err = tensor.ParseDType(s); err != nil {
				return e, invalidf("%s: unknown dtype %q", what, s)
			}
		case "shape":
			if haveShape {
				return e, invalidf("%s: duplicate shape", what)
			}
			haveShape = true
			if err := expectDelimRef(dec, '[', what+" shape"); err != nil {
				return e, err
			}
			e.Shape = []int64{}
			for dec.More() {
				d, err := uintTokenRef(dec, what+" shape")
				if err != nil {
					return e, err
				}
				e.Shape = append(e.Shape, int64(d))
			}
			if err := expectDelimRef(dec, ']', what+" shape"); err != nil {
				return e, err
			}
		case "data_offsets":
			if haveOffsets {
				return e, invalidf("%s: duplicate data_offsets", what)
			}
			haveOffsets = true
			if err := expectDelimRef(dec, '[', what+" data_offsets"); err != nil {
				return e, err
			}
			if e.begin, err = uintTokenRef(dec, what+" data_offsets"); err != nil {
				return e, err
			}
			if e.end, err = uintTokenRef(dec, what+" data_offsets"); err != nil {
				return e, err
			}
			if err := expectDelimRef(dec, ']', what+" data_offsets (exactly two numbers)"); err != nil {
				return e, err
			}
		default:
			return e, invalidf("%s: unknown field %q", what, field)
		}
	}
	if err := expectDelimRef(dec, '}', what); err != nil {
		return e, err
	}
	if !haveDtype || !haveShape || !haveOffsets {
		return e, invalidf("%s: needs dtype, shape and data_offsets", what)
	}
	return e, nil
}

func quoteRef(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func parseUint(s string) (uint64, bool) {
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil && v <= math.MaxInt64
}
