// Package chunkcodec is the one gRPC codec that moves rlhub's chunk
// messages without the copies the stock proto codec makes. A chunk message
// is any message with a field of type rlhub.v1.Chunk (`bytes data = 1`)
// that is the only field set: the store's pull and push streams, the weight
// sync push stream, the reducer's push and forward streams, the
// aggregator's batch chunks. Every other message goes through the stock
// proto codec unchanged, and the bytes on the wire are exactly the proto
// encoding, so a peer that does not ask for the codec (the Python client)
// gets the stock codec and reads and writes the same bytes.
//
// To use it:
//  1. Call with grpc.CallContentSubtype(chunkcodec.Name) (a server answers
//     with the codec its client asked for; Requested tells a server which).
//  2. Send chunk messages as usual. Marshal hands the chunk's bytes to the
//     transport behind a few bytes of protobuf prefix, so the only copy
//     before the socket is gRPC's into its write buffer. That copy can
//     happen after SendMsg returns: the sender must not change those bytes
//     until the call is over (a client stream's response received), or
//     must lend them (Lend), which tells it when gRPC has let go.
//  3. Receive into a *Msg[M] (M the generated message pointer type), for
//     example through Receiver. A chunk stays in gRPC's buffers until
//     WriteChunk passes it, once, to its destination; any other message is
//     decoded into Msg.Msg. Release (or WriteChunk) before dropping a Msg.
package chunkcodec

import (
	"context"
	"errors"
	"strings"
	"sync"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Name is the codec's content-subtype.
const Name = "rlhub-chunk"

// legacyNames are the content-subtypes of the two codecs this one replaced
// (the store's "rlhub-blob" and weight sync's "rlhub-sync"); the same codec
// answers to them so peers built before the merge keep their fast path.
var legacyNames = []string{"rlhub-blob", "rlhub-sync"}

func init() {
	for _, n := range append([]string{Name}, legacyNames...) {
		encoding.RegisterCodecV2(codec{name: n})
	}
}

type codec struct{ name string }

func (c codec) Name() string { return c.name }

func stock() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

// Requested reports whether the incoming call in ctx (a server stream's
// context) asked for this codec under any of its names.
func Requested(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return false
	}
	for _, ct := range md.Get("content-type") {
		ct = strings.ToLower(ct)
		for _, n := range append([]string{Name}, legacyNames...) {
			if strings.HasSuffix(ct, "+"+n) {
				return true
			}
		}
	}
	return false
}

// dataField is Chunk's `bytes data = 1`.
const dataField = 1

var chunkName = (*rlhubv1.Chunk)(nil).ProtoReflect().Descriptor().FullName()

// chunkFields caches, per message descriptor, its singular rlhub.v1.Chunk
// field (nil when it has none).
var chunkFields sync.Map // protoreflect.FullName → protoreflect.FieldDescriptor (or nil)

func chunkField(d protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	if v, ok := chunkFields.Load(d.FullName()); ok {
		fd, _ := v.(protoreflect.FieldDescriptor)
		return fd
	}
	var found protoreflect.FieldDescriptor
	fs := d.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if fd.Kind() == protoreflect.MessageKind && fd.Cardinality() != protoreflect.Repeated && fd.Message().FullName() == chunkName {
			found = fd
			break
		}
	}
	chunkFields.Store(d.FullName(), found)
	return found
}

// onlyChunk returns the chunk data of m when m's only populated field is
// its Chunk field and the chunk carries nothing but data.
func onlyChunk(m proto.Message) (data []byte, ok bool) {
	rm := m.ProtoReflect()
	if !rm.IsValid() {
		return nil, false
	}
	fd := chunkField(rm.Descriptor())
	if fd == nil || !rm.Has(fd) || len(rm.GetUnknown()) != 0 {
		return nil, false
	}
	others := false
	rm.Range(func(f protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		others = f.Number() != fd.Number()
		return !others
	})
	if others {
		return nil, false
	}
	c, isChunk := rm.Get(fd).Message().Interface().(*rlhubv1.Chunk)
	if !isChunk || len(c.ProtoReflect().GetUnknown()) != 0 {
		return nil, false
	}
	return c.GetData(), true
}

