package bulk

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

// TestReadClaimedAllocatesAsBytesArrive: a request's header is read
// before the guard runs; a peer that claims 1 MiB and sends 10 bytes
// made the server allocate the megabyte (128 such connections: +136 MiB
// of heap). Now what is allocated follows what arrives; a claim sent
// whole, in pieces of any size, reads back exact.
func TestReadClaimedAllocatesAsBytesArrive(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 16 {
		if _, err := readClaimed(bytes.NewReader(make([]byte, 10)), MaxHeaderBytes); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("10 bytes of a 1 MiB claim: %v, want unexpected EOF", err)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16*2*(64<<10) {
		t.Fatalf("16 claims of %d bytes with 10 sent allocated %d bytes", MaxHeaderBytes, grew)
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), 200_000/16)
	for _, r := range []io.Reader{bytes.NewReader(want), iotest.OneByteReader(bytes.NewReader(want)), iotest.HalfReader(bytes.NewReader(want)), iotest.DataErrReader(bytes.NewReader(want))} {
		got, err := readClaimed(r, len(want))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%T: %d bytes, %v", r, len(got), err)
		}
	}
}
