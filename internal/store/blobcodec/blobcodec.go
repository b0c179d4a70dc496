// Package blobcodec is a gRPC codec that moves the model store's chunk
// messages without the copies the stock proto codec makes. It is selected
// per call with grpc.CallContentSubtype(blobcodec.Name) and registered by
// importing this package (the store service and client both do); a peer
// that does not ask for it, such as the Python client, gets the stock
// proto codec and the same bytes on the wire.
//
// What it saves, per chunk:
//   - Marshal of a StorePullResponse or StorePushRequest chunk returns the
//     chunk's bytes as they are, behind a few bytes of protobuf prefix, so
//     the only copy before the socket is gRPC's into its write buffer (the
//     stock codec first copies the whole message into a new buffer).
//   - Unmarshal into a *Pulled keeps the received chunk in gRPC's own
//     buffers until the caller copies it once to its destination (the stock
//     codec materializes the message, then copies the bytes field again,
//     into a new allocation per chunk).
//   - Unmarshal into a *Pushed does the same for a pushed chunk.
//
// Every other message goes through the stock proto codec unchanged.
package blobcodec

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Name is the codec's content-subtype.
const Name = "rlhub-blob"

func init() { encoding.RegisterCodecV2(codec{}) }

type codec struct{}

func (codec) Name() string { return Name }

func stock() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

// Field numbers in store.proto: both StorePullResponse and
// StorePushRequest carry `Chunk chunk = 2`, and Chunk carries `bytes data = 1`.
const (
	chunkField = 2
	dataField  = 1
)

// chunkPrefix returns the protobuf bytes that precede n data bytes in a
// message whose only field is chunk{data}.
func chunkPrefix(n int) []byte {
	inner := protowire.SizeTag(dataField) + protowire.SizeVarint(uint64(n)) + n
	b := make([]byte, 0, 16)
	b = protowire.AppendTag(b, chunkField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, dataField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	return b
}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	var data []byte
	switch m := v.(type) {
	case *rlhubv1.StorePullResponse:
		data = m.GetChunk().GetData()
	case *rlhubv1.StorePushRequest:
		data = m.GetChunk().GetData()
	}
	if data == nil {
		return stock().Marshal(v)
	}
	// SliceBuffers are not pooled: freeing them is a no-op, and data (an
	// immutable snapshot's or the pusher's bytes) outlives the write.
	return mem.BufferSlice{mem.SliceBuffer(chunkPrefix(len(data))), mem.SliceBuffer(data)}, nil
}

// Chunk holds a received chunk's bytes in gRPC's buffers, without a copy.
// The zero value holds nothing.
type Chunk struct {
	r *mem.Reader // holds references to the received buffers
}

// ChunkLen is the number of chunk bytes held.
func (c *Chunk) ChunkLen() int {
	if c.r == nil {
		return 0
	}
	return c.r.Remaining()
}

// WriteChunk passes the held bytes to write, in pieces that are views of
// gRPC's buffers valid only during the call, then releases them. It is a
// no-op when nothing is held.
func (c *Chunk) WriteChunk(write func([]byte) error) error {
	if c.r == nil {
		return nil
	}
	defer c.Release()
	views, err := c.r.Peek(c.r.Remaining(), nil)
	if err != nil {
		return err
	}
	for _, v := range views {
		if err := write(v); err != nil {
			return err
		}
	}
	return nil
}

// Release frees the held buffers. Safe to call twice.
func (c *Chunk) Release() {
	if c.r != nil {
		c.r.Close()
		c.r = nil
	}
}

func (c *Chunk) hold(data []byte) { c.r = mem.BufferSlice{mem.SliceBuffer(data)}.Reader() }

// Pulled is one StorePullResponse received with the blob codec: either a
// decoded Header or a Chunk still in gRPC's buffers. Release it (or
// consume it with WriteChunk) before reusing or dropping it.
type Pulled struct {
	Header *rlhubv1.StorePullHeader
	Chunk
}

// Set makes p hold a decoded response (for a stream received with the
// stock codec).
func (p *Pulled) Set(resp *rlhubv1.StorePullResponse) error {
	p.Release()
	*p = Pulled{}
	switch b := resp.Body.(type) {
	case *rlhubv1.StorePullResponse_Header:
		p.Header = b.Header
	case *rlhubv1.StorePullResponse_Chunk:
		p.hold(b.Chunk.GetData())
	default:
		return fmt.Errorf("blobcodec: pull response with no body")
	}
	return nil
}

// Pushed is one StorePushRequest received with the blob codec: either a
// decoded Header or a Chunk still in gRPC's buffers.
type Pushed struct {
	Header *rlhubv1.StorePushHeader
	Chunk
}

// Set makes p hold a decoded request (for a stream received with the stock
// codec).
func (p *Pushed) Set(req *rlhubv1.StorePushRequest) error {
	p.Release()
	*p = Pushed{}
	switch b := req.Body.(type) {
	case *rlhubv1.StorePushRequest_Header:
		p.Header = b.Header
	case *rlhubv1.StorePushRequest_Chunk:
		p.hold(b.Chunk.GetData())
	default:
		return fmt.Errorf("blobcodec: push request with no body")
	}
	return nil
}

var errMalformed = errors.New("blobcodec: malformed chunk message")

// readPrefix reads one tag and one length from r.
func readTagLen(r *mem.Reader) (protowire.Number, protowire.Type, uint64, error) {
	tag, err := readVarint(r)
	if err != nil {
		return 0, 0, 0, err
	}
	num, typ := protowire.DecodeTag(tag)
	if typ != protowire.BytesType {
		return num, typ, 0, errMalformed
	}
	n, err := readVarint(r)
	return num, typ, n, err
}

func readVarint(r *mem.Reader) (uint64, error) {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := r.ReadByte()
		if err != nil {
			return 0, errMalformed
		}
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x, nil
		}
	}
	return 0, errMalformed
}

// chunkReader checks that data is exactly chunk{data: ...} and returns a
// reader positioned at the data bytes, or nil when data is some other
// message (the caller then decodes it with the stock codec).
func chunkReader(data mem.BufferSlice) (*mem.Reader, error) {
	r := data.Reader()
	num, _, outer, err := readTagLen(r)
	if err != nil || num != chunkField || outer != uint64(r.Remaining()) {
		r.Close()
		return nil, nil
	}
	num, _, inner, err := readTagLen(r)
	if err != nil || num != dataField || inner != uint64(r.Remaining()) {
		r.Close()
		return nil, nil
	}
	return r, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *Pulled:
		m.Release()
		*m = Pulled{}
		if r, _ := chunkReader(data); r != nil {
			m.r = r
			return nil
		}
		var resp rlhubv1.StorePullResponse
		if err := stock().Unmarshal(data, &resp); err != nil {
			return err
		}
		// An unusual but valid encoding of a chunk keeps its decoded bytes.
		return m.Set(&resp)
	case *Pushed:
		m.Release()
		*m = Pushed{}
		if r, _ := chunkReader(data); r != nil {
			m.r = r
			return nil
		}
		var req rlhubv1.StorePushRequest
		if err := stock().Unmarshal(data, &req); err != nil {
			return err
		}
		return m.Set(&req)
	}
	return stock().Unmarshal(data, v)
}
