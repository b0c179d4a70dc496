package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/tensor"
)

// sameHeader returns an error naming the first difference between two
// parsed headers (entries and metadata; sawMetadata is bookkeeping).
func sameHeader(got, want header) error {
	if len(got.entries) != len(want.entries) || (len(got.entries) > 0 && !reflect.DeepEqual(got.entries, want.entries)) {
		return fmt.Errorf("entries differ:\n got %+v\nwant %+v", got.entries, want.entries)
	}
	if (got.metadata == nil) != (want.metadata == nil) || len(got.metadata) != len(want.metadata) {
		return fmt.Errorf("metadata differ: %q vs %q", got.metadata, want.metadata)
	}
	for k, v := range want.metadata {
		if g, ok := got.metadata[k]; !ok || g != v {
			return fmt.Errorf("metadata differ: %q vs %q", got.metadata, want.metadata)
		}
	}
	return nil
}

// checkCanonical compares the fast path with the general parser on raw: if
// the fast path accepts, the general parser must accept too and agree.
// It returns whether the fast path accepted.
func checkCanonical(t testing.TB, raw []byte) bool {
	t.Helper()
	fast, ok := parseCanonical(raw)
	if !ok {
		return false
	}
	gen, err := parseGeneral(raw)
	if err != nil {
		t.Fatalf("fast path accepted what the general parser rejects (%v): %q", err, raw)
	}
	if err := sameHeader(fast, *gen); err != nil {
		t.Fatalf("%v\nheader %q", err, raw)
	}
	return true
}

func TestPlainLen(t *testing.T) {
	naive := func(b []byte) int {
		for i, c := range b {
			if c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
				return i
			}
		}
		return len(b)
	}
	alphabet := []byte("ab.0_\"\\\x00\x1f\x20\x7f\x80\xc3\xffz")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			if rng.IntN(6) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = byte('a' + rng.IntN(26))
			}
		}
		if got, want := plainLen(b), naive(b); got != want {
			t.Fatalf("plainLen(%q) = %d, want %d", b, got, want)
		}
	}
	// Every byte value at every position of a word, and after it.
	for c := range 256 {
		for pos := range 10 {
			b := bytes.Repeat([]byte("x"), 12)
			b[pos] = byte(c)
			if got, want := plainLen(b), naive(b); got != want {
				t.Fatalf("plainLen(%q) = %d, want %d", b, got, want)
			}
		}
	}
}

func TestFastUint(t *testing.T) {
	// ref parses the integer at the start of b the slow way.
	ref := func(b []byte) (uint64, int) {
		n := 0
		for n < len(b) && b[n] >= '0' && b[n] <= '9' {
			n++
		}
		if n == 0 || (n > 1 && b[0] == '0') {
			return 0, 0
		}
		if n < len(b) && (b[n] == '.' || b[n] == 'e' || b[n] == 'E') {
			return 0, 0
		}
		v, err := strconv.ParseUint(string(b[:n]), 10, 64)
		if err != nil || v > math.MaxInt64 {
			return 0, 0
		}
		return v, n
	}
	check := func(b []byte) {
		t.Helper()
		gv, gn := fastUint(b)
		wv, wn := ref(b)
		if gv != wv || gn != wn {
			t.Fatalf("fastUint(%q) = %d, %d; want %d, %d", b, gv, gn, wv, wn)
		}
	}
	for _, s := range []string{
		"", "0", "00", "01", "7", "12345678", "123456789", "99999999,", "100000000]",
		"9223372036854775807", "9223372036854775808", "9223372036854775807]",
		"18446744073709551615", "18446744073709551616", "99999999999999999999",
		"123456789012345678901234567890", "1.5", "1e3", "1E3", "12345678.0",
		"-1", "+1", "1-", "0]", "0,1", "/", ":", "5/", "5:", "\xff", "1\xff",
		"12345678e", "1234567x", "00000000", "000000001",
	} {
		check([]byte(s))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	tail := []byte("],.eE-/:0\x00 \xff")
	for range 100000 {
		nd := rng.IntN(22)
		b := make([]byte, 0, nd+4)
		for i := range nd {
			d := byte('0' + rng.IntN(10))
			if i == 0 && rng.IntN(4) != 0 {
				d = byte('1' + rng.IntN(9))
			}
			b = append(b, d)
		}
		for range rng.IntN(10) {
			b = append(b, tail[rng.IntN(len(tail))])
		}
		check(b)
	}
}

func TestEightDigitsAllLengths(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, v := range []uint64{0, 1, 9, 10, 99, 12345678, 87654321, 99999999, 10000000} {
			s := strconv.FormatUint(v, 10)
			if len(s) > n {
				continue
			}
			s = strings.Repeat("0", n-len(s)) + s + strings.Repeat(",", 8-n)
			gv, gn := eightDigits(binary.LittleEndian.Uint64([]byte(s)))
			if gv != v || gn != n {
				t.Errorf("eightDigits(%q) = %d, %d; want %d, %d", s, gv, gn, v, n)
			}
		}
	}
}