// prefix returns the protobuf bytes that precede n data bytes in a message
// whose only field (number field) is chunk{data}.
func prefix(field protowire.Number, n int) []byte {
	inner := protowire.SizeTag(dataField) + protowire.SizeVarint(uint64(n)) + n
	b := make([]byte, 0, 16)
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, dataField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	return b
}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(proto.Message); ok {
		// An empty chunk takes the stock path: proto3 omits empty bytes.
		if data, ok := onlyChunk(m); ok && len(data) > 0 {
			field := chunkField(m.ProtoReflect().Descriptor()).Number()
			// gRPC may still hold data after SendMsg returns (until its
			// writer has framed it): the sender keeps data unchanged until
			// the stream is done, or lends it (Lend) to learn when gRPC
			// has let go.
			return mem.BufferSlice{mem.SliceBuffer(prefix(field, len(data))), lentBuffer(data)}, nil
		}
	}
	return stock().Marshal(v)
}

// receiver is implemented by *Msg[M].
type receiver interface{ receive(mem.BufferSlice) error }

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(receiver); ok {
		return r.receive(data)
	}
	return stock().Unmarshal(data, v)
}

// Chunk holds a received chunk's bytes in gRPC's buffers, without a copy.
// The zero value holds nothing.
type Chunk struct {
	r     *mem.Reader // holds references to the received buffers
	views [][]byte    // WriteChunk's scratch, kept so a reused Msg does not allocate it per chunk
}

// Held reports whether a chunk (possibly empty) is held.
func (c *Chunk) Held() bool { return c.r != nil }

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
	views, err := c.r.Peek(c.r.Remaining(), c.views[:0])
	if err != nil {
		return err
	}
	c.views = views
	defer clear(views) // drop the views of buffers Release frees
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

// Msg is one received message of type M (a generated message pointer
// type): either a chunk held in gRPC's buffers (Held, with Msg nil) or any
// other message, decoded into Msg.
type Msg[M proto.Message] struct {
	Msg M
	Chunk
}

// Reset releases what m holds and clears it.
func (m *Msg[M]) Reset() {
	m.Release()
	var zero M
	m.Msg = zero
}

// Set makes m hold msg, a message decoded by another codec: its chunk
// bytes when it is a chunk message, else msg itself.
func (m *Msg[M]) Set(msg M) {
	m.Reset()
	if data, ok := onlyChunk(msg); ok {
		m.hold(data)
		return
	}
	m.Msg = msg
}

func newMsg[M proto.Message]() M {
	var zero M
	return zero.ProtoReflect().Type().New().Interface().(M)
}

var errMalformed = errors.New("chunkcodec: malformed chunk message")

func (m *Msg[M]) receive(data mem.BufferSlice) error {
	m.Reset()
	var zero M
	if fd := chunkField(zero.ProtoReflect().Descriptor()); fd != nil {
		if r := chunkView(data, fd.Number()); r != nil {
			m.r = r
			return nil
		}
	}
	msg := newMsg[M]()
	if err := stock().Unmarshal(data, msg); err != nil {
		return err
	}
	// An unusual but valid encoding of a chunk keeps its decoded bytes.
	m.Set(msg)
	return nil
}

// Receiver returns how to receive one message of a stream into a Msg:
// straight through the codec when zeroCopy (the call uses it), else
// decoded by the stream's codec into a new M and Set.
func Receiver[M proto.Message](recvMsg func(any) error, zeroCopy bool) func(*Msg[M]) error {
	if zeroCopy {
		return func(m *Msg[M]) error { return recvMsg(m) }
	}
	return func(m *Msg[M]) error {
		msg := newMsg[M]()
		if err := recvMsg(msg); err != nil {
			m.Reset()
			return err
		}
		m.Set(msg)
		return nil
	}
}

// chunkView checks that data is exactly field{data: ...} and returns a
// reader positioned at the data bytes, or nil when it is some other message
// (the caller then decodes it with the stock codec).
func chunkView(data mem.BufferSlice, field protowire.Number) *mem.Reader {
	r := data.Reader()
	for _, want := range []protowire.Number{field, dataField} {
		num, n, err := tagLen(r)
		if err != nil || num != want || n != uint64(r.Remaining()) {
			r.Close()
			return nil
		}
	}
	return r
}

// tagLen reads one length-delimited field's tag and length from r.
func tagLen(r *mem.Reader) (protowire.Number, uint64, error) {
	tag, err := varint(r)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(tag)
	if typ != protowire.BytesType {
		return num, 0, errMalformed
	}
	n, err := varint(r)
	return num, n, err
}

func varint(r *mem.Reader) (uint64, error) {
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
