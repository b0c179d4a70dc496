package bulk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
)

// Responses with a body (pulls): before its final status a handler may
// send one data frame,
//
//	server: u8 4 (data) | u32 header length | header (protobuf) | u64 body length | body
//
// then the final status as usual. The client takes the data only when the
// final status that follows is OK: a connection that breaks anywhere
// before that (mid-body included) fails the call, so a truncated answer is
// never mistaken for a whole one.
const kindData = 4

// MaxDataHeaderBytes bounds a data frame's header message.
const MaxDataHeaderBytes = 1 << 20

// replyPiece is how much of a reply body is written per deadline: each
// piece must be taken by the client within Server.BodyIdleTimeout.
const replyPiece = 4 << 20

// Reply sends the request's data frame: header (the method's response
// header, protobuf-encoded) and then body, the concatenation of the
// slices, written from their memory (writev) without a copy. The slices
// may be reused once Reply returns. Call it at most once, after Body if the
// request has one (the whole body read). A client that stops reading for
// longer than the server's BodyIdleTimeout, or takes longer than
// BodyTimeout + the reply's length at BodyMinRate to read it all (the
// bound a request body has: a slow reader must not hold the version it
// reads, and its connection, for ever), fails the write; the error
// matches errs.ErrUnavailable and the connection is closed after the
// handler returns.
func (r *Request) Reply(header []byte, body ...[]byte) error {
	if r.replied {
		return errors.New("bulk: Reply called twice")
	}
	if r.stream != nil {
		return errors.New("bulk: Reply after Stream: a stream's handler writes its frames with Stream.Write")
	}
	if r.remaining > 0 {
		return errors.New("bulk: Reply before the request body was read")
	}
	if len(header) > MaxDataHeaderBytes {
		return fmt.Errorf("%w: bulk: reply header of %d bytes exceeds %d", errs.ErrInvalid, len(header), MaxDataHeaderBytes)
	}
	r.replied = true
	var total int64
	for _, b := range body {
		total += int64(len(b))
	}
	frame := make([]byte, 0, 13+len(header))
	frame = append(frame, kindData)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(header)))
	frame = append(frame, header...)
	frame = binary.LittleEndian.AppendUint64(frame, uint64(total))
	pending := append(net.Buffers{frame}, body...)
	due := r.conn.bodyDue(total)
	for len(pending) > 0 {
		// One piece of at most replyPiece bytes per deadline.
		var piece net.Buffers
		room := replyPiece
		for room > 0 && len(pending) > 0 {
			b := pending[0]
			if len(b) > room {
				piece = append(piece, b[:room])
				pending[0] = b[room:]
				room = 0
				break
			}
			piece = append(piece, b)
			room -= len(b)
			pending = pending[1:]
		}
		_ = r.conn.SetWriteDeadline(r.conn.pieceDeadline(due))
		if _, err := piece.WriteTo(r.conn.Conn); err != nil {
			r.broken = true
			if overdue(err, due) {
				r.notTaken = true
				return fmt.Errorf("%w: bulk: reply not taken within its deadline (%v plus 1 s per %d bytes)", errs.ErrUnavailable, r.conn.bodyTimeout, r.conn.bodyMinRate)
			}
			return fmt.Errorf("%w: bulk: reply: %v", errs.ErrUnavailable, err)
		}
	}
	_ = r.conn.SetWriteDeadline(time.Time{})
	return nil
}

// RecvFunc takes a data frame's body: header is the frame's header message
// (protobuf), body reads exactly n bytes straight from the socket. It
// reads all n bytes or returns an error; what it wrote must not be used
// by the caller until Call has returned nil (the final status may still
// fail, or the connection break).
type RecvFunc func(header []byte, n int64, body io.Reader) error

// readData reads a data frame after its kind byte and hands its body to
// recv. An error leaves the connection out of step.
func readData(cc *clientConn, recv RecvFunc) error {
	var n [8]byte
	if _, err := io.ReadFull(cc.br, n[:4]); err != nil {
		return err
	}
	hl := binary.LittleEndian.Uint32(n[:4])
	if hl > MaxDataHeaderBytes {
		return fmt.Errorf("data header of %d bytes exceeds %d", hl, MaxDataHeaderBytes)
	}
	hdr, err := readClaimed(cc.br, int(hl)) // allocated as it arrives: hl is the peer's claim
	if err != nil {
		return err
	}
	if _, err := io.ReadFull(cc.br, n[:]); err != nil {
		return err
	}
	bl := binary.LittleEndian.Uint64(n[:])
	if bl > 1<<62 {
		return fmt.Errorf("data body of %d bytes", bl)
	}
	if recv == nil {
		return errors.New("a data frame for a call that expects none")
	}
	lr := &io.LimitedReader{R: cc.br, N: int64(bl)}
	body := &eofStrict{lr: lr}
	if err := recv(hdr, int64(bl), body); err != nil {
		if body.err != nil { // the connection failed under the receiver
			return body.err
		}
		return recvError{err}
	}
	if lr.N != 0 {
		return fmt.Errorf("the receiver left %d of %d body bytes unread", lr.N, bl)
	}
	return nil
}

// eofStrict turns an end of the connection inside a body into
// io.ErrUnexpectedEOF, so a truncated body never reads as a short one.
// It records the connection's error.
type eofStrict struct {
	lr  *io.LimitedReader
	err error // the first read error other than the body's end
}

func (e *eofStrict) Read(p []byte) (int, error) {
	if e.lr.N <= 0 {
		return 0, io.EOF
	}
	n, err := e.lr.Read(p)
	if err == io.EOF && e.lr.N > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// recvError is a RecvFunc's own error: Call returns it as it is (the
// receiver refused the answer), not as a broken connection, though the
// connection is closed since the rest of the body was not read.
type recvError struct{ err error }

func (e recvError) Error() string { return e.err.Error() }
func (e recvError) Unwrap() error { return e.err }
