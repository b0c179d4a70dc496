package safetensors

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/tensor"
)

// The header parser is written by hand for the one JSON shape safetensors
// uses, because the header is on the hot path of every pull: encoding/json's
// token stream costs about a microsecond per token, which made decoding a
// 1 MiB blob slower than copying it. The grammar accepted is strict JSON
// (RFC 8259) restricted to
//
//	header   = ws "{" [ member *( ws "," member ) ] ws "}" ws
//	member   = ws string ws ":" ws ( metadata | entry )
//	metadata = "null" | "{" [ string ":" string *( "," string ":" string ) ] "}"
//	entry    = "{" three fields "dtype": string, "shape": [uint...],
//	           "data_offsets": [uint, uint], each exactly once, any order "}"
//	uint     = "0" | [1-9][0-9]*, at most 2^63-1
//
// with whitespace allowed between all tokens, unique keys at every level,
// valid UTF-8, and no lone UTF-16 surrogate escapes (the Rust reference
// rejects those too). header_ref_test.go keeps an encoding/json-based parser
// as the reference that fuzzing compares this one against.

type scanner struct {
	b   []byte
	pos int
}

func (s *scanner) errorf(format string, args ...any) error {
	return invalidf("header JSON at byte %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.pos < len(s.b) {
		return s.b[s.pos]
	}
	return 0
}

// expect skips whitespace and consumes c.
func (s *scanner) expect(c byte, what string) error {
	if got := s.peek(); got != c {
		if got == 0 {
			return s.errorf("header ends inside %s, expected %q", what, c)
		}
		return s.errorf("%s: expected %q, got %q", what, c, got)
	}
	s.pos++
	return nil
}

// str skips whitespace and parses a JSON string.
func (s *scanner) str(what string) (string, error) {
	if err := s.expect('"', what); err != nil {
		return "", err
	}
	start := s.pos
	// Fast path: no escapes. The whole header is already known to be valid
	// UTF-8, so only quotes, backslashes and control bytes matter here.
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		switch {
		case c == '"':
			v := string(s.b[start:s.pos])
			s.pos++
			return v, nil
		case c == '\\':
			return s.strSlow(start, what)
		case c < 0x20:
			return "", s.errorf("%s: control character %#02x in a string", what, c)
		}
		s.pos++
	}
	return "", s.errorf("header ends inside %s", what)
}

// strSlow finishes a string that contains escapes, starting over at start.
func (s *scanner) strSlow(start int, what string) (string, error) {
	out := make([]byte, 0, s.pos-start+16)
	out = append(out, s.b[start:s.pos]...)
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		switch {
		case c == '"':
			s.pos++
			return string(out), nil
		case c < 0x20:
			return "", s.errorf("%s: control character %#02x in a string", what, c)
		case c != '\\':
			out = append(out, c)
			s.pos++
			continue
		}
		if s.pos+1 >= len(s.b) {
			break
		}
		e := s.b[s.pos+1]
		s.pos += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return "", s.errorf("%s: bad \\u escape", what)
			}
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by an escaped low one is a
				// character.
				if r >= 0xdc00 || s.pos+1 >= len(s.b) || s.b[s.pos] != '\\' || s.b[s.pos+1] != 'u' {
					return "", s.errorf("%s: lone UTF-16 surrogate \\u%04x", what, r)
				}
				s.pos += 2
				lo, ok := s.hex4()
				if !ok {
					return "", s.errorf("%s: bad \\u escape", what)
				}
				if lo < 0xdc00 || lo > 0xdfff {
					return "", s.errorf("%s: lone UTF-16 surrogate \\u%04x", what, r)
				}
				r = utf16.DecodeRune(r, lo)
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", s.errorf("%s: bad escape \\%c", what, e)
		}
	}
	return "", s.errorf("header ends inside %s", what)
}

func (s *scanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.pos : s.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	s.pos += 4
	return r, true
}

// uint skips whitespace and parses a non-negative integer ≤ 2^63-1 in
// JSON's syntax (no sign, no leading zeros, no fraction or exponent).
func (s *scanner) uint(what string) (uint64, error) {
	s.ws()
	start := s.pos
	for s.pos < len(s.b) && s.b[s.pos] >= '0' && s.b[s.pos] <= '9' {
		s.pos++
	}
	digits := s.b[start:s.pos]
	if len(digits) == 0 {
		return 0, s.errorf("%s: expected a non-negative integer", what)
	}
	if s.pos < len(s.b) {
		switch s.b[s.pos] {
		case '.', 'e', 'E':
			return 0, s.errorf("%s: %s... is not an integer", what, digits)
		}
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, s.errorf("%s: leading zero in %s", what, digits)
	}
	v, ok := parseUint(string(digits))
	if !ok {
		return 0, s.errorf("%s: %s is not a non-negative 63-bit integer", what, digits)
	}
	return v, nil
}

// more reports whether another element follows in an object or array: it
// consumes a ',' (true) or sees the closing delimiter (false, not consumed).
// first is true before the first element.
func (s *scanner) more(first bool, closing byte, what string) (bool, error) {
	c := s.peek()
	if c == closing {
		return false, nil
	}
	if first {
		return true, nil
	}
	if c != ',' {
		if c == 0 {
			return false, s.errorf("header ends inside %s", what)
		}
		return false, s.errorf("%s: expected ',' or %q, got %q", what, closing, c)
	}
	s.pos++
	return true, nil
}

