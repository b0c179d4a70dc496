package safetensors

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"unicode/utf8"
	"unsafe"
)

// parseCanonical is parseHeader's fast path. It parses only headers in the
// exact layout both writers (this package's Encode and the reference
// library) produce:
//
//	{"__metadata__":{"k":"v",...},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
//
// then nothing but spaces: no other whitespace, the three fields in that
// order, no escapes in any string. On anything else — another layout, or an
// invalid header — it returns ok=false, and parseGeneral parses the header
// or reports the error. So it must accept only headers parseGeneral accepts
// and return exactly what parseGeneral returns for them;
// FuzzHeaderParsers and TestCanonicalMatchesGeneral check both.
//
// It exists because the header is parsed on every pull: one pass with
// inline checks, no error bookkeeping, costs about a third of the general
// parser's time per byte.
func parseCanonical(raw []byte) (h header, ok bool) {
	n := len(raw)
	for n > 0 && raw[n-1] == ' ' {
		n--
	}
	if n < 2 || raw[0] != '{' || raw[n-1] != '}' {
		return header{}, false
	}
	b := raw[:n] // the object, from '{' to its closing '}'
	// Every entry opens a '{' and takes at least minEntryLen bytes, so this
	// bounds the number of entries (the second bound keeps a header of
	// '{'s inside names from reserving more than it could hold).
	maxEntries := min(bytes.Count(b, []byte{'{'})-1, n/minEntryLen)
	if maxEntries > 0 && bytes.HasPrefix(b, []byte(`{"`+MetadataKey+`":{`)) {
		maxEntries-- // where the writers put metadata
	}
	h.entries = make([]entry, 0, maxEntries)
	dims := make([]int64, 0, 2*maxEntries+2)
	// Names and metadata are copied into one arena; names are usually
	// well under a third of the header.
	arena := make([]byte, 0, n/3)
	// The name table lives on the stack unless the header is large.
	var small [32]nameSlot
	names := nameSet{slots: small[:]}
	if !names.fits(maxEntries) {
		names.slots = makeSlots(maxEntries)
	}
	high := false // whether some string has a byte ≥ 0x80
	if n == 2 {
		return h, true // "{}"
	}
	i := 1
	for i < n {
		// A member: a plain string key, ':', then an entry or metadata.
		if b[i] != '"' {
			return header{}, false
		}
		i++
		start := i
		i, high = plainEnd(b, i, high)
		if i+1 >= n || b[i] != '"' || b[i+1] != ':' {
			return header{}, false
		}
		key := b[start:i]
		i += 2
		if string(key) == MetadataKey {
			if h.sawMetadata {
				return header{}, false
			}
			h.sawMetadata = true
			if i, high, arena, ok = canonicalMetadata(b, i, high, arena, &h); !ok {
				return header{}, false
			}
		} else {
			if len(key) == 0 {
				return header{}, false
			}
			var name string
			name, arena = intern(arena, key)
			if names.add(name, h.entries) {
				return header{}, false
			}
			// Parse in place: entries hold pointers, and copying one in
			// costs write barriers while the GC runs.
			k := len(h.entries)
			if k < cap(h.entries) {
				h.entries = h.entries[:k+1]
			} else {
				h.entries = append(h.entries, entry{})
			}
			e := &h.entries[k]
			e.Name = name
			if i, dims, ok = canonicalEntry(b, i, dims, e); !ok {
				return header{}, false
			}
		}
		// After a member: ',' and the next one, or the closing '}'.
		switch {
		case i >= n:
			return header{}, false
		case i == n-1:
			i = n
		case b[i] == ',':
			i++
		default:
			return header{}, false
		}
	}
	if i != n || (high && !utf8.Valid(raw)) {
		return header{}, false
	}
	return h, true
}

// minEntryLen is the length of the shortest canonical member,
// "x":{"dtype":"U8","shape":[],"data_offsets":[0,0]}, plus its comma.
const minEntryLen = 51

