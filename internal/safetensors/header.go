package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/errs"
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
//
// There are two parsers: parseCanonical (header_fast.go) takes only the
// compact layout the writers produce, in one pass and without error
// bookkeeping; parseGeneral (here) takes the whole grammar and words the
// errors. parseHeader tries the first and falls back to the second, so
// every header is accepted or rejected exactly as parseGeneral would.

type scanner struct {
	b    []byte
	text string // one immutable copy of b that unescaped names slice
	pos  int
	dims []int64 // backing store of every entry's shape

	start   int  // where the last rawStr's contents began in b
	escaped bool // whether the last rawStr had escapes (result not in b)
}

// where names the part of the header being parsed, for error messages. It
// is passed by value and only formatted on error, so parsing a valid header
// builds no message strings.
type where struct {
	tensor string // "" at the header level
	part   string
}

func (w where) String() string {
	if w.tensor == "" {
		return w.part
	}
	return "tensor " + strconv.Quote(w.tensor) + " " + w.part
}

func (s *scanner) errorf(w where, format string, args ...any) error {
	return invalidf("header JSON at byte %d: %v: %s", s.pos, w, fmt.Sprintf(format, args...))
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
func (s *scanner) expect(c byte, w where) error {
	if got := s.peek(); got != c {
		if got == 0 {
			return s.errorf(w, "header ends, expected %q", c)
		}
		return s.errorf(w, "expected %q, got %q", c, got)
	}
	s.pos++
	return nil
}

// str skips whitespace and parses a JSON string. Without escapes the result
// is a substring of s.text, so names cost no allocation of their own.
func (s *scanner) str(w where) (string, error) {
	b, err := s.rawStr(w)
	if err != nil {
		return "", err
	}
	if !s.escaped {
		return s.text[s.start : s.start+len(b)], nil
	}
	return string(b), nil
}

// rawStr skips whitespace and parses a JSON string, returning its decoded
// bytes. Without escapes (the usual case) they alias the header, so callers
// that only compare them allocate nothing.
func (s *scanner) rawStr(w where) ([]byte, error) {
	if err := s.expect('"', w); err != nil {
		return nil, err
	}
	start := s.pos
	s.start, s.escaped = start, false
	// Fast path: no escapes. The whole header is already known to be valid
	// UTF-8, so only quotes, backslashes and control bytes matter here.
	s.pos, _ = plainEnd(s.b, start, false)
	if s.pos == len(s.b) {
		return nil, s.errorf(w, "header ends inside a string")
	}
	switch c := s.b[s.pos]; c {
	case '"':
		v := s.b[start:s.pos:s.pos]
		s.pos++
		return v, nil
	case '\\':
		return s.strSlow(start, w)
	default:
		return nil, s.errorf(w, "control character %#02x in a string", c)
	}
}

// SWAR constants: a 1 and a high bit in every byte of a word.
const (
	lsbs = 0x0101010101010101
	msbs = 0x8080808080808080
)

// plainLen returns how many leading bytes of b are printable ASCII other
// than '"' and '\\', which stand for themselves in a JSON string: it stops
// at the first '"', '\\', control byte (< 0x20) or byte ≥ 0x80 (which the
// caller checks as UTF-8), or returns len(b). It tests 8 bytes at a time:
// (x - lsbs) &^ x & msbs flags the zero bytes of x, (w - 0x20*lsbs) &^ w &
// msbs the bytes of w below 0x20, and w & msbs those ≥ 0x80; a borrow can
// only flag extra bytes above a true one, so the lowest flagged byte is
// exact.
func plainLen(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q := w ^ ('"' * lsbs)
		e := w ^ ('\\' * lsbs)
		m := ((q - lsbs) &^ q) | ((e - lsbs) &^ e) | ((w - 0x20*lsbs) &^ w) | w
		if m &= msbs; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			return i
		}
	}
	return i
}

