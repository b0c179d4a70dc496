package safetensors

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/tensor"
)

// Layout is a planned encoding of a state dict: the header bytes and the
// tensors in file order. Building it costs no tensor-byte copies, so a
// sender can stream Header and then each tensor's Data straight from the
// caller's memory.
type Layout struct {
	// Header is the 8-byte length prefix followed by the padded JSON header.
	Header []byte
	// Order lists the tensors in file order; their Data is not copied.
	Order []*tensor.Tensor
	// Size is the total encoded size in bytes.
	Size int64
}

// Plan computes the encoding of sd with optional metadata. It validates every
// tensor and returns an error instead of encoding an inconsistent one.
func Plan(sd *tensor.StateDict, metadata map[string]string) (*Layout, error) {
	order := slices.Clone(sd.Tensors())
	for _, t := range order {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if t.Name == MetadataKey {
			return nil, fmt.Errorf("%w: tensor name %q is reserved", ErrInvalid, MetadataKey)
		}
		if !utf8.ValidString(t.Name) {
			return nil, fmt.Errorf("%w: tensor name %q is not valid UTF-8", ErrInvalid, t.Name)
		}
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: metadata %q: %q is not valid UTF-8", ErrInvalid, k, v)
		}
	}
	// The reference library's order: dtype rank descending, then name.
	slices.SortStableFunc(order, func(a, b *tensor.Tensor) int {
		if a.DType != b.DType {
			return int(b.DType) - int(a.DType)
		}
		return strings.Compare(a.Name, b.Name)
	})

	// Build the header in one buffer: 8 bytes of length prefix (filled in
	// last), the JSON, then space padding. The size estimate makes one
	// allocation the common case.
	est := 8 + 64
	for _, t := range order {
		est += len(t.Name) + 80 + 12*len(t.Shape)
	}
	for k, v := range metadata {
		est += len(k) + len(v) + 8
	}
	hdr := make([]byte, 8, est)
	hdr = append(hdr, '{')
	first := true
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		hdr = appendQuoted(hdr, MetadataKey)
		hdr = append(hdr, ":{"...)
		for i, k := range keys {
			if i > 0 {
				hdr = append(hdr, ',')
			}
			hdr = appendQuoted(hdr, k)
			hdr = append(hdr, ':')
			hdr = appendQuoted(hdr, metadata[k])
		}
		hdr = append(hdr, '}')
		first = false
	}
	var off int64
	for _, t := range order {
		if !first {
			hdr = append(hdr, ',')
		}
		first = false
		hdr = appendQuoted(hdr, t.Name)
		hdr = append(hdr, `:{"dtype":"`...)
		hdr = append(hdr, t.DType.String()...)
		hdr = append(hdr, `","shape":[`...)
		for i, d := range t.Shape {
			if i > 0 {
				hdr = append(hdr, ',')
			}
			hdr = strconv.AppendInt(hdr, d, 10)
		}
		end := off + int64(len(t.Data))
		hdr = append(hdr, `],"data_offsets":[`...)
		hdr = strconv.AppendInt(hdr, off, 10)
		hdr = append(hdr, ',')
		hdr = strconv.AppendInt(hdr, end, 10)
		hdr = append(hdr, "]}"...)
		off = end
	}
	hdr = append(hdr, '}')
	for (len(hdr)-8)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	binary.LittleEndian.PutUint64(hdr, uint64(len(hdr)-8))
	return &Layout{Header: hdr, Order: order, Size: int64(len(hdr)) + off}, nil
}

// Buffers is the encoding as pieces: the header, then each tensor's Data
// in file order, without copying. Writing them to a TCP connection as
// net.Buffers is one writev (the transport converts; this package stays
// free of net); the tensors must not change until the write returns.
func (l *Layout) Buffers() [][]byte {
	bufs := make([][]byte, 0, 1+len(l.Order))
	bufs = append(bufs, l.Header)
	for _, t := range l.Order {
		bufs = append(bufs, t.Data)
	}
	return bufs
}

// WriteTo writes the encoding to w: the header, then each tensor's bytes
// directly from its Data (Buffers).
func (l *Layout) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for _, b := range l.Buffers() {
		m, err := w.Write(b)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// EncodeInto writes the encoding into dst, which must be at least l.Size
// bytes, and returns dst[:l.Size].
func (l *Layout) EncodeInto(dst []byte) []byte {
	if int64(len(dst)) < l.Size {
		panic(fmt.Sprintf("safetensors: EncodeInto needs %d bytes, got %d", l.Size, len(dst)))
	}
	p := copy(dst, l.Header)
	for _, t := range l.Order {
		p += copy(dst[p:], t.Data)
	}
	return dst[:p]
}

// Encode returns the safetensors encoding of sd in a new 8-byte-aligned
// buffer, so decoding it gives aligned zero-copy views.
func Encode(sd *tensor.StateDict, metadata map[string]string) ([]byte, error) {
	l, err := Plan(sd, metadata)
	if err != nil {
		return nil, err
	}
	return l.EncodeInto(tensor.AlignedBytes(int(l.Size))), nil
}

// appendQuoted appends s as a JSON string exactly as serde_json (the
// reference library's serializer) writes it: only '"', '\\' and control
// characters are escaped (\b \t \n \f \r short, others as \u00xx);
// everything else, including non-ASCII, '<', '>', '&' and '/', is written
// raw. s must be valid UTF-8.
func appendQuoted(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
