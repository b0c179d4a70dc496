package replica

import (
	"encoding/binary"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// codecName is the replication stream's gRPC content-subtype: its codec
// moves a data frame's bytes without the copies of the stock proto codec.
// On the wire every message is still a BytesValue's proto encoding; only
// how the two ends make and read data frames differs. The follower asks
// for it (grpc.CallContentSubtype) and the primary answers with it.
//
//   - The primary sends a data frame as a *dataOut: the codec hands its
//     bytes to gRPC's writer behind a few bytes of prefix, so the only
//     copy before the socket is gRPC's into its write buffer. gRPC may hold
//     them after SendMsg returns: bytes lent by the store (memFile) are
//     counted until gRPC frees every buffer over them; any other bytes a
//     data frame carries are never changed (the garbage collector keeps
//     them).
//   - The follower receives a data frame into a *dataIn, which holds it in
//     gRPC's receive buffers until it is written to its file.
//
// Every other message goes through the stock proto codec.
const codecName = "rlhub-replica"

func init() { encoding.RegisterCodecV2(replicaCodec{}) }

type replicaCodec struct{}

func (replicaCodec) Name() string { return codecName }

func stockCodec() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

func (replicaCodec) Marshal(v any) (mem.BufferSlice, error) {
	if d, ok := v.(*dataOut); ok {
		return d.marshal(), nil
	}
	return stockCodec().Marshal(v)
}

func (replicaCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if d, ok := v.(*dataIn); ok {
		return d.unmarshal(data)
	}
	return stockCodec().Unmarshal(data, v)
}

// valueField is BytesValue's `bytes value = 1`.
const valueField = 1

// dataOut is a data frame to send: b, a view of lent bytes when lent is
// set. Never empty.
type dataOut struct {
	b    []byte
	lent *memFile
}

func (d *dataOut) marshal() mem.BufferSlice {
	prefix := protowire.AppendTag(make([]byte, 0, 8), valueField, protowire.BytesType)
	prefix = protowire.AppendVarint(prefix, uint64(len(d.b)))
	body := mem.Buffer(mem.SliceBuffer(d.b))
	if d.lent != nil {
		if mem.IsBelowBufferPoolingThreshold(cap(d.b)) {
			// gRPC does not report freeing a buffer this small: a copy.
			body = mem.SliceBuffer(slices.Clone(d.b))
		} else {
			d.lent.hold()
			b := d.b
			body = mem.NewBuffer(&b, d.lent) // gRPC's Put on the memFile ends the hold
		}
	}
	return mem.BufferSlice{mem.SliceBuffer(prefix), body}
}

// dataIn is a received data frame, held in gRPC's buffers.
type dataIn struct {
	r *mem.Reader
}

func (d *dataIn) unmarshal(data mem.BufferSlice) error {
	r := data.Reader()
	var buf [2 * binary.MaxVarintLen64]byte // room for the tag and the length
	views, _ := r.Peek(min(len(buf), r.Remaining()), nil)
	head := buf[:0]
	for _, v := range views {
		head = append(head, v...)
	}
	num, typ, k := protowire.ConsumeTag(head)
	if k < 0 || num != valueField || typ != protowire.BytesType {
		r.Close()
		return errFrame
	}
	n, m := protowire.ConsumeVarint(head[k:])
	if m < 0 || n == 0 || n != uint64(r.Remaining()-k-m) {
		r.Close()
		return errFrame
	}
	if _, err := r.Discard(k + m); err != nil {
		r.Close()
		return errFrame
	}
	d.r = r
	return nil
}

// len is the number of data bytes held.
func (d *dataIn) len() int { return d.r.Remaining() }

// writeTo writes the held bytes to f, in one writev of the views of
// gRPC's buffers, and releases them.
func (d *dataIn) writeTo(f *os.File) error {
	defer d.release()
	views, err := d.r.Peek(d.r.Remaining(), nil)
	if err != nil {
		return err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		werr = writev(int(fd), views)
		return true
	}); err != nil {
		return err
	}
	return werr
}

// writev writes every byte of views to fd, in as few writev calls as the
// kernel takes them (a regular file takes them in one).
func writev(fd int, views [][]byte) error {
	for len(views) > 0 {
		n, err := unix.Writev(fd, views[:min(len(views), 1024)]) // IOV_MAX
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		for n > 0 {
			if n >= len(views[0]) {
				n -= len(views[0])
				views = views[1:]
			} else {
				views[0] = views[0][n:]
				n = 0
			}
		}
	}
	return nil
}

// release frees the held buffers; safe to call twice.
func (d *dataIn) release() {
	if d.r != nil {
		d.r.Close()
		d.r = nil
	}
}
