package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/tensor"
)

// parseHeader parses the JSON header strictly: one object, unique keys,
// known fields only, trailing spaces allowed (the reference pads with them).
func parseHeader(raw []byte) (*header, error) {
	if !utf8.Valid(raw) {
		return nil, invalidf("header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := expectDelim(dec, '{', "header"); err != nil {
		return nil, err
	}
	h := &header{}
	seen := make(map[string]struct{})
	for dec.More() {
		key, err := stringToken(dec, "header key")
		if err != nil {
			return nil, err
		}
		if _, dup := seen[key]; dup {
			return nil, invalidf("duplicate key %q in header", key)
		}
		seen[key] = struct{}{}
		if key == MetadataKey {
			if h.metadata, err = parseMetadata(dec); err != nil {
				return nil, err
			}
			continue
		}
		if key == "" {
			return nil, invalidf("empty tensor name")
		}
		e, err := parseEntry(dec, key)
		if err != nil {
			return nil, err
		}
		h.entries = append(h.entries, e)
	}
	if err := expectDelim(dec, '}', "header"); err != nil {
		return nil, err
	}
	// Only padding may follow the object.
	if len(bytes.Trim(raw[dec.InputOffset():], " \t\r\n")) != 0 {
		return nil, invalidf("unexpected bytes after the header object")
	}
	return h, nil
}

func jsonErr(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidf("header JSON ends inside %s", what)
	}
	return invalidf("header JSON malformed in %s: %v", what, err)
}

func expectDelim(dec *json.Decoder, d json.Delim, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonErr(what, err)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return invalidf("%s: expected %q, got %v", what, rune(d), tok)
	}
	return nil
}

func stringToken(dec *json.Decoder, what string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", jsonErr(what, err)
	}
	s, ok := tok.(string)
	if !ok {
		return "", invalidf("%s: expected a string, got %v", what, tok)
	}
	return s, nil
}

func uintToken(dec *json.Decoder, what string) (uint64, error) {
	tok, err := dec.Token()
	if err != nil {
		return 0, jsonErr(what, err)
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

func parseMetadata(dec *json.Decoder) (map[string]string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonErr(MetadataKey, err)
	}
	if tok == nil { // "__metadata__": null
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalidf("%s must be an object of strings", MetadataKey)
	}
	md := make(map[string]string)
	for dec.More() {
		k, err := stringToken(dec, MetadataKey+" key")
		if err != nil {
			return nil, err
		}
		if _, dup := md[k]; dup {
			return nil, invalidf("duplicate %s key %q", MetadataKey, k)
		}
		v, err := stringToken(dec, MetadataKey+" value of "+k)
		if err != nil {
			return nil, err
		}
		md[k] = v
	}
	if err := expectDelim(dec, '}', MetadataKey); err != nil {
		return nil, err
	}
	return md, nil
}

func parseEntry(dec *json.Decoder, name string) (entry, error) {
	e := entry{name: name}
	what := "tensor " + quote(name)
	if err := expectDelim(dec, '{', what); err != nil {
		return e, err
	}
	var haveDtype, haveShape, haveOffsets bool
	for dec.More() {
		field, err := stringToken(dec, what+" field")
		if err != nil {
			return e, err
		}
		switch field {
		case "dtype":
			if haveDtype {
				return e, invalidf("%s: duplicate dtype", what)
			}
			haveDtype = true
			s, err := stringToken(dec, what+" dtype")
			if err != nil {
				return e, err
			}
			if e.dtype, err = tensor.ParseDType(s); err != nil {
				return e, invalidf("%s: unknown dtype %q", what, s)
			}
		case "shape":
			if haveShape {
				return e, invalidf("%s: duplicate shape", what)
			}
			haveShape = true
			if err := expectDelim(dec, '[', what+" shape"); err != nil {
				return e, err
			}
			e.shape = []int64{}
			for dec.More() {
				d, err := uintToken(dec, what+" shape")
				if err != nil {
					return e, err
				}
				e.shape = append(e.shape, int64(d))
			}
			if err := expectDelim(dec, ']', what+" shape"); err != nil {
				return e, err
			}
		case "data_offsets":
			if haveOffsets {
				return e, invalidf("%s: duplicate data_offsets", what)
			}
			haveOffsets = true
			if err := expectDelim(dec, '[', what+" data_offsets"); err != nil {
				return e, err
			}
			if e.begin, err = uintToken(dec, what+" data_offsets"); err != nil {
				return e, err
			}
			if e.end, err = uintToken(dec, what+" data_offsets"); err != nil {
				return e, err
			}
			if err := expectDelim(dec, ']', what+" data_offsets (exactly two numbers)"); err != nil {
				return e, err
			}
		default:
			return e, invalidf("%s: unknown field %q", what, field)
		}
	}
	if err := expectDelim(dec, '}', what); err != nil {
		return e, err
	}
	if !haveDtype || !haveShape || !haveOffsets {
		return e, invalidf("%s: needs dtype, shape and data_offsets", what)
	}
	return e, nil
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
