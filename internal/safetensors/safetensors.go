// Package safetensors encodes and decodes the safetensors format, the byte
// layout rlhub uses on disk and on the wire for every state dict.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON
// mapping tensor names to {dtype, shape, data_offsets} (plus an optional
// "__metadata__" object of strings), then the raw tensor bytes. Encode
// writes exactly what the reference Python/Rust library writes for the same
// tensors (tensors sorted by dtype rank, largest first, then by name; compact
// JSON; header padded with spaces to a multiple of 8), so files are
// byte-identical across languages and every tensor starts aligned to its
// element size.
//
// Decode treats its input as untrusted: it validates the header length, the
// JSON, every offset and shape, and returns an error wrapping ErrInvalid
// instead of panicking. Decoded tensors alias the input buffer: no tensor
// bytes are copied. Names and metadata are copied, so they stay valid when
// the caller reuses the buffer.
//
// The format is small and a library would cost a copy, so it is written here
// directly.
package safetensors

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

// ErrInvalid is wrapped by every error Decode returns for malformed input.
var ErrInvalid = fmt.Errorf("safetensors: %w", errs.ErrInvalid)

// MetadataKey is the reserved header key holding string metadata.
const MetadataKey = "__metadata__"

// DefaultMaxHeaderBytes bounds the JSON header, as the reference library
// does (100 MB).
const DefaultMaxHeaderBytes = 100_000_000

// Options bound what Decode accepts. The zero value means the defaults.
type Options struct {
	// MaxHeaderBytes bounds the JSON header length; 0 means
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int64
	// MaxTensors bounds the number of tensors; 0 means no bound beyond the
	// header size.
	MaxTensors int
}

// File is a decoded safetensors blob.
type File struct {
	// Tensors in file order (by data offset). Their Data aliases the
	// decoded buffer.
	Tensors *tensor.StateDict
	// Metadata from "__metadata__"; nil when absent.
	Metadata map[string]string
	// HeaderLen is the length of the JSON header (without the 8-byte prefix).
	HeaderLen int64
}

