package replica

import (
	"bytes"
	"os"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A data frame over lent bytes keeps the loan until gRPC frees the
// buffers Marshal handed it, even once the replication is through with
// them; its bytes on the wire are a BytesValue's, and dataIn reads them
// back.
func TestDataFrameHoldsLentBytesUntilGRPCFreesThem(t *testing.T) {
	blob := bytes.Repeat([]byte{1, 2, 3, 4}, 1<<18) // 1 MiB
	for _, n := range []int{len(blob), 100} {       // 100: below gRPC's pooling threshold (copied)
		released := 0
		m := newMemFile(stamp{}, blob, func() { released++ })
		bs := (&dataOut{b: blob[len(blob)-n:], lent: m}).marshal()
		m.free()
		if n == len(blob) && released != 0 {
			t.Fatalf("%d bytes: the loan was returned while gRPC holds a buffer over it", n)
		}
		want, _ := proto.Marshal(&wrapperspb.BytesValue{Value: blob[len(blob)-n:]})
		if got := bs.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: frame on the wire differs from a BytesValue's encoding", n)
		}
		var d dataIn
		if err := d.unmarshal(bs); err != nil {
			t.Fatal(err)
		}
		if got := readBack(t, &d); !bytes.Equal(got, blob[len(blob)-n:]) {
			t.Fatalf("%d bytes: dataIn read back other bytes", n)
		}
		// As gRPC receives it: in 16 KiB buffers (HTTP/2 frames).
		var pieces mem.BufferSlice
		for off := 0; off < len(want); off += 16 << 10 {
			pieces = append(pieces, mem.SliceBuffer(want[off:min(off+16<<10, len(want))]))
		}
		var d2 dataIn
		if err := d2.unmarshal(pieces); err != nil {
			t.Fatal(err)
		}
		if got := readBack(t, &d2); !bytes.Equal(got, blob[len(blob)-n:]) {
			t.Fatalf("%d bytes in 16 KiB pieces: dataIn read back other bytes", n)
		}
		bs.Free()
		if released != 1 {
			t.Fatalf("%d bytes: loan returned %d times once gRPC freed its buffers, want 1", n, released)
		}
		m.free() // twice: nothing more
		if released != 1 {
			t.Fatalf("%d bytes: free twice returned the loan %d times", n, released)
		}
	}
}

// readBack writes what d holds to a file (as the follower does) and
// returns the file's content.
func readBack(t *testing.T, d *dataIn) []byte {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "data")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := d.writeTo(f); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// dataIn accepts exactly a BytesValue's encoding with a non-empty value,
// and reads back those bytes; anything else is refused.
func FuzzDataIn(f *testing.F) {
	for _, v := range [][]byte{{1}, bytes.Repeat([]byte{7}, 300)} {
		b, _ := proto.Marshal(&wrapperspb.BytesValue{Value: v})
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x05, 1})
	f.Add([]byte{0x12, 0x01, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d dataIn
		err := d.unmarshal(mem.BufferSlice{mem.SliceBuffer(b)})
		if err != nil {
			return
		}
		got := readBack(t, &d)
		var bv wrapperspb.BytesValue
		if err := proto.Unmarshal(b, &bv); err != nil || !bytes.Equal(bv.GetValue(), got) || len(got) == 0 {
			t.Fatalf("dataIn took %x as %x (proto: %x, %v)", b, got, bv.GetValue(), err)
		}
	})
}