// plainEnd returns the end of the string contents starting at b[i]: the
// first '"', '\\' or control byte, or len(b). It sets high if it skipped
// bytes ≥ 0x80, which the caller must then check as UTF-8.
func plainEnd(b []byte, i int, high bool) (int, bool) {
	for {
		i += plainLen(b[i:])
		if i == len(b) || b[i] < 0x80 {
			return i, high
		}
		high = true
		i++
	}
}

// canonicalEntry parses {"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}
// at b[i] into e, appending the shape to dims. It returns the position
// after the entry, or ok=false.
func canonicalEntry(b []byte, i int, dims []int64, e *entry) (int, []int64, bool) {
	const pDtype, pShape, pOffsets = `{"dtype":"`, `","shape":[`, `,"data_offsets":[`
	if len(b)-i < len(pDtype) || string(b[i:i+len(pDtype)]) != pDtype {
		return i, dims, false
	}
	i += len(pDtype)
	// The dtype name, packed as dtypeKey does, up to its closing quote
	// (found as in plainLen). A valid entry has more than 8 bytes left.
	if len(b)-i < 8 {
		return i, dims, false
	}
	w := binary.LittleEndian.Uint64(b[i:])
	q := w ^ ('"' * lsbs)
	j := bits.TrailingZeros64((q-lsbs)&^q&msbs) / 8
	if j == 0 || j > 7 {
		return i, dims, false
	}
	e.DType = dtypeByKey(w&(1<<(8*j)-1) | uint64(j)<<56)
	if !e.DType.Valid() {
		return i, dims, false
	}
	i += j
	if len(b)-i < len(pShape) || string(b[i:i+len(pShape)]) != pShape {
		return i, dims, false
	}
	i += len(pShape)
	start := len(dims)
	var ok bool
	if i, dims, ok = canonicalNums(b, i, dims); !ok {
		return i, dims, false
	}
	// Shapes share one growing slab; each is capped so that appending to
	// one can never write into another.
	e.Shape = dims[start:len(dims):len(dims)]
	// (Compared as 16 bytes and one: longer constants cost a call.)
	if len(b)-i < len(pOffsets) || string(b[i:i+16]) != pOffsets[:16] || b[i+16] != pOffsets[16] {
		return i, dims, false
	}
	i += len(pOffsets)
	// The offsets go through the slab too, and are taken back off it.
	k := len(dims)
	if i, dims, ok = canonicalNums(b, i, dims); !ok || len(dims)-k != 2 || i >= len(b) || b[i] != '}' {
		return i, dims, false
	}
	e.begin, e.end = uint64(dims[k]), uint64(dims[k+1])
	return i + 1, dims[:k], true
}

// canonicalNums parses the rest of an array of integers after its '[',
// "]" or "n,n,...,n]", appending the numbers to dst; it returns the
// position after the ']', or ok=false. Numbers are read as in fastUint,
// numbers of up to 7 digits with one eightDigits; as a ',' or ']' must
// follow each, no fraction or exponent can.
func canonicalNums(b []byte, i int, dst []int64) (int, []int64, bool) {
	if i < len(b) && b[i] == ']' {
		return i + 1, dst, true
	}
	for {
		var v uint64
		var m int
		if len(b)-i >= 8 {
			v, m = eightDigits(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 || (m > 1 && b[i] == '0') {
				return i, dst, false
			}
		}
		if m == 0 || m == 8 {
			if v, m = fastUint(b[i:]); m == 0 {
				return i, dst, false
			}
		}
		dst = append(dst, int64(v))
		if i += m; i >= len(b) {
			return i, dst, false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, dst, true
		default:
			return i, dst, false
		}
	}
}

// canonicalMetadata parses {"k":"v",...} (plain strings, unique keys) at
// b[i] into h.metadata, interning the strings, and returns the position
// after it, or ok=false.
func canonicalMetadata(b []byte, i int, high bool, arena []byte, h *header) (int, bool, []byte, bool) {
	if i >= len(b) || b[i] != '{' {
		return i, high, arena, false
	}
	i++
	h.metadata = make(map[string]string)
	if i < len(b) && b[i] == '}' {
		return i + 1, high, arena, true
	}
	for {
		var k, v []byte
		var ok bool
		if k, i, high, ok = plainString(b, i, high); !ok || i >= len(b) || b[i] != ':' {
			return i, high, arena, false
		}
		if v, i, high, ok = plainString(b, i+1, high); !ok || i >= len(b) {
			return i, high, arena, false
		}
		if _, dup := h.metadata[string(k)]; dup {
			return i, high, arena, false
		}
		var ks, vs string
		ks, arena = intern(arena, k)
		vs, arena = intern(arena, v)
		h.metadata[ks] = vs
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, high, arena, true
		default:
			return i, high, arena, false
		}
	}
}