// shapeText is a shape for an error: cut at 160 bytes, with its rank
// (a peer's header may claim thousands of dimensions).
func shapeText(shape []int64) string {
	t := fmt.Sprint(shape)
	if len(t) <= 160 {
		return t
	}
	return fmt.Sprintf("%s…(rank %d)", errs.Clip(t, 160), len(shape))
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Decode parses and validates buf with default options.
func Decode(buf []byte) (*File, error) { return DecodeOptions(buf, Options{}) }

// DecodeOptions parses and validates buf. The returned tensors alias buf.
func DecodeOptions(buf []byte, opt Options) (*File, error) {
	maxHeader := opt.MaxHeaderBytes
	if maxHeader <= 0 {
		maxHeader = DefaultMaxHeaderBytes
	}
	n, err := HeaderLen(buf, maxHeader)
	if err != nil {
		return nil, err
	}
	if uint64(len(buf)-8) < n {
		return nil, invalidf("header length %d exceeds the %d bytes after the prefix", n, len(buf)-8)
	}
	hdr, err := parseHeader(buf[8 : 8+n])
	if err != nil {
		return nil, err
	}
	if opt.MaxTensors > 0 && len(hdr.entries) > opt.MaxTensors {
		return nil, invalidf("%d tensors exceeds the limit of %d", len(hdr.entries), opt.MaxTensors)
	}
	data := buf[8+n:]
	// Sort by (begin, end), keeping header order for ties; then the entries
	// must tile data exactly. The end offset matters: a zero-size tensor may
	// share its begin offset with the next non-empty tensor (the reference
	// writer does this), and must sort before it. Both writers list tensors
	// in data order, so the sort is usually skipped.
	if !offsetsSorted(hdr.entries) {
		slices.SortStableFunc(hdr.entries, compareOffsets)
	}
	var pos uint64
	ptrs := make([]*tensor.Tensor, len(hdr.entries))
	for i := range hdr.entries {
		e := &hdr.entries[i]
		if e.begin != pos {
			if e.begin < pos {
				return nil, invalidf("tensor %s: data_offsets [%d,%d] overlap the previous tensor ending at %d", errs.Quote(e.Name), e.begin, e.end, pos)
			}
			return nil, invalidf("tensor %s: gap in data before offset %d (previous tensor ends at %d)", errs.Quote(e.Name), e.begin, pos)
		}
		if e.end < e.begin {
			return nil, invalidf("tensor %s: data_offsets [%d,%d] end before they begin", errs.Quote(e.Name), e.begin, e.end)
		}
		if e.end > uint64(len(data)) {
			return nil, invalidf("tensor %s: data_offsets [%d,%d] beyond the %d data bytes", errs.Quote(e.Name), e.begin, e.end, len(data))
		}
		want, ok := tensor.ByteLen(e.DType, e.Shape)
		if !ok {
			return nil, invalidf("tensor %s: shape %s overflows", errs.Quote(e.Name), shapeText(e.Shape))
		}
		if uint64(want) != e.end-e.begin {
			return nil, invalidf("tensor %s: shape %s × %v is %d bytes but data_offsets [%d,%d] hold %d", errs.Quote(e.Name), shapeText(e.Shape), e.DType, want, e.begin, e.end, e.end-e.begin)
		}
		// The entries become the tensors: one allocation for all of them.
		e.Data = data[e.begin:e.end:e.end]
		ptrs[i] = &e.Tensor
		pos = e.end
	}
	if pos != uint64(len(data)) {
		return nil, invalidf("%d trailing data bytes after the last tensor", uint64(len(data))-pos)
	}
	// parseHeader has checked that names are unique and non-empty, and the
	// loop above that every tensor is valid.
	sd := tensor.NewStateDictUnchecked(ptrs)
	return &File{Tensors: sd, Metadata: hdr.metadata, HeaderLen: int64(n)}, nil
}

// HeaderLen reads and checks the 8-byte length prefix of a blob. It needs
// only the first 8 bytes, so a streaming receiver can reject a huge header
// before buffering anything.
func HeaderLen(prefix []byte, maxHeader int64) (uint64, error) {
	if len(prefix) < 8 {
		return 0, invalidf("%d bytes is too short for the 8-byte header length", len(prefix))
	}
	n := uint64(prefix[0]) | uint64(prefix[1])<<8 | uint64(prefix[2])<<16 | uint64(prefix[3])<<24 |
		uint64(prefix[4])<<32 | uint64(prefix[5])<<40 | uint64(prefix[6])<<48 | uint64(prefix[7])<<56
	if maxHeader <= 0 {
		maxHeader = DefaultMaxHeaderBytes
	}
	if n > uint64(maxHeader) {
		return 0, invalidf("header length %d exceeds the limit of %d", n, maxHeader)
	}
	if n < 2 {
		return 0, invalidf("header length %d is too short for a JSON object", n)
	}
	return n, nil
}

// entry is one tensor of the header: its name, dtype and shape, and its
// data offsets. Decode fills in Data and hands out &entry.Tensor.
type entry struct {
	tensor.Tensor
	begin, end uint64
}

// offsetsSorted reports whether es is in (begin, end) order.
func offsetsSorted(es []entry) bool {
	for i := 1; i < len(es); i++ {
		a, b := &es[i-1], &es[i]
		if a.begin > b.begin || (a.begin == b.begin && a.end > b.end) {
			return false
		}
	}
	return true
}

// compareOffsets orders entries by (begin, end).
func compareOffsets(a, b entry) int {
	if c := cmp.Compare(a.begin, b.begin); c != 0 {
		return c
	}
	return cmp.Compare(a.end, b.end)
}

type header struct {
	entries     []entry
	metadata    map[string]string
	sawMetadata bool
}
