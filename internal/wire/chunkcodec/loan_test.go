package chunkcodec

import (
	"bytes"
	"testing"
	"unsafe"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func pull(data []byte) proto.Message {
	return &rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: data}}}
}

func within(b []byte, buf mem.Buffer) bool {
	d := buf.ReadOnlyData()
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(d))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= lo && p < lo+uintptr(len(b))
}

// TestLendReleasesWhenGRPCHasLetGo: bytes lent with Lend are released only
// once the sender is done and every buffer Marshal made over them is freed
// (as gRPC's writer frees them after framing), once; a small chunk is
// copied (gRPC does not report freeing those), and bytes no loan covers go
// out as they are, uncounted. The wire bytes are the proto encoding.
func TestLendReleasesWhenGRPCHasLetGo(t *testing.T) {
	c := encoding.GetCodecV2(Name)
	b := pattern(256 << 10)
	released := 0
	done := Lend(b, func() { released++ })

	big, err := c.Marshal(pull(b[1000 : 1000+(64<<10)]))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(pull(b[1000 : 1000+(64<<10)]))
	if !bytes.Equal(big.Materialize(), want) {
		t.Fatal("lent chunk: wire bytes differ from the proto encoding")
	}
	if !within(b, big[1]) {
		t.Fatal("a lent chunk was copied")
	}
	big2, _ := c.Marshal(pull(b[128<<10:]))
	small, _ := c.Marshal(pull(b[10:20:20])) // capped, as wire.ChunksOf cuts them
	if within(b, small[1]) {
		t.Fatal("a small lent chunk went out uncopied: gRPC would not report freeing it")
	}
	other := pattern(64 << 10)
	free, _ := c.Marshal(pull(other))
	if !within(other, free[1]) {
		t.Fatal("bytes no loan covers were copied")
	}

	done()
	if released != 0 {
		t.Fatal("released while gRPC still holds buffers over the loan")
	}
	big.Free()
	small.Free()
	free.Free()
	if released != 0 {
		t.Fatal("released while gRPC still holds one buffer over the loan")
	}
	big2.Free()
	if released != 1 {
		t.Fatalf("released %d times after every buffer was freed, want 1", released)
	}
	done()
	if released != 1 {
		t.Fatal("a second done released again")
	}

	// Nothing sent: done releases at once. An empty loan too.
	n := 0
	Lend(b, func() { n++ })()
	Lend(nil, func() { n++ })()
	if n != 2 {
		t.Fatalf("%d of 2 idle loans released", n)
	}
	loans.mu.RLock()
	left := len(loans.list)
	loans.mu.RUnlock()
	if left != 0 {
		t.Fatalf("%d loans still registered after done", left)
	}
}

// TestTwoLoansOfTheSameBytes: two streams lend the same bytes (two pulls of
// one version). A buffer Marshal makes for either may count on either
// loan, so a loan's release can wait for the other stream's buffers, never
// the reverse: neither is released while a buffer over the bytes is held
// and counted on it, and both are once every buffer is freed.
func TestTwoLoansOfTheSameBytes(t *testing.T) {
	c := encoding.GetCodecV2(Name)
	b := pattern(128 << 10)
	var ra, rb int
	doneA := Lend(b, func() { ra++ })
	doneB := Lend(b, func() { rb++ })
	buf, err := c.Marshal(pull(b[: 64<<10 : 64<<10])) // stream B's chunk
	if err != nil {
		t.Fatal(err)
	}
	doneB()
	doneA()
	if ra+rb != 1 {
		t.Fatalf("released %d + %d loans while a chunk over both is held; want exactly the one it is not counted on", ra, rb)
	}
	buf.Free()
	if ra != 1 || rb != 1 {
		t.Fatalf("released %d and %d times after every buffer was freed, want once each", ra, rb)
	}
}
