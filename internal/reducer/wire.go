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

// bufPool recycles gradient receive buffers by exact size (a model's
// gradients are all the same size), saving an allocation and its zeroing
// per push. Buffers are 8-byte aligned ([]uint64 backing).
var bufPool sync.Map // int → *sync.Pool of []byte

func getBuf(n int) []byte {
	p, _ := bufPool.LoadOrStore(n, &sync.Pool{New: func() any { return tensor.AlignedBytes(n) }})
	return p.(*sync.Pool).Get().([]byte)
}

// putBuf returns a buffer from getBuf; nothing may alias it afterwards.
func putBuf(b []byte) {
	if p, ok := bufPool.Load(len(b)); ok {
		p.(*sync.Pool).Put(b) //nolint:staticcheck // a slice header is fine here
	}
}

// chunkRecv receives one chunk of a stream and passes its bytes to write,
// in one or more pieces that are valid only during the call (with the
// chunk codec they are views of gRPC's receive buffers); it returns io.EOF
// after the last chunk. Receiving this way lets receiveGradient copy each
// byte once, from the transport's buffers into the pooled buffer.
type chunkRecv func(write func([]byte) error) error

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

// receiveGradient assembles one safetensors blob of exactly total bytes
// from recv and decodes it. It checks the size limit before allocating and
// the header length as soon as the first 8 bytes are in. The tensors alias
// buf, a pooled buffer the caller owns and gives back with putBuf once
// nothing reads them.
//
// With scan set, it also looks for NaN/Inf in the data section (read as
// float32s from its start) piece by piece right after copying each piece,
// while it is still in cache, instead of in a separate pass over the
// whole gradient: clean is true when it found none. That is exact for a
// gradient whose tensors are all F32 (the only kind the reducer accepts,
// checked after decoding); a false alarm from other bytes only costs the
// caller a full check.
func receiveGradient(total uint64, maxBytes int64, scan bool, recv chunkRecv) (sd *tensor.StateDict, buf []byte, clean bool, err error) {
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
	n, checked := 0, false
	// scanned: the data section is scanned up to here; 0 until the header
	// length is known. dirty: a NaN/Inf was seen.
	scanned, dirty := 0, false
	write := func(b []byte) error {
		if len(b) > len(buf)-n {
			return fmt.Errorf("%w: chunks overrun the announced %d bytes", errs.ErrInvalid, len(buf))
		}
		n += copy(buf[n:], b)
		if !checked && n >= 8 {
			checked = true
			h, err := safetensors.HeaderLen(buf[:8], maxHeaderBytes)
			if err != nil {
				return err
			}
			if h > uint64(len(buf)-8) {
				return fmt.Errorf("%w: header length %d exceeds the announced blob of %d bytes", errs.ErrInvalid, h, len(buf))
			}
			scanned = 8 + int(h)
		}
		if scan && checked && !dirty && n-scanned >= 4 {
			end := scanned + (n-scanned)&^3
			if f, err := tensor.BytesAsFloat32s(buf[scanned:end]); err != nil || kernels.HasNonFinite(f) {
				dirty = true // or misaligned: let the full check decide
			}
			scanned = end
		}
		return nil
	}
	for {
		err := recv(write)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, false, err
		}
	}
	if n != len(buf) {
		return nil, nil, false, fmt.Errorf("%w: stream ended after %d of %d announced bytes", errs.ErrInvalid, n, len(buf))
	}
	f, err := safetensors.DecodeOptions(buf, safetensors.Options{MaxHeaderBytes: maxHeaderBytes})
	if err != nil {
		return nil, nil, false, err
	}
	return f.Tensors, buf, scan && !dirty && scanned == n, nil
}

// maxHeaderBytes bounds a pushed blob's JSON header (16 MiB).
const maxHeaderBytes = 16 << 20

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
