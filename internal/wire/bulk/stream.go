package bulk

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
)

// Streams (the cluster's replication: internal/replica). A handler that
// admits a request may turn its connection into a stream of the method's
// own frames in both directions:
//
//	client: the request frame, as for any method (the Guard checks it)
//	server: u8 5 (stream)                            — the method's frames follow
//	     or u8 3 (final) | u32 length | google.rpc.Status  — refused; nothing follows
//	then, both ways, the method's own frames, until the handler ends;
//	server, after the handler's last frame: u8 3 (final) | u32 length | google.rpc.Status
//
// The method's frames must never begin with byte 3 on the server's side,
// so that the client tells the final status from them. The connection is
// closed after a stream: it never carries another request. A stream whose
// frames broke off (a write failed, the handler said Break) ends without
// a final status: the client's read of it fails.
const kindStream = 5

// Stream is the server's side of a streaming request, from
// Request.Stream. Only the handler's goroutines use it: one may read
// while another writes.
type Stream struct {
	r *Request
}

// Stream turns the request into a stream (see kindStream): it tells the
// client so and returns the connection's two directions. The handler
// owns reads' deadlines (Stream.SetReadDeadline); every write is bounded
// by the server's FrameTimeout. When the handler returns, its answer is
// sent as the final status (unless the stream broke) and the connection is
// closed. Call it at most once, before Body or Reply.
func (r *Request) Stream() (*Stream, error) {
	if r.continued || r.replied || r.stream != nil {
		return nil, errors.New("bulk: Stream after Body, Reply or Stream")
	}
	r.stream = &Stream{r: r}
	if err := r.conn.writeFrame([]byte{kindStream}); err != nil {
		r.broken = true
		return nil, fmt.Errorf("%w: bulk: open the stream: %v", errs.ErrUnavailable, err)
	}
	return r.stream, nil
}

// Read reads the client's bytes (what the server had buffered first).
func (s *Stream) Read(p []byte) (int, error) { return s.r.conn.br.Read(p) }

// Write writes bufs to the client in one writev, within the server's
// FrameTimeout. A failed write breaks the stream.
func (s *Stream) Write(bufs net.Buffers) error {
	c := s.r.conn
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.frame))
	if _, err := bufs.WriteTo(c.Conn); err != nil {
		s.r.broken = true
		return fmt.Errorf("%w: bulk: stream write: %v", errs.ErrUnavailable, err)
	}
	return nil
}

// SetReadDeadline bounds the reads that follow (a time in the past wakes
// a read in progress).
func (s *Stream) SetReadDeadline(t time.Time) error { return s.r.conn.SetReadDeadline(t) }

// Break says the stream's frames are out of step (a frame half written):
// no final status is sent after the handler returns.
func (s *Stream) Break() { s.r.broken = true }

// ClientStream is the client's side of a stream (Client.Stream). One
// goroutine may read while another writes; Close ends it.
type ClientStream struct {
	cc *clientConn
}

// Stream opens a stream: a new connection to addr (never a pooled one,
// never pooled after), the request with header, and the server's answer.
// It returns the stream when the server turned the request into one; the
// server's refusal as an error (errs.FromStatus, as Call); ErrNotSupported
// when addr does not speak the data plane. ctx bounds the opening only.
func (c *Client) Stream(ctx context.Context, addr, method string, header proto.Message) (*ClientStream, error) {
	hb, err := proto.Marshal(header)
	if err != nil {
		return nil, unsent(fmt.Errorf("%w: bulk: encode header: %v", errs.ErrInvalid, err))
	}
	if len(method) == 0 || len(method) > MaxMethodBytes || len(hb) > MaxHeaderBytes {
		return nil, unsent(fmt.Errorf("%w: bulk: method %q or its header of %d bytes", errs.ErrInvalid, method, len(hb)))
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, unsent(fmt.Errorf("%w: bulk: client is closed", errs.ErrUnavailable))
	}
	cc, err := c.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = cc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = cc.SetDeadline(time.Unix(1, 0)) })
	kind, err := openStream(cc, method, hb)
	if !stop() || err != nil {
		cc.Close()
		if cerr := ended(ctx); cerr != nil {
			return nil, errors.Join(cerr, err)
		}
		var st statusError
		if errors.As(err, &st) {
			return nil, grpcerr.FromStatus(status.ErrorProto(st.st))
		}
		return nil, fmt.Errorf("%w: bulk: %s to %s: %v", errs.ErrUnavailable, method, addr, err)
	}
	_ = cc.SetDeadline(time.Time{})
	if kind != kindStream {
		cc.Close()
		return nil, fmt.Errorf("%w: bulk: %s answered frame kind %d, want a stream (5)", errs.ErrUnavailable, method, kind)
	}
	return &ClientStream{cc: cc}, nil
}