// strSlow finishes a string that contains escapes, starting over at start.
func (s *scanner) strSlow(start int, w where) ([]byte, error) {
	s.escaped = true
	out := make([]byte, 0, s.pos-start+16)
	out = append(out, s.b[start:s.pos]...)
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		switch {
		case c == '"':
			s.pos++
			return out, nil
		case c < 0x20:
			return nil, s.errorf(w, "control character %#02x in a string", c)
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
				return nil, s.errorf(w, "bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by an escaped low one is a
				// character.
				if r >= 0xdc00 || s.pos+1 >= len(s.b) || s.b[s.pos] != '\\' || s.b[s.pos+1] != 'u' {
					return nil, s.errorf(w, "lone UTF-16 surrogate \\u%04x", r)
				}
				s.pos += 2
				lo, ok := s.hex4()
				if !ok {
					return nil, s.errorf(w, "bad \\u escape")
				}
				if lo < 0xdc00 || lo > 0xdfff {
					return nil, s.errorf(w, "lone UTF-16 surrogate \\u%04x", r)
				}
				r = utf16.DecodeRune(r, lo)
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, s.errorf(w, "bad escape \\%c", e)
		}
	}
	return nil, s.errorf(w, "header ends inside a string")
}

// dtypeOf looks up a dtype name without allocating.
func dtypeOf(name []byte) (tensor.DType, bool) {
	k, ok := dtypeKey(name)
	if !ok {
		return tensor.Invalid, false
	}
	d := dtypeByKey(k)
	return d, d.Valid()
}

// dtypeByKey returns the dtype whose name has dtypeKey k, or Invalid. Names
// of up to 7 bytes are packed with their length into one word, so a lookup
// is a few word compares; dtypeKeys is built from tensor's own names and so
// cannot drift from them.
func dtypeByKey(k uint64) tensor.DType {
	for d := tensor.DType(1); d.Valid(); d++ {
		if dtypeKeys[d] == k {
			return d
		}
	}
	return tensor.Invalid
}

// dtypeKey packs a name of 1 to 7 bytes and its length into a word.
func dtypeKey(name []byte) (uint64, bool) {
	if len(name) == 0 || len(name) > 7 {
		return 0, false
	}
	k := uint64(len(name)) << 56
	for i, c := range name {
		k |= uint64(c) << (8 * i)
	}
	return k, true
}

// dtypeKeys[d] is dtypeKey(d.String()) for every valid d.
var dtypeKeys = func() (keys [256]uint64) {
	for d := tensor.DType(1); d.Valid(); d++ {
		k, ok := dtypeKey([]byte(d.String()))
		if !ok {
			panic("safetensors: dtype name " + d.String() + " is longer than 7 bytes")
		}
		keys[d] = k
	}
	return keys
}()

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
func (s *scanner) uint(w where) (uint64, error) {
	s.ws()
	start := s.pos
	for s.pos < len(s.b) && s.b[s.pos] >= '0' && s.b[s.pos] <= '9' {
		s.pos++
	}
	digits := s.b[start:s.pos]
	if len(digits) == 0 {
		return 0, s.errorf(w, "expected a non-negative integer")
	}
	if s.pos < len(s.b) {
		switch s.b[s.pos] {
		case '.', 'e', 'E':
			return 0, s.errorf(w, "%s... is not an integer", digits)
		}
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, s.errorf(w, "leading zero in %s", digits)
	}
	var v uint64
	for _, c := range digits {
		d := uint64(c - '0')
		if v > (math.MaxInt64-d)/10 { // v*10+d would pass 2^63-1
			return 0, s.errorf(w, "%s is not a non-negative 63-bit integer", digits)
		}
		v = v*10 + d
	}
	return v, nil
}

// more reports whether another element follows in an object or array: it
// consumes a ',' (true) or sees the closing delimiter (false, not consumed).
// first is true before the first element.
func (s *scanner) more(first bool, closing byte, w where) (bool, error) {
	c := s.peek()
	if c == closing {
		return false, nil
	}
	if first {
		return true, nil
	}
	if c != ',' {
		if c == 0 {
			return false, s.errorf(w, "header ends, expected ',' or %q", closing)
		}
		return false, s.errorf(w, "expected ',' or %q, got %q", closing, c)
	}
	s.pos++
	return true, nil
}