// plainString parses a string without escapes at b[i], returning its
// contents (aliasing b) and the position after it.
func plainString(b []byte, i int, high bool) ([]byte, int, bool, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, high, false
	}
	start := i + 1
	i, high = plainEnd(b, start, high)
	if i >= len(b) || b[i] != '"' {
		return nil, i, high, false
	}
	return b[start:i], i + 1, high, true
}

// intern appends s to arena and returns it as a string that aliases the
// arena. This is sound because bytes of an arena are written only once:
// append writes past len(arena), and when it grows it copies into a new
// array and leaves the old one, still referenced by earlier strings, as it
// was. So names and metadata of a header cost one allocation (usually),
// not one each, and do not alias the caller's buffer.
func intern(arena, s []byte) (string, []byte) {
	if len(s) == 0 {
		return "", arena
	}
	k := len(arena)
	arena = append(arena, s...)
	return unsafe.String(&arena[k], len(s)), arena
}

// nameSet finds duplicate tensor names. It is an open-addressing table of
// name hashes pointing into the entries; names are compared only when
// their hashes match, so checking n names costs n hashes and about n word
// compares instead of n²/2 string compares. The hash is maphash's, seeded
// per process, so crafted names cannot make them collide.
type nameSet struct {
	slots []nameSlot // a power of two long, at most 3/4 full
	n     int
}

type nameSlot struct {
	tag uint32 // the hash's high half (its low bits pick the slot)
	idx int32  // index+1 in the entries; 0 marks an empty slot
}

var nameSeed = maphash.MakeSeed()

// fits reports whether the table can hold n names, at most 3/4 full.
func (s *nameSet) fits(n int) bool { return 4*n <= 3*len(s.slots) }

// makeSlots returns a table for n names (a power of two long, at least
// 16, at most 3/4 full).
func makeSlots(n int) []nameSlot {
	size := 16
	for 4*n > 3*size {
		size *= 2
	}
	return make([]nameSlot, size)
}

// add reports whether name is already among entries[:len(entries)]'s names,
// and otherwise records it as the name of entries[len(entries)], the entry
// about to be appended.
func (s *nameSet) add(name string, entries []entry) (dup bool) {
	if !s.fits(s.n + 1) {
		s.grow(entries)
	}
	h := maphash.String(nameSeed, name)
	mask := len(s.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.idx == 0 {
			*sl = nameSlot{tag: uint32(h >> 32), idx: int32(len(entries) + 1)}
			s.n++
			return false
		}
		if sl.tag == uint32(h>>32) && entries[sl.idx-1].Name == name {
			return true
		}
	}
}

// grow doubles the table, rehashing the names of entries it holds.
func (s *nameSet) grow(entries []entry) {
	old := s.slots
	s.slots = makeSlots(len(old))
	mask := len(s.slots) - 1
	for _, sl := range old {
		if sl.idx == 0 {
			continue
		}
		h := maphash.String(nameSeed, entries[sl.idx-1].Name)
		i := int(h) & mask
		for s.slots[i].idx != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = nameSlot{tag: uint32(h >> 32), idx: sl.idx}
	}
}
