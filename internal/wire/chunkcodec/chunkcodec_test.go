package chunkcodec

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// split cuts b into a BufferSlice of pieces of at most n bytes, as gRPC
// hands over a message received in several frames.
func split(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:k]))
		b = b[k:]
	}
	return s
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

func TestRegistered(t *testing.T) {
	for _, n := range append([]string{Name}, legacyNames...) {
		if encoding.GetCodecV2(n) == nil {
			t.Fatalf("codec %q not registered", n)
		}
	}
}

// chunkMessages are every chunk message rlhub sends, each holding data.
func chunkMessages(data []byte) []proto.Message {
	c := &rlhubv1.Chunk{Data: data}
	return []proto.Message{
		&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: c}},
		&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: c}},
		&rlhubv1.SyncServerMessage{Body: &rlhubv1.SyncServerMessage_Chunk{Chunk: c}},
		&rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Chunk{Chunk: c}},
		&rlhubv1.ReducerForwardRequest{Body: &rlhubv1.ReducerForwardRequest_Chunk{Chunk: c}},
	}
}

// unmarshalAs decodes wire into a Msg[M] and returns the chunk bytes held
// and whether it held a chunk (not a decoded message).
func unmarshalAs[M proto.Message](t *testing.T, wire mem.BufferSlice) ([]byte, bool) {
	t.Helper()
	var m Msg[M]
	if err := (codec{name: Name}).Unmarshal(wire, &m); err != nil {
		t.Fatal(err)
	}
	held := m.Held() && m.Msg.ProtoReflect() != nil && !m.Msg.ProtoReflect().IsValid()
	var got []byte
	if err := m.WriteChunk(func(b []byte) error { got = append(got, b...); return nil }); err != nil {
		t.Fatal(err)
	}
	return got, held
}

// unmarshalInto decodes wire into a Msg of msg's type.
func unmarshalInto(t *testing.T, msg proto.Message, wire mem.BufferSlice) ([]byte, bool) {
	t.Helper()
	switch msg.(type) {
	case *rlhubv1.StorePullResponse:
		return unmarshalAs[*rlhubv1.StorePullResponse](t, wire)
	case *rlhubv1.StorePushRequest:
		return unmarshalAs[*rlhubv1.StorePushRequest](t, wire)
	case *rlhubv1.SyncServerMessage:
		return unmarshalAs[*rlhubv1.SyncServerMessage](t, wire)
	case *rlhubv1.ReducerPushRequest:
		return unmarshalAs[*rlhubv1.ReducerPushRequest](t, wire)
	case *rlhubv1.ReducerForwardRequest:
		return unmarshalAs[*rlhubv1.ReducerForwardRequest](t, wire)
	}
	t.Fatalf("no case for %T", msg)
	return nil, false
}

// The codec's bytes are exactly the proto encoding, so peers using the
// stock codec read them, and it reads theirs.
func TestChunkWireCompatible(t *testing.T) {
	c := codec{name: Name}
	for _, n := range []int{1, 5, 127, 128, 16383, 16384, 1 << 20} {
		data := pattern(n)
		for _, msg := range chunkMessages(data) {
			want, _ := proto.Marshal(msg)
			got, err := c.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Materialize(), want) {
				t.Fatalf("%T of %d bytes: codec encoding differs from proto", msg, n)
			}
			if &got[1].ReadOnlyData()[0] != &data[0] {
				t.Errorf("%T of %d bytes: chunk data was copied", msg, n)
			}
			for _, piece := range []int{1, 3, 16384} {
				if piece < 16 && n > 1<<14 {
					continue // a million one-byte buffers only slows the race detector
				}
				b, held := unmarshalInto(t, msg, split(want, piece))
				if !held || !bytes.Equal(b, data) {
					t.Fatalf("%T of %d bytes in pieces of %d: held %v, data equal %v", msg, n, piece, held, bytes.Equal(b, data))
				}
			}
		}
	}
}