// parseHeader parses and checks the JSON header. Tensor names must be
// unique and non-empty; offsets and shapes are checked by the caller.
// Headers in the writers' own layout take the fast path (parseCanonical);
// anything else, including every invalid header, goes through the general
// parser, which also words the error.
func parseHeader(raw []byte) (header, error) {
	if h, ok := parseCanonical(raw); ok {
		return h, nil
	}
	h, err := parseGeneral(raw)
	if err != nil {
		return header{}, err
	}
	return *h, nil
}

// parseGeneral parses any header the grammar above allows.
func parseGeneral(raw []byte) (*header, error) {
	if !utf8.Valid(raw) {
		return nil, invalidf("header is not valid UTF-8")
	}
	s := &scanner{b: raw, text: string(raw), dims: make([]int64, 0, 64)}
	top := where{part: "header"}
	if err := s.expect('{', top); err != nil {
		return nil, err
	}
	h := &header{entries: make([]entry, 0, 16)}
	var names nameSet
	for first := true; ; first = false {
		ok, err := s.more(first, '}', top)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		key, err := s.str(where{part: "header key"})
		if err != nil {
			return nil, err
		}
		if h.seen(key, &names) {
			return nil, invalidf("duplicate key %s in header", errs.Quote(key))
		}
		if err := s.expect(':', where{tensor: key, part: "after the name"}); err != nil {
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
		s.ws()
		e, err := s.entry(key)
		if err != nil {
			return nil, err
		}
		h.entries = append(h.entries, e)
	}
	s.pos++ // the closing '}'
	if s.ws(); s.pos != len(raw) {
		return nil, s.errorf(top, "unexpected bytes after the header object")
	}
	return h, nil
}

func (s *scanner) metadata() (map[string]string, error) {
	w := where{part: MetadataKey}
	if s.peek() == 'n' {
		if s.pos+4 <= len(s.b) && string(s.b[s.pos:s.pos+4]) == "null" {
			s.pos += 4
			return nil, nil
		}
		return nil, s.errorf(w, "must be an object of strings")
	}
	if s.peek() != '{' {
		return nil, s.errorf(w, "must be an object of strings")
	}
	s.pos++
	md := make(map[string]string)
	for first := true; ; first = false {
		ok, err := s.more(first, '}', w)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		k, err := s.str(where{part: MetadataKey + " key"})
		if err != nil {
			return nil, err
		}
		if _, dup := md[k]; dup {
			return nil, invalidf("duplicate %s key %s", MetadataKey, errs.Quote(k))
		}
		if err := s.expect(':', w); err != nil {
			return nil, err
		}
		v, err := s.str(where{part: MetadataKey + " value"})
		if err != nil {
			return nil, err
		}
		md[k] = v
	}
	s.pos++
	return md, nil
}

func (s *scanner) entry(name string) (entry, error) {
	e := entry{Tensor: tensor.Tensor{Name: name}}
	w := func(part string) where { return where{tensor: name, part: part} }
	if err := s.expect('{', w("entry")); err != nil {
		return e, err
	}
	var haveDtype, haveShape, haveOffsets bool
	for first := true; ; first = false {
		ok, err := s.more(first, '}', w("entry"))
		if err != nil {
			return e, err
		}
		if !ok {
			break
		}
		field, err := s.rawStr(w("field name"))
		if err != nil {
			return e, err
		}
		if err := s.expect(':', w("after a field name")); err != nil {
			return e, err
		}
		switch string(field) {
		case "dtype":
			if haveDtype {
				return e, invalidf("%v: duplicate dtype", w("entry"))
			}
			haveDtype = true
			d, err := s.rawStr(w("dtype"))
			if err != nil {
				return e, err
			}
			if e.DType, ok = dtypeOf(d); !ok {
				return e, invalidf("%v: unknown dtype %s", w("entry"), errs.Quote(string(d)))
			}
		case "shape":
			if haveShape {
				return e, invalidf("%v: duplicate shape", w("entry"))
			}
			haveShape = true
			if err := s.expect('[', w("shape")); err != nil {
				return e, err
			}
			// Shapes share one growing slab; each is capped so that
			// appending to one can never write into another.
			start := len(s.dims)
			for first := true; ; first = false {
				ok, err := s.more(first, ']', w("shape"))
				if err != nil {
					return e, err
				}
				if !ok {
					break
				}
				d, err := s.uint(w("shape"))
				if err != nil {
					return e, err
				}
				s.dims = append(s.dims, int64(d))
			}
			e.Shape = s.dims[start:len(s.dims):len(s.dims)]
			s.pos++
		case "data_offsets":
			if haveOffsets {
				return e, invalidf("%v: duplicate data_offsets", w("entry"))
			}
			haveOffsets = true
			if err := s.expect('[', w("data_offsets")); err != nil {
				return e, err
			}
			if e.begin, err = s.uint(w("data_offsets")); err != nil {
				return e, err
			}
			if err := s.expect(',', w("data_offsets (exactly two numbers)")); err != nil {
				return e, err
			}
			if e.end, err = s.uint(w("data_offsets")); err != nil {
				return e, err
			}
			if err := s.expect(']', w("data_offsets (exactly two numbers)")); err != nil {
				return e, err
			}
		default:
			return e, invalidf("%v: unknown field %s", w("entry"), errs.Quote(string(field)))
		}
	}
	s.pos++
	if !haveDtype || !haveShape || !haveOffsets {
		return e, invalidf("%v: needs dtype, shape and data_offsets", w("entry"))
	}
	return e, nil
}

// fastUint parses a JSON non-negative integer ≤ 2^63-1 at the start of b
// and returns it with its length, or n=0 if there is none or it is not
// valid (leading zero, fraction, exponent, overflow).
func fastUint(b []byte) (v uint64, n int) {
	if len(b) >= 8 {
		// Up to 8 digits at once (see eightDigits), then one at a time.
		v, n = eightDigits(binary.LittleEndian.Uint64(b))
		if n < 8 {
			goto check
		}
	}
	for n < len(b) {
		d := b[n] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d) // cannot wrap before the 20th digit
		n++
	}
check:
	if n == 0 || (n > 1 && b[0] == '0') {
		return 0, 0
	}
	// Without leading zeros, 20 or more digits are ≥ 10^19 > 2^63-1, and
	// 19 digits are < 10^19 < 2^64, so v is exact there.
	if n > 19 || v > math.MaxInt64 {
		return 0, 0
	}
	if n < len(b) && (b[n] == '.' || b[n] == 'e' || b[n] == 'E') {
		return 0, 0
	}
	return v, n
}