// randomDict builds a state dict with random names, dtypes and shapes.
func randomDict(rng *rand.Rand, n int) *tensor.StateDict {
	sd := &tensor.StateDict{}
	parts := []string{"layers", "0", "17", "weight", "bias", "é", "😀", "a-b", "x y", "~", "\x7f"}
	for sd.Len() < n {
		var name strings.Builder
		for j := range 1 + rng.IntN(4) {
			if j > 0 {
				name.WriteByte('.')
			}
			name.WriteString(parts[rng.IntN(len(parts))])
		}
		if sd.Get(name.String()) != nil {
			continue
		}
		dt := tensor.DType(1 + rng.IntN(int(tensor.U64)))
		shape := make([]int64, rng.IntN(5))
		for i := range shape {
			shape[i] = int64(rng.IntN(4))
		}
		bl, _ := tensor.ByteLen(dt, shape)
		if err := sd.Add(&tensor.Tensor{Name: name.String(), DType: dt, Shape: shape, Data: make([]byte, bl)}); err != nil {
			panic(err)
		}
	}
	return sd
}

func headerOf(blob []byte) []byte {
	n := binary.LittleEndian.Uint64(blob)
	return blob[8 : 8+n]
}

// TestCanonicalMatchesGeneral checks the fast path against the general
// parser: it must take every header the writers produce (or decoding would
// silently be slow), and on those and on mutations of them it must accept
// only what the general parser accepts, with the same result.
func TestCanonicalMatchesGeneral(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	// Regressions: inputs on which the fast path once disagreed.
	for _, raw := range []string{
		`{}"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`,
		`{}}`, `{} `, `{}`,
	} {
		checkCanonical(t, []byte(raw))
	}
	vectors := loadVectors(t)
	var headers [][]byte
	for _, name := range slices.Sorted(maps.Keys(vectors)) {
		b := vectors[name]
		raw := headerOf(b)
		if !bytes.Contains(raw, []byte(`\`)) && !checkCanonical(t, raw) {
			t.Errorf("vector %s: fast path rejected the reference writer's header %q", name, raw)
		}
		headers = append(headers, raw)
	}
	mds := []map[string]string{nil, {}, {"format": "pt"}, {"a": "", "": "b", "é": "😀", "k": "v w"}}
	for i := range 300 {
		md := mds[i%len(mds)]
		blob, err := Encode(randomDict(rng, rng.IntN(40)), md)
		if err != nil {
			t.Fatal(err)
		}
		raw := headerOf(blob)
		if !checkCanonical(t, raw) {
			t.Fatalf("fast path rejected Encode's header %q", raw)
		}
		headers = append(headers, raw)
	}
	// Mutations: the fast path may reject them, but whatever it accepts
	// the general parser must accept identically.
	junk := []byte(`{}[]",:\ 0129-.eE` + "\t\n\x00\x80\xff")
	for range 50000 {
		raw := bytes.Clone(headers[rng.IntN(len(headers))])
		for range 1 + rng.IntN(3) {
			if len(raw) == 0 {
				break
			}
			i := rng.IntN(len(raw))
			switch rng.IntN(4) {
			case 0:
				raw[i] = junk[rng.IntN(len(junk))]
			case 1:
				raw = append(raw[:i], raw[i+1:]...)
			case 2:
				raw = append(raw[:i], append([]byte{junk[rng.IntN(len(junk))]}, raw[i:]...)...)
			case 3: // repeat a span, which duplicates names and fields
				j := min(len(raw), i+rng.IntN(80))
				raw = append(raw[:j], append(bytes.Clone(raw[i:j]), raw[j:]...)...)
			}
		}
		checkCanonical(t, raw)
	}
}

// TestManyNames covers name tables past the stack-allocated size, growing
// ones (the general parser's) and duplicates anywhere, on both paths.
func TestManyNames(t *testing.T) {
	for _, n := range []int{1, 31, 32, 33, 64, 200, 1000} {
		for _, dup := range []int{-1, 0, n / 2, n - 1} {
			for _, spaced := range []bool{false, true} {
				var hb strings.Builder
				hb.WriteString("{")
				for i := range n {
					if i > 0 {
						hb.WriteString(",")
					}
					name := fmt.Sprintf("t%d", i)
					if i == dup && n > 1 {
						name = fmt.Sprintf("t%d", (i+1)%n)
					}
					sep := ""
					if spaced {
						sep = " "
					}
					fmt.Fprintf(&hb, `%s"%s":%s{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}`, sep, name, sep, i, i+1)
				}
				hb.WriteString("}")
				raw := []byte(hb.String())
				wantDup := dup >= 0 && n > 1
				fast := checkCanonical(t, raw)
				if fast == (spaced || wantDup) {
					t.Errorf("n=%d dup=%d spaced=%v: fast path took it: %v", n, dup, spaced, fast)
				}
				h, err := parseHeader(raw)
				if wantDup {
					if err == nil || !strings.Contains(err.Error(), "duplicate key") {
						t.Errorf("n=%d dup=%d spaced=%v: err = %v, want a duplicate key", n, dup, spaced, err)
					}
					continue
				}
				if err != nil || len(h.entries) != n {
					t.Errorf("n=%d spaced=%v: %d entries, %v", n, spaced, len(h.entries), err)
				}
			}
		}
	}
}

// TestCanonicalBoundsEntries: a header of '{'s inside a name must not make
// the fast path reserve entries for each of them.
func TestCanonicalBoundsEntries(t *testing.T) {
	raw := []byte(`{"` + strings.Repeat("{", 1<<16) + `":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`)
	h, ok := parseCanonical(raw)
	if !ok || len(h.entries) != 1 {
		t.Fatalf("ok=%v, %d entries", ok, len(h.entries))
	}
	if c := cap(h.entries); c > len(raw)/minEntryLen {
		t.Errorf("reserved %d entries for a %d-byte header", c, len(raw))
	}
}

// TestNamesDoNotAliasTheBuffer: names and metadata survive the caller
// overwriting the buffer, on both paths, including names long enough to
// outgrow the fast path's first arena.
func TestNamesDoNotAliasTheBuffer(t *testing.T) {
	sd := &tensor.StateDict{}
	for i := range 10 {
		name := fmt.Sprintf("%d.%s", i, strings.Repeat("long name é ", 20*(i+1)))
		if err := sd.Add(tensor.NewF32(name, 1)); err != nil {
			t.Fatal(err)
		}
	}
	blob, err := Encode(sd, map[string]string{"format": "pt", "note": strings.Repeat("m", 500)})
	if err != nil {
		t.Fatal(err)
	}
	if !checkCanonical(t, headerOf(blob)) {
		t.Fatal("fast path rejected Encode's header")
	}
	spaced := bytes.Replace(blob, []byte(`":{"dtype"`), []byte(`": {"dtype"`), 1)
	binary.LittleEndian.PutUint64(spaced, uint64(len(headerOf(blob))+1))
	for _, in := range [][]byte{blob, spaced} {
		in = bytes.Clone(in)
		f, err := Decode(in)
		if err != nil {
			t.Fatal(err)
		}
		for i := range in {
			in[i] = 'X'
		}
		for i, tn := range f.Tensors.Tensors() {
			if want := sd.At(i).Name; tn.Name != want {
				t.Fatalf("name %d became %q after the buffer changed, want %q", i, tn.Name, want)
			}
		}
		if f.Metadata["format"] != "pt" || f.Metadata["note"] != strings.Repeat("m", 500) {
			t.Fatalf("metadata became %q after the buffer changed", f.Metadata)
		}
	}
}
