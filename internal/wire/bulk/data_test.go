package bulk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// serveData registers "data": header UInt64Value n; the reply is a data
// frame with header "h" and n pattern bytes in three slices.
func serveData(s *bulk.Server) {
	s.Handle("data", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
		n, err := announced(r)
		if err != nil {
			return nil, err
		}
		p := pattern(int(n))
		a, b := len(p)/3, 2*len(p)/3
		return wrapperspb.UInt64(n), r.Reply([]byte("h"), p[:a], p[a:b], p[b:])
	})
}

// A data frame's body reaches the receiver whole, straight into its
// buffer, over one reused connection; a receiver's own error is returned
// as it is and the next call still works.
func TestReplyDataRoundTrip(t *testing.T) {
	e := start(t, serveData)
	c := bulk.NewClient()
	defer c.Close()
	for _, n := range []uint64{0, 1, 5 << 20, 9<<20 + 3} {
		var got []byte
		var resp wrapperspb.UInt64Value
		err := c.CallRecv(ctx(t), e.addr, "data", wrapperspb.UInt64(n), nil, func(h []byte, size int64, body io.Reader) error {
			if string(h) != "h" || size != int64(n) {
				t.Errorf("header %q, size %d; want h, %d", h, size, n)
			}
			got = make([]byte, size)
			_, err := io.ReadFull(body, got)
			return err
		}, &resp)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !bytes.Equal(got, pattern(int(n))) || resp.GetValue() != n {
			t.Fatalf("n=%d: body differs (len %d) or response %d", n, len(got), resp.GetValue())
		}
	}
	refuse := errors.New("not this one")
	err := c.CallRecv(ctx(t), e.addr, "data", wrapperspb.UInt64(1<<20), nil, func([]byte, int64, io.Reader) error { return refuse }, nil)
	if !errors.Is(err, refuse) {
		t.Fatalf("receiver's error: got %v, want it returned as is", err)
	}
	var resp wrapperspb.UInt64Value
	if err := c.CallRecv(ctx(t), e.addr, "data", wrapperspb.UInt64(10), nil, func(_ []byte, n int64, body io.Reader) error {
		_, err := io.CopyN(io.Discard, body, n)
		return err
	}, &resp); err != nil || resp.GetValue() != 10 {
		t.Fatalf("after a refused answer: %v, %v", resp.GetValue(), err)
	}
	// A receiver that leaves bytes unread fails the call (it would be out
	// of step otherwise).
	err = c.CallRecv(ctx(t), e.addr, "data", wrapperspb.UInt64(100), nil, func([]byte, int64, io.Reader) error { return nil }, nil)
	if err == nil {
		t.Fatal("a receiver that read nothing of 100 bytes succeeded")
	}
}

// A server that hangs up inside a data frame's body (or before the final
// status that confirms it) fails the call with Unavailable: a truncated
// answer is never a short, successful one.
func TestTruncatedDataIsAnError(t *testing.T) {
	const n = 1 << 20
	for _, tc := range []struct {
		name string
		send int  // body bytes sent before hanging up
		fin  bool // whole body, then hang up before the final status
	}{{"mid-body", n / 2, false}, {"no-body", 0, false}, {"no-final", n, true}} {
		t.Run(tc.name, func(t *testing.T) {
			lis := testkit.Listen(t)
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				conn, err := lis.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				fakeServer(t, conn, n, tc.send)
			})
			c := bulk.NewClient()
			defer c.Close()
			var read int64
			err := c.CallRecv(ctx(t), lis.Addr().String(), "data", wrapperspb.UInt64(n), nil, func(_ []byte, size int64, body io.Reader) error {
				k, err := io.Copy(io.Discard, body)
				read = k
				if err == nil && k != size {
					return errors.New("short body read as whole")
				}
				return err
			}, nil)
			if !errors.Is(err, errs.ErrUnavailable) {
				t.Fatalf("got %v, want Unavailable", err)
			}
			if read > int64(tc.send) {
				t.Fatalf("read %d bytes, only %d were sent", read, tc.send)
			}
		})
	}
}

// fakeServer answers one request on conn with a data frame announcing n
// body bytes of which it sends send, then hangs up.
func fakeServer(t *testing.T, conn net.Conn, n, send int) {
	// The client's hello: the magic, then a u16-length token (none here).
	hello := make([]byte, len(bulk.Hello("")))
	if _, err := io.ReadFull(conn, hello); err != nil {
		return
	}
	if _, err := conn.Write([]byte(bulk.Magic)); err != nil {
		return
	}
	var hdr [3]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return
	}
	rest := make([]byte, int(binary.LittleEndian.Uint16(hdr[1:])))
	if _, err := io.ReadFull(conn, rest); err != nil {
		return
	}
	var hl [4]byte
	if _, err := io.ReadFull(conn, hl[:]); err != nil {
		return
	}
	if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint32(hl[:]))); err != nil {
		return
	}
	frame := []byte{4}
	frame = binary.LittleEndian.AppendUint32(frame, 1)
	frame = append(frame, 'h')
	frame = binary.LittleEndian.AppendUint64(frame, uint64(n))
	frame = append(frame, pattern(send)...)
	if _, err := conn.Write(frame); err != nil {
		t.Logf("fake server: %v", err)
	}
}