// eightDigits returns the value and count of the ASCII decimal digits that
// begin w, 8 bytes of text loaded little-endian (first byte lowest).
//
// A byte x is a digit iff its high nibble is 3 and so is that of x+6. The
// additions may carry into the next byte only from a byte ≥ 0xfa, which is
// not a digit, so the lowest flagged byte is exact. Shifting the digits to
// the top of the word puts zeros (leading zero digits) below them, and three
// multiply-shift steps then combine pairs of digits, pairs of pairs and
// pairs of those (the classic SWAR conversion, e.g. simdjson's).
func eightDigits(w uint64) (v uint64, n int) {
	const nibbles, threes, sixes = 0xf0f0f0f0f0f0f0f0, 0x3030303030303030, 0x0606060606060606
	bad := ((w & nibbles) ^ threes) | (((w + sixes) & nibbles) ^ threes)
	n = bits.TrailingZeros64(bad) / 8
	if n == 0 {
		return 0, 0
	}
	w = (w & 0x0f0f0f0f0f0f0f0f) << (64 - 8*n)
	w = (w * (10<<8 + 1)) >> 8
	w = ((w & 0x00ff00ff00ff00ff) * (100<<16 + 1)) >> 16
	w = ((w & 0x0000ffff0000ffff) * (10000<<32 + 1)) >> 32
	return w, n
}

// seen reports whether key was already in the header, recording it.
func (h *header) seen(key string, names *nameSet) bool {
	if key == MetadataKey {
		if h.sawMetadata {
			return true
		}
		h.sawMetadata = true
		return false
	}
	return names.add(key, h.entries)
}
