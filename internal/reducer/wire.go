package reducer

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Gradient receive buffers are recycled by exact size (a model's
// gradients are all the same size), saving an allocation and the
// runtime's zeroing of it per push. A free list rather than a sync.Pool:
// the pool is emptied by every other garbage collection, and a reducer
// allocating a fresh 4 MiB model version per step collects every few
// steps, so the pool was mostly empty when a push needed a buffer. The
// list keeps at most freeBytes of buffers per size (and at least 2).
// Buffers are 8-byte aligned ([]uint64 backing).
var (
	freeMu    sync.Mutex
	freeLists = map[int][][]byte{}
)

const freeBytes = 256 << 20

func getBuf(n int) []byte {
	freeMu.Lock()
	if l := freeLists[n]; len(l) > 0 {
		b := l[len(l)-1]
		freeLists[n] = l[:len(l)-1]
		freeMu.Unlock()
		return b
	}
	freeMu.Unlock()
	return tensor.AlignedBytes(n)
}

// putBuf returns a buffer from getBuf; nothing may alias it afterwards.
func putBuf(b []byte) {
	freeMu.Lock()
	defer freeMu.Unlock()
	if l := freeLists[len(b)]; len(l) < max(2, freeBytes/max(len(b), 1)) {
		freeLists[len(b)] = append(l, b)
	}
}

// gradBody delivers a pushed gradient's bytes into an assembly: from a
// gRPC chunk stream (chunks) or straight from the data plane's socket
// (fromReader).
type gradBody func(a *assembly) error

// chunkRecv receives one chunk of a stream and passes its bytes to write,
// in one or more pieces that are valid only during the call (with the
// chunk codec they are views of gRPC's receive buffers); it returns io.EOF
// after the last chunk. Receiving this way lets the assembly copy each
// byte once, from the transport's buffers into the pooled buffer.
type chunkRecv func(write func([]byte) error) error

// chunks is the gradBody of a chunk stream.
func chunks(recv chunkRecv) gradBody {
	return func(a *assembly) error {
		for {
			err := recv(a.write)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
}

// readPiece is how much fromReader asks the socket for at once: the
// NaN/Inf scan of each piece then reads bytes still in cache.
const readPiece = 256 << 10

// fromReader is the gradBody of a reader that yields exactly the blob's
// bytes (the data plane's body): the kernel copies them from the socket
// into the assembly's buffer, the only copy on this side.
func fromReader(open func(n int64) (io.Reader, error)) gradBody {
	return func(a *assembly) error {
		r, err := open(int64(len(a.buf)))
		if err != nil {
			return err
		}
		for a.n < len(a.buf) {
			k, err := r.Read(a.buf[a.n:min(a.n+readPiece, len(a.buf))])
			if k > 0 {
				if gerr := a.grew(k); gerr != nil {
					return gerr
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return err
			}
		}
		return nil
	}
}

// streamRecv adapts a Push or Forward stream to a chunkRecv: recvMsg
// receives one message into m (which the caller releases when done); a
// message that is not a chunk is refused as "a second header".
func streamRecv[M proto.Message](recvMsg func(*chunkcodec.Msg[M]) error, m *chunkcodec.Msg[M], what string) chunkRecv {
	return func(write func([]byte) error) error {
		if err := recvMsg(m); err != nil {
			return err // io.EOF at the end
		}
		if !m.Held() {
			return fmt.Errorf("%w: %s: a second header", errs.ErrInvalid, what)
		}
		return m.WriteChunk(write)
	}
}

// assembly is one blob being received into buf: n bytes are in. It checks
// the safetensors header length as soon as the first 8 bytes are in and,
// with scan set, looks for NaN/Inf in the data section (read as float32s
// from its start) piece by piece as the bytes arrive, while they are
// still in cache, instead of in a separate pass over the whole gradient.
type assembly struct {
	buf     []byte
	n       int
	scan    bool
	checked bool // the header length is known and fits
	scanned int  // the data section is scanned up to here (0 until checked)
	dirty   bool // a NaN/Inf (or a misaligned section) was seen
}

// write copies b into the buffer.
func (a *assembly) write(b []byte) error {
	if len(b) > len(a.buf)-a.n {
		return fmt.Errorf("%w: chunks overrun the announced %d bytes", errs.ErrInvalid, len(a.buf))
	}
	copy(a.buf[a.n:], b)
	return a.grew(len(b))
}

// grew takes note of k more bytes in the buffer.
func (a *assembly) grew(k int) error {
	a.n += k
	if !a.checked && a.n >= 8 {
		a.checked = true
		h, err := safetensors.HeaderLen(a.buf[:8], maxHeaderBytes)
		if err != nil {
			return err
		}
		if h > uint64(len(a.buf)-8) {
			return fmt.Errorf("%w: header length %d exceeds the announced blob of %d bytes", errs.ErrInvalid, h, len(a.buf))
		}
		a.scanned = 8 + int(h)
	}
	if a.scan && a.checked && !a.dirty && a.n-a.scanned >= 4 {
		end := a.scanned + (a.n-a.scanned)&^3
		if f, err := tensor.BytesAsFloat32s(a.buf[a.scanned:end]); err != nil || kernels.HasNonFinite(f) {
			a.dirty = true // or misaligned: let the full check decide
		}
		a.scanned = end
	}
	return nil
}

// receiveGradient assembles one safetensors blob of exactly total bytes
// from body and decodes it. It checks the size limit before allocating
// (and before body is asked for any byte). The tensors alias buf, a
// pooled buffer the caller owns and gives back with putBuf once nothing
// reads them.
//
// With scan set, clean is true when the scan while receiving (assembly)
// found no NaN/Inf. That is exact for a gradient whose tensors are all
// F32 (the only kind the reducer accepts, checked after decoding); a
// false alarm from other bytes only costs the caller a full check.
func receiveGradient(total uint64, maxBytes int64, scan bool, body gradBody) (sd *tensor.StateDict, buf []byte, clean bool, err error) {
	if total > uint64(maxBytes) {
		return nil, nil, false, fmt.Errorf("%w: gradient of %d bytes exceeds the limit of %d", errs.ErrFull, total, maxBytes)
	}
	if total < 10 {
		return nil, nil, false, fmt.Errorf("%w: blob of %d bytes is too small to be safetensors", errs.ErrInvalid, total)
	}
	buf = getBuf(int(total))
	defer func() {
		if err != nil {
			putBuf(buf)
			buf = nil
		}
	}()
	a := &assembly{buf: buf, scan: scan}
	if err := body(a); err != nil {
		return nil, nil, false, err
	}
	if a.n != len(buf) {
		return nil, nil, false, fmt.Errorf("%w: stream ended after %d of %d announced bytes", errs.ErrInvalid, a.n, len(buf))
	}
	f, err := safetensors.DecodeOptions(buf, safetensors.Options{MaxHeaderBytes: maxHeaderBytes})
	if err != nil {
		return nil, nil, false, err
	}
	return f.Tensors, buf, scan && !a.dirty && a.scanned == a.n, nil
}

// maxHeaderBytes bounds a pushed blob's JSON header (16 MiB).
const maxHeaderBytes = 16 << 20

// GradHeaderSlack is how many bytes beyond its tensor data a gradient of
// layout's model may have: the 8-byte length, room for a JSON header that
// names every tensor with worst-case escaping, and 64 KiB for metadata and
// padding. A gradient is a state dict of exactly layout's tensors, so a
// body that announces more than MaxGradBytesFor(layout) cannot be one and
// is refused from its header, before any of it is read.
func GradHeaderSlack(layout *tensor.StateDict) uint64 {
	n := uint64(8 + 64<<10)
	for _, t := range layout.Tensors() {
		// "name":{"dtype":"F32","shape":[…],"data_offsets":[a,b]}, a name
		// byte escaped as \u00XX at worst, a dimension up to 20 digits.
		n += 6*uint64(len(t.Name)) + 80 + 21*uint64(len(t.Shape))
	}
	return min(n, maxHeaderBytes+8)
}

// MaxGradBytesFor is the largest body a gradient of layout's model may
// announce: its tensor bytes plus GradHeaderSlack.
func MaxGradBytesFor(layout *tensor.StateDict) int64 {
	return layout.ByteSize() + int64(GradHeaderSlack(layout))
}

// checkGradSize refuses a gradient that announces more bytes than a
// gradient of layout's model can have (errs.ErrInvalid, not ErrFull: a
// client must not retry it as it would a full queue).
func checkGradSize(model string, total uint64, layout *tensor.StateDict) error {
	if limit := MaxGradBytesFor(layout); total > uint64(limit) {
		return fmt.Errorf("%w: a body of %d bytes cannot be a gradient of model %s (at most %d bytes)", errs.ErrInvalid, total, errs.Quote(model), limit)
	}
	return nil
}

// sendStateDict streams sd's safetensors encoding through send, one chunk
// per call, without copying tensor bytes (with the chunk codec not even
// into a marshal buffer: the tensors must not change until send returns).
func sendStateDict(l *safetensors.Layout, send func([]byte) error) error {
	return wire.Chunks(l, 0, send)
}

func idsToProto(ids []reduce.ID) []*rlhubv1.ReducerGradientID {
	out := make([]*rlhubv1.ReducerGradientID, len(ids))
	for i, id := range ids {
		out[i] = &rlhubv1.ReducerGradientID{ClientId: id.Client, Seq: id.Seq}
	}
	return out
}

func idsFromProto(ids []*rlhubv1.ReducerGradientID) []reduce.ID {
	out := make([]reduce.ID, len(ids))
	for i, id := range ids {
		out[i] = reduce.ID{Client: id.GetClientId(), Seq: id.GetSeq()}
	}
	return out
}

func layoutToProto(sd *tensor.StateDict) []*rlhubv1.ReducerTensorSpec {
	out := make([]*rlhubv1.ReducerTensorSpec, sd.Len())
	for i, t := range sd.Tensors() {
		out[i] = &rlhubv1.ReducerTensorSpec{Name: t.Name, Dtype: t.DType.String(), Shape: t.Shape}
	}
	return out
}

// layoutFromProto builds a layout state dict (zero-length data is not
// valid, so each tensor gets a shared zero buffer of its size: layouts are
// never read).
func layoutFromProto(specs []*rlhubv1.ReducerTensorSpec) (*tensor.StateDict, error) {
	sd := &tensor.StateDict{}
	for _, s := range specs {
		dt, err := tensor.ParseDType(s.GetDtype())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errs.ErrInvalid, err)
		}
		n, ok := tensor.ByteLen(dt, s.GetShape())
		if !ok || n > 1<<34 {
			return nil, fmt.Errorf("%w: tensor %q shape %v", errs.ErrInvalid, s.GetName(), s.GetShape())
		}
		if err := sd.Add(&tensor.Tensor{Name: s.GetName(), DType: dt, Shape: s.GetShape(), Data: tensor.AlignedBytes(int(n))}); err != nil {
			return nil, fmt.Errorf("%w: %v", errs.ErrInvalid, err)
		}
	}
	return sd, nil
}