// statusError is a final status read where a stream was expected.
type statusError struct{ st *spb.Status }

func (e statusError) Error() string { return e.st.GetMessage() }

// openStream sends the request and reads the first byte of the answer:
// kindStream, or the final status as a statusError.
func openStream(cc *clientConn, method string, header []byte) (byte, error) {
	frame := make([]byte, 0, 7+len(method)+len(header))
	frame = append(frame, kindRequest)
	frame = binary.LittleEndian.AppendUint16(frame, uint16(len(method)))
	frame = append(frame, method...)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(header)))
	frame = append(frame, header...)
	if _, err := cc.Write(frame); err != nil {
		return 0, err
	}
	kind, err := cc.br.ReadByte()
	if err != nil {
		return 0, err
	}
	if kind == kindFinal {
		st, err := readStatus(cc.br)
		if err != nil {
			return 0, err
		}
		if codes.Code(st.GetCode()) == codes.OK {
			return 0, errors.New("a final status OK where a stream was expected")
		}
		return 0, statusError{st}
	}
	return kind, nil
}

// readStatus reads a final status after its kind byte.
func readStatus(r io.Reader) (*spb.Status, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	sl := binary.LittleEndian.Uint32(n[:])
	if sl > maxStatusBytes {
		return nil, fmt.Errorf("status of %d bytes exceeds %d", sl, maxStatusBytes)
	}
	b, err := readClaimed(r, int(sl)) // allocated as it arrives: sl is the peer's claim
	if err != nil {
		return nil, err
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("decode status: %v", err)
	}
	return st, nil
}

// Reader is the stream's buffered reader of the server's bytes.
func (s *ClientStream) Reader() *bufio.Reader { return s.cc.br }

// Final reads the server's final status after its kind byte (the caller
// read KindFinal where the method's next frame was due) and returns it as
// an error (errs.FromStatus), or nil for OK.
func (s *ClientStream) Final() error {
	st, err := readStatus(s.cc.br)
	if err != nil {
		return fmt.Errorf("%w: bulk: stream's final status: %v", errs.ErrUnavailable, err)
	}
	if codes.Code(st.GetCode()) == codes.OK {
		return nil
	}
	return grpcerr.FromStatus(status.ErrorProto(st))
}

// KindFinal is the byte that begins the server's final status on a
// stream; the method's own frames never begin with it.
const KindFinal = kindFinal

// Write writes bufs to the server in one writev, within timeout.
func (s *ClientStream) Write(bufs net.Buffers, timeout time.Duration) error {
	_ = s.cc.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := bufs.WriteTo(s.cc.Conn); err != nil {
		return fmt.Errorf("%w: bulk: stream write: %v", errs.ErrUnavailable, err)
	}
	return nil
}

// SetReadDeadline bounds the reads that follow.
func (s *ClientStream) SetReadDeadline(t time.Time) error { return s.cc.SetReadDeadline(t) }

// Close closes the connection; safe to call twice.
func (s *ClientStream) Close() error { return s.cc.Close() }
