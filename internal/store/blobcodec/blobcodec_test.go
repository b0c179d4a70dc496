package blobcodec

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
	if encoding.GetCodecV2(Name) == nil {
		t.Fatal("codec not registered")
	}
}

// The codec's bytes are exactly the proto encoding, so peers using the
// stock codec read them, and it reads theirs.
func TestChunkWireCompatible(t *testing.T) {
	c := codec{}
	for _, n := range []int{1, 5, 127, 128, 16383, 16384, 1 << 20} {
		data := pattern(n)
		for _, msg := range []proto.Message{
			&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: data}}},
			&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: data}}},
		} {
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
		}
		wire, _ := proto.Marshal(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: data}}})
		for _, piece := range []int{1, 3, 16384} {
			if piece < 16 && n > 1<<14 {
				continue // a million one-byte buffers only slows the race detector
			}
			var p Pulled
			if err := c.Unmarshal(split(wire, piece), &p); err != nil {
				t.Fatal(err)
			}
			if p.Header != nil || p.ChunkLen() != n {
				t.Fatalf("pulled %d bytes in pieces of %d: header %v, ChunkLen %d", n, piece, p.Header, p.ChunkLen())
			}
			var got []byte
			if err := p.WriteChunk(func(b []byte) error { got = append(got, b...); return nil }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("pulled %d bytes in pieces of %d: data differs", n, piece)
			}
			var push Pushed
			if err := c.Unmarshal(split(wire, piece), &push); err != nil {
				t.Fatal(err)
			}
			got = nil
			if err := push.WriteChunk(func(b []byte) error { got = append(got, b...); return nil }); err != nil || push.Header != nil {
				t.Fatal(err, push.Header)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("push chunk of %d bytes in pieces of %d: data differs", n, piece)
			}
		}
	}
}

func TestOtherMessagesUseProto(t *testing.T) {
	c := codec{}
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
	var p Pulled
	if err := c.Unmarshal(split(want, 2), &p); err != nil {
		t.Fatal(err)
	}
	if p.Header == nil || p.Header.Blob.Version != 3 || p.Header.Skipped != 2 || p.ChunkLen() != 0 {
		t.Fatalf("header decoded as %v", p.Header)
	}
	// Garbage is an error, not a panic or a silent empty message.
	if err := c.Unmarshal(split([]byte{0x12, 0x7f, 0x0a}, 1), &p); err == nil {
		t.Error("truncated message decoded without error")
	}
	if err := c.Unmarshal(split(nil, 1), &p); err == nil {
		t.Error("empty pull response decoded without error")
	}
}

// FuzzUnmarshal feeds arbitrary bytes, as a peer could send, to both
// decoders: they must return an error or a message, never panic, and a
// decoded chunk must hold exactly the bytes its prefix announced.
func FuzzUnmarshal(f *testing.F) {
	chunk, _ := proto.Marshal(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: pattern(40)}}})
	hdr, _ := proto.Marshal(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: &rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: "m"}}}})
	f.Add(chunk, 7)
	f.Add(hdr, 1)
	f.Add([]byte{0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 3)
	f.Add([]byte{}, 1)
	f.Fuzz(func(t *testing.T, b []byte, piece int) {
		piece = max(1, piece%64+1)
		c := codec{}
		var p Pulled
		if err := c.Unmarshal(split(b, piece), &p); err == nil {
			n := p.ChunkLen()
			got := 0
			if err := p.WriteChunk(func(v []byte) error { got += len(v); return nil }); err != nil || got != n {
				t.Fatalf("chunk of %d bytes wrote %d (%v)", n, got, err)
			}
		}
		var push Pushed
		if err := c.Unmarshal(split(b, piece), &push); err == nil {
			push.Release()
		}
		var stockReq rlhubv1.StorePushRequest
		_ = c.Unmarshal(split(b, piece), &stockReq)
	})
}