// A message with a chunk field and other fields set (or an aggregator
// message whose chunk is field 5) is not mistaken for a bare chunk.
func TestChunkFieldNumberAndOthers(t *testing.T) {
	d := (&rlhubv1.StorePullResponse{}).ProtoReflect().Descriptor()
	if fd := chunkField(d); fd == nil || fd.Number() != 2 {
		t.Fatalf("chunk field of %s: %v", d.FullName(), fd)
	}
	if fd := chunkField((&rlhubv1.BlobInfo{}).ProtoReflect().Descriptor()); fd != nil {
		t.Fatalf("BlobInfo has no chunk field, got %v", fd)
	}
	// Empty data: the stock encoding (no data field), decoded as a held empty chunk.
	c := codec{name: Name}
	empty := &rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Chunk{Chunk: &rlhubv1.Chunk{}}}
	b, err := c.Marshal(empty)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(empty)
	if !bytes.Equal(b.Materialize(), want) {
		t.Fatal("empty chunk encoding differs from proto")
	}
	var m Msg[*rlhubv1.ReducerPushRequest]
	if err := c.Unmarshal(split(want, 1), &m); err != nil || !m.Held() || m.ChunkLen() != 0 || m.Msg != nil {
		t.Fatalf("empty chunk: err %v held %v len %d msg %v", err, m.Held(), m.ChunkLen(), m.Msg)
	}
}

func TestOtherMessagesUseProto(t *testing.T) {
	c := codec{name: Name}
	hdr := &rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: &rlhubv1.StorePullHeader{
		Blob: &rlhubv1.BlobInfo{Model: "m", Version: 3, TotalBytes: 99}, Skipped: 2,
	}}}
	b, err := c.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(hdr)
	if !bytes.Equal(b.Materialize(), want) {
		t.Fatal("header encoding differs from proto")
	}
	var p Msg[*rlhubv1.StorePullResponse]
	if err := c.Unmarshal(split(want, 2), &p); err != nil {
		t.Fatal(err)
	}
	if h := p.Msg.GetHeader(); h == nil || h.Blob.Version != 3 || h.Skipped != 2 || p.Held() {
		t.Fatalf("header decoded as %v (held %v)", h, p.Held())
	}
	// Garbage is an error, not a panic or a silent empty message.
	if err := c.Unmarshal(split([]byte{0x12, 0x7f, 0x0a}, 1), &p); err == nil {
		t.Error("truncated message decoded without error")
	}
	// An empty message is a message with no body, never a chunk: the
	// callers refuse it (tested in the store, wsync and reducer packages).
	if err := c.Unmarshal(split(nil, 1), &p); err != nil || p.Held() || p.Msg == nil || p.Msg.GetBody() != nil {
		t.Errorf("empty pull response: err %v held %v msg %v", err, p.Held(), p.Msg)
	}
	// Receiver with the stock codec's decoding gives the same Msg.
	recv := Receiver[*rlhubv1.StorePullResponse](func(v any) error { return proto.Unmarshal(want, v.(proto.Message)) }, false)
	if err := recv(&p); err != nil || p.Msg.GetHeader().GetSkipped() != 2 {
		t.Fatalf("stock receive: %v %v", err, p.Msg)
	}
	chunk, _ := proto.Marshal(chunkMessages(pattern(9))[0])
	recv = Receiver[*rlhubv1.StorePullResponse](func(v any) error { return proto.Unmarshal(chunk, v.(proto.Message)) }, false)
	if err := recv(&p); err != nil || p.ChunkLen() != 9 || p.Msg != nil {
		t.Fatalf("stock receive of a chunk: %v len %d msg %v", err, p.ChunkLen(), p.Msg)
	}
	p.Release()
}

