package wsync

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// codecName is the content-subtype of syncCodec, a gRPC codec that moves
// the push stream's chunks without the stock proto codec's extra copies
// (the same idea as the store's blobcodec, for SyncServerMessage):
//   - Marshal of a chunk message returns the chunk's bytes (an immutable
//     snapshot's) behind a few bytes of protobuf prefix, so the only copy
//     before the socket is gRPC's into its write buffer;
//   - Unmarshal into a *received keeps a chunk in gRPC's buffers until the
//     client copies it once into the version's assembler.
//
// The Go Client asks for it per call; other clients (Python) get the stock
// codec and the same bytes on the wire.
const codecName = "rlhub-sync"

func init() { encoding.RegisterCodecV2(syncCodec{}) }

type syncCodec struct{}

func (syncCodec) Name() string { return codecName }

func stockCodec() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

// SyncServerMessage: `Chunk chunk = 2`; Chunk: `bytes data = 1`.
const (
	syncChunkField = 2
	syncDataField  = 1
)

func (syncCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rlhubv1.SyncServerMessage)
	data := m.GetChunk().GetData()
	if !ok || data == nil {
		return stockCodec().Marshal(v)
	}
	inner := protowire.SizeTag(syncDataField) + protowire.SizeVarint(uint64(len(data))) + len(data)
	p := make([]byte, 0, 16)
	p = protowire.AppendTag(p, syncChunkField, protowire.BytesType)
	p = protowire.AppendVarint(p, uint64(inner))
	p = protowire.AppendTag(p, syncDataField, protowire.BytesType)
	p = protowire.AppendVarint(p, uint64(len(data)))
	// SliceBuffers are not pooled; data is a shared immutable snapshot's.
	return mem.BufferSlice{mem.SliceBuffer(p), mem.SliceBuffer(data)}, nil
}

// received is one SyncServerMessage read with syncCodec: a decoded Info,
// or a chunk still held in gRPC's buffers.
type received struct {
	info  *rlhubv1.BlobInfo
	chunk *mem.Reader
	other bool // a valid message that is neither (a newer server's)
}

// writeTo passes the held chunk to write in views of gRPC's buffers, then
// releases them.
func (r *received) writeTo(write func([]byte) error) error {
	if r.chunk == nil {
		return nil
	}
	defer r.release()
	views, err := r.chunk.Peek(r.chunk.Remaining(), nil)
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

func (r *received) release() {
	if r.chunk != nil {
		r.chunk.Close()
		r.chunk = nil
	}
}

var errMalformedChunk = errors.New("wsync: malformed chunk message")

func (syncCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*received)
	if !ok {
		return stockCodec().Unmarshal(data, v)
	}
	m.release()
	*m = received{}
	if r := chunkView(data); r != nil {
		m.chunk = r
		return nil
	}
	var msg rlhubv1.SyncServerMessage
	if err := stockCodec().Unmarshal(data, &msg); err != nil {
		return err
	}
	switch b := msg.Body.(type) {
	case *rlhubv1.SyncServerMessage_Info:
		m.info = b.Info
	case *rlhubv1.SyncServerMessage_Chunk:
		// A valid but unusual encoding of a chunk: keep its decoded bytes.
		m.chunk = mem.BufferSlice{mem.SliceBuffer(b.Chunk.GetData())}.Reader()
	default:
		m.other = true
	}
	return nil
}

// chunkView returns a reader at the data bytes when data is exactly
// chunk{data}, else nil.
func chunkView(data mem.BufferSlice) *mem.Reader {
	r := data.Reader()
	for _, field := range []protowire.Number{syncChunkField, syncDataField} {
		num, n, err := tagLen(r)
		if err != nil || num != field || n != uint64(r.Remaining()) {
			r.Close()
			return nil
		}
	}
	return r
}

func tagLen(r *mem.Reader) (protowire.Number, uint64, error) {
	tag, err := varint(r)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(tag)
	if typ != protowire.BytesType {
		return 0, 0, fmt.Errorf("%w: wire type %d", errMalformedChunk, typ)
	}
	n, err := varint(r)
	return num, n, err
}

func varint(r *mem.Reader) (uint64, error) {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := r.ReadByte()
		if err != nil {
			return 0, errMalformedChunk
		}
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x, nil
		}
	}
	return 0, errMalformedChunk
}
