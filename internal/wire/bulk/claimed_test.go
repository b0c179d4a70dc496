package bulk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/rlhub/rlhub/internal/errs"
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

// hostileServer answers the data-plane handshake, reads one request frame
// and then runs answer on the raw connection: a server that misbehaves.
// Its goroutine is waited for at cleanup.
func hostileServer(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Go(func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		var hello [10]byte
		if _, err := io.ReadFull(br, hello[:]); err != nil {
			return
		}
		_, _ = io.CopyN(io.Discard, br, int64(binary.LittleEndian.Uint16(hello[8:])))
		_, _ = c.Write([]byte(Magic))
		var k [3]byte
		if _, err := io.ReadFull(br, k[:]); err != nil {
			return
		}
		_, _ = io.CopyN(io.Discard, br, int64(binary.LittleEndian.Uint16(k[1:])))
		var hl [4]byte
		_, _ = io.ReadFull(br, hl[:])
		_, _ = io.CopyN(io.Discard, br, int64(binary.LittleEndian.Uint32(hl[:])))
		answer(c)
	})
	return lis.Addr().String()
}

// A server's final status is read as it arrives, not allocated at its
// claimed length (4 MiB claimed, nothing sent: the call fails without
// holding 4 MiB), and its message reaches the caller's error bounded.
func TestClientBoundsWhatAServerClaimsAndSays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	claims := hostileServer(t, func(c net.Conn) {
		_, _ = c.Write([]byte{kindFinal, 0, 0, 0x40, 0}) // a 4 MiB status, and then nothing
		time.Sleep(200 * time.Millisecond)
	})
	cl := NewClient()
	defer cl.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := cl.Call(ctx, claims, "m", &emptypb.Empty{}, nil, nil)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a status claimed and never sent: no error")
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("a status that claimed 4 MiB and sent nothing cost %d bytes of allocation", d)
	}

	long := strings.Repeat("A", 3<<20)
	says := hostileServer(t, func(c net.Conn) {
		b, _ := proto.Marshal(status.New(codes.InvalidArgument, long).Proto())
		f := binary.LittleEndian.AppendUint32([]byte{kindFinal}, uint32(len(b)))
		_, _ = c.Write(append(f, b...))
	})
	err = cl.Call(ctx, says, "m", &emptypb.Empty{}, nil, nil)
	if !errors.Is(err, errs.ErrInvalid) || len(err.Error()) > 4<<10 {
		t.Fatalf("a 3 MiB status message: %d bytes of error text (%.80v)", len(err.Error()), err)
	}
}