// FuzzUnmarshal feeds arbitrary bytes, as a peer could send, to the
// decoder: it must return an error or a message, never panic, and a
// decoded chunk must hold exactly the bytes its prefix announced.
func FuzzUnmarshal(f *testing.F) {
	chunk, _ := proto.Marshal(chunkMessages(pattern(40))[0])
	hdr, _ := proto.Marshal(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: &rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: "m"}}}})
	f.Add(chunk, 7)
	f.Add(hdr, 1)
	f.Add([]byte{0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 3)
	f.Add([]byte{}, 1)
	f.Fuzz(func(t *testing.T, b []byte, piece int) {
		piece = max(1, piece%64+1)
		c := codec{name: Name}
		var p Msg[*rlhubv1.StorePullResponse]
		if err := c.Unmarshal(split(b, piece), &p); err == nil {
			n := p.ChunkLen()
			got := 0
			if err := p.WriteChunk(func(v []byte) error { got += len(v); return nil }); err != nil || got != n {
				t.Fatalf("chunk of %d bytes wrote %d (%v)", n, got, err)
			}
		}
		var push Msg[*rlhubv1.ReducerPushRequest]
		if err := c.Unmarshal(split(b, piece), &push); err == nil {
			push.Release()
		}
		var stockReq rlhubv1.StorePushRequest
		_ = c.Unmarshal(split(b, piece), &stockReq)
	})
}

// A Msg reused across a stream's chunks allocates only gRPC's reader per
// chunk: WriteChunk keeps its scratch for the views of the frames.
func TestReusedMsgWriteChunkAllocs(t *testing.T) {
	data := pattern(1 << 20)
	wire, err := (codec{name: Name}).Marshal(chunkMessages(data)[0])
	if err != nil {
		t.Fatal(err)
	}
	frames := split(wire.Materialize(), 16<<10) // as gRPC receives 1 MiB
	var m Msg[*rlhubv1.StorePullResponse]
	defer m.Release()
	dst := make([]byte, len(data))
	recv := func() {
		if err := (codec{name: Name}).Unmarshal(frames, &m); err != nil || !m.Held() {
			t.Fatalf("unmarshal: %v (held %v)", err, m.Held())
		}
		n := 0
		if err := m.WriteChunk(func(b []byte) error { n += copy(dst[n:], b); return nil }); err != nil || n != len(data) {
			t.Fatalf("WriteChunk wrote %d bytes, err %v", n, err)
		}
	}
	recv()
	if !bytes.Equal(dst, data) {
		t.Fatal("chunk bytes differ")
	}
	if got := testing.AllocsPerRun(50, recv); got > 1 {
		t.Errorf("receive + WriteChunk of a 1 MiB chunk in 64 frames: %v allocations, want at most 1 (the mem.Reader)", got)
	}
}

func TestDirtyPool(t *testing.T) {
	p := newDirtyPool(4<<10, 16<<10)
	for _, tc := range []struct{ n, wantCap int }{
		{1, 4 << 10}, {4 << 10, 4 << 10}, {4<<10 + 1, 16 << 10}, {16 << 10, 16 << 10}, {16<<10 + 1, 16<<10 + 1},
	} {
		b := p.Get(tc.n)
		if len(*b) != tc.n || cap(*b) != tc.wantCap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(*b), cap(*b), tc.n, tc.wantCap)
		}
		p.Put(b)
	}
	// A buffer put back is handed out again, resized, without a copy or a
	// clear (sync.Pool may drop it, so retry a few times).
	reused := false
	for range 100 {
		b := p.Get(16 << 10)
		(*b)[0] = 42
		p.Put(b)
		if c := p.Get(5000); len(*c) == 5000 && &(*c)[0] == &(*b)[0] {
			reused = true
			if (*c)[0] != 42 {
				t.Fatalf("reused buffer was modified: first byte %d", (*c)[0])
			}
			break
		}
	}
	if !reused {
		t.Error("a 16 KiB buffer put back was never handed out again")
	}
	// Capacities the pool does not keep are dropped, not mixed into a tier.
	odd := make([]byte, 5000)
	p.Put(&odd)
	for range 10 {
		if b := p.Get(5000); cap(*b) != 16<<10 {
			t.Fatalf("Get(5000) returned cap %d, want a 16 KiB tier buffer", cap(*b))
		}
	}
}
