package replica

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// frameWrites records each write a bulkServerStream makes on its socket.
type frameWrites struct{ writes [][]byte }

func (f *frameWrites) Write(bufs net.Buffers) error {
	var b []byte
	for _, p := range bufs {
		b = append(b, p...)
	}
	f.writes = append(f.writes, b)
	return nil
}

// TestBulkStreamWritesAUnitAtOnce: on the data plane a unit's frames
// (begin, each file's header and data, end) reach the socket in one
// write when the unit ends, in order and intact; a ping is written at
// once; a unit past flushBytes is written as its frames reach it.
func TestBulkStreamWritesAUnitAtOnce(t *testing.T) {
	w := &frameWrites{}
	bs := &bulkServerStream{w: w}
	data := bytes.Repeat([]byte{7}, chunkBytes)
	unit := []any{
		jsonFrame(kindBegin, begin{Unit: 3, Epoch: 1}),
		pathFrame(kindFile, "store/m/v1.safetensors", int64(len(data))),
		&dataOut{b: data},
		pathFrame(kindFile, "reducer/m/journal.log", 3),
		&dataOut{b: []byte("abc")},
		pathFrame(kindDelete, "reducer/m/old", 0),
		uvarintFrame(kindEnd, 3),
	}
	for i, m := range unit {
		if err := bs.SendMsg(m); err != nil {
			t.Fatal(err)
		}
		if i < len(unit)-1 && len(w.writes) != 0 {
			t.Fatalf("after frame %d of %d: %d writes, want none before the unit's end", i+1, len(unit), len(w.writes))
		}
	}
	if len(w.writes) != 1 {
		t.Fatalf("a unit took %d writes, want 1", len(w.writes))
	}
	// The write holds the frames as readFrame reads them.
	br := bufio.NewReader(bytes.NewReader(w.writes[0]))
	for i, m := range unit {
		got, err := readFrame(br, func(time.Time) error { return nil }, flushBytes, nil)
		if err != nil {
			t.Fatalf("frame %d: %v", i+1, err)
		}
		want := []byte(nil)
		switch v := m.(type) {
		case *wrapperspb.BytesValue:
			want = v.GetValue()
		case *dataOut:
			want = v.b
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, not the %d sent", i+1, len(got), len(want))
		}
	}
	if err := bs.SendMsg(&wrapperspb.BytesValue{Value: []byte{kindPing}}); err != nil || len(w.writes) != 2 {
		t.Fatalf("a ping: %d writes in all (%v), want it written at once", len(w.writes), err)
	}
	// A unit bigger than flushBytes: written as it grows past it.
	for range flushBytes/chunkBytes + 1 {
		if err := bs.SendMsg(&dataOut{b: data}); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.writes) != 3 {
		t.Fatalf("%d writes after %d MiB of frames, want one more than before", len(w.writes), flushBytes/chunkBytes+1)
	}
}