// parseHeader parses and checks the JSON header. Tensor names must be
// unique and non-empty; offsets and shapes are checked by the caller.
func parseHeader(raw []byte) (*header, error) {
	if !utf8.Valid(raw) {
		return nil, invalidf("header is not valid UTF-8")
	}
	s := &scanner{b: raw}
	if err := s.expect('{', "header"); err != nil {
		return nil, err
	}
	h := &header{}
	var seen map[string]struct{}
	for first := true; ; first = false {
		ok, err := s.more(first, '}', "header")
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		key, err := s.str("header key")
		if err != nil {
			return nil, err
		}
		if seen == nil {
			seen = make(map[string]struct{}, 16)
		}
		if _, dup := seen[key]; dup {
			return nil, invalidf("duplicate key %q in header", key)
		}
		seen[key] = struct{}{}
		if err := s.expect(':', "header after key "+strconv.Quote(key)); err != nil {
			return nil, err
		}
		if key == MetadataKey {
			if h.metadata, err = s.metadata(); err != nil {
				return nil, err
			}
			continue
		}
		if key == "" {
			return nil, invalidf("empty tensor name")
		}
		e, err := s.entry(key)
		if err != nil {
			return nil, err
		}
		h.entries = append(h.entries, e)
	}
	s.pos++ // the closing '}'
	if s.ws(); s.pos != len(raw) {
		return nil, s.errorf("unexpected bytes after the header object")
	}
	return h, nil
}

func (s *scanner) metadata() (map[string]string, error) {
	if s.peek() == 'n' {
		if s.pos+4 <= len(s.b) && string(s.b[s.pos:s.pos+4]) == "null" {
			s.pos += 4
			return nil, nil
		}
		return nil, s.errorf("%s must be an object of strings", MetadataKey)
	}
	if s.peek() != '{' {
		return nil, s.errorf("%s must be an object of strings", MetadataKey)
	}
	s.pos++
	md := make(map[string]string)
	for first := true; ; first = false {
		ok, err := s.more(first, '}', MetadataKey)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		k, err := s.str(MetadataKey + " key")
		if err != nil {
			return nil, err
		}
		if _, dup := md[k]; dup {
			return nil, invalidf("duplicate %s key %q", MetadataKey, k)
		}
		if err := s.expect(':', MetadataKey); err != nil {
			return nil, err
		}
		v, err := s.str(MetadataKey + " value of " + strconv.Quote(k))
		if err != nil {
			return nil, err
		}
		md[k] = v
	}
	s.pos++
	return md, nil
}

func (s *scanner) entry(name string) (entry, error) {
	e := entry{name: name}
	what := "tensor " + strconv.Quote(name)
	if err := s.expect('{', what); err != nil {
		return e, err
	}
	var haveDtype, haveShape, haveOffsets bool
	for first := true; ; first = false {
		ok, err := s.more(first, '}', what)
		if err != nil {
			return e, err
		}
		if !ok {
			break
		}
		field, err := s.str(what + " field")
		if err != nil {
			return e, err
		}
		if err := s.expect(':', what+" field "+strconv.Quote(field)); err != nil {
			return e, err
		}
		switch field {
		case "dtype":
			if haveDtype {
				return e, invalidf("%s: duplicate dtype", what)
			}
			haveDtype = true
			d, err := s.str(what + " dtype")
			if err != nil {
				return e, err
			}
			if e.dtype, err = tensor.ParseDType(d); err != nil {
				return e, invalidf("%s: unknown dtype %q", what, d)
			}
		case "shape":
			if haveShape {
				return e, invalidf("%s: duplicate shape", what)
			}
			haveShape = true
			if err := s.expect('[', what+" shape"); err != nil {
				return e, err
			}
			e.shape = make([]int64, 0, 4)
			for first := true; ; first = false {
				ok, err := s.more(first, ']', what+" shape")
				if err != nil {
					return e, err
				}
				if !ok {
					break
				}
				d, err := s.uint(what + " shape")
				if err != nil {
					return e, err
				}
				e.shape = append(e.shape, int64(d))
			}
			s.pos++
		case "data_offsets":
			if haveOffsets {
				return e, invalidf("%s: duplicate data_offsets", what)
			}
			haveOffsets = true
			if err := s.expect('[', what+" data_offsets"); err != nil {
				return e, err
			}
			if e.begin, err = s.uint(what + " data_offsets"); err != nil {
				return e, err
			}
			if err := s.expect(',', what+" data_offsets (exactly two numbers)"); err != nil {
				return e, err
			}
			if e.end, err = s.uint(what + " data_offsets"); err != nil {
				return e, err
			}
			if err := s.expect(']', what+" data_offsets (exactly two numbers)"); err != nil {
				return e, err
			}
		default:
			return e, invalidf("%s: unknown field %q", what, field)
		}
	}
	s.pos++
	if !haveDtype || !haveShape || !haveOffsets {
		return e, invalidf("%s: needs dtype, shape and data_offsets", what)
	}
	return e, nil
}
