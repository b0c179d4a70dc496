package replica

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// The replication stream on the data plane (docs/wire.md, "Replication
// on the data plane"): the same frames as the gRPC stream (stream.go), on
// a bulk stream (internal/wire/bulk, Request.Stream) instead of HTTP/2, so
// that neither end runs gRPC's framing, flow control or writer goroutine
// for a unit's bytes. The follower asks for it first (method
// BulkFollowMethod, an empty header, the data plane's token and TLS) and
// uses the gRPC stream when the primary's data plane lacks the method or
// does not speak the data plane at all, or when told to
// (FollowerConfig.Transport).
//
// Every frame, both ways, is
//
//	u8 0x10 | u32 length (little-endian) | the frame's bytes
//
// the bytes being what the gRPC stream's BytesValue carries (a kind byte
// and its payload, or a data frame's raw bytes). The stream opens with the
// follower's hello as on gRPC. Besides those, a frame holding the one
// byte kindPing: the primary sends one after pingEvery with nothing else
// to send, and the follower answers each with one, so that both ends
// read under a deadline (streamIdle) while no unit is due. The primary's
// pings only between units (never where a data frame is due). Its
// last bytes are the bulk final status (byte 3: never a frame's first
// byte), which carries the stream's end as the gRPC status would.
//
// Bounds: a data frame holds 1..chunkBytes bytes and no more than its
// file still lacks; any other frame at most maxControlBytes. A frame cut
// short (the connection broke) fails the unit, which then changes nothing
// on the standby (its staging directory is removed, nothing installed).
const (
	// BulkFollowMethod is the data plane's method for the stream.
	BulkFollowMethod = "rlhub.v1.Replica/Follow"

	frameTag = 0x10
	kindPing = 'I'
)

// pingEvery and streamIdle: the primary pings a stream idle for
// pingEvery; either end fails the stream when it read nothing for
// streamIdle (the primary also counts bytes the follower took as a sign
// of life: a long unit carries no ack). Variables for tests.
var (
	pingEvery  = time.Second
	streamIdle = 10 * time.Second
)

// Transport is how a standby follows its primary (`serve
// --replica-transport`).
type Transport string

const (
	// TransportAuto (the default) uses the data plane, and the gRPC
	// stream when the primary's data plane lacks the method.
	TransportAuto Transport = "auto"
	// TransportGRPC uses the gRPC stream only.
	TransportGRPC Transport = "grpc"
)

// ParseTransport reads `--replica-transport`.
func ParseTransport(s string) (Transport, error) {
	switch Transport(s) {
	case "", TransportAuto:
		return TransportAuto, nil
	case TransportGRPC:
		return TransportGRPC, nil
	}
	return "", fmt.Errorf("%w: --replica-transport: want auto or grpc", errs.ErrInvalid)
}

// frameStream is one replication stream as the primary sends and reads
// it: a gRPC server stream, or a bulk one (bulkServerStream).
type frameStream interface {
	Context() context.Context
	SendMsg(m any) error
	RecvMsg(m any) error
}

// RegisterBulk answers BulkFollowMethod on the primary's data plane
// (hub.BulkService); the Guard (policy: admin) admits the caller first.
func (s *Source) RegisterBulk(b *bulk.Server) { b.Handle(BulkFollowMethod, s.bulkFollow) }

func (s *Source) bulkFollow(ctx context.Context, r *bulk.Request) (proto.Message, error) {
	st, err := r.Stream()
	if err != nil {
		return nil, err
	}
	bs := &bulkServerStream{ctx: ctx, st: st, br: bufio.NewReaderSize(st, 4096)}
	bs.progress.Store(time.Now().UnixNano())
	return nil, s.serve(bs, true, pingEvery)
}

// bulkServerStream is the primary's side of a stream on the data plane.
// One goroutine sends (ship), another receives (readAcks).
type bulkServerStream struct {
	ctx      context.Context
	st       *bulk.Stream
	br       *bufio.Reader
	progress atomic.Int64 // when a write last completed (UnixNano)
	aborted  atomic.Bool
}

func (b *bulkServerStream) Context() context.Context { return b.ctx }

// SendMsg writes a frame: a *wrapperspb.BytesValue's bytes, or a data
// frame's (*dataOut) from where they lie. Its bytes are not used after
// it returns.
func (b *bulkServerStream) SendMsg(m any) error {
	var body []byte
	switch v := m.(type) {
	case *wrapperspb.BytesValue:
		body = v.GetValue()
	case *dataOut:
		body = v.b
	default:
		return fmt.Errorf("replica: a %T on the data-plane stream", m)
	}
	if err := b.st.Write(net.Buffers{frameHead(len(body)), body}); err != nil {
		return err
	}
	if len(body) != 1 || body[0] != kindPing {
		// A ping fits in the socket's buffers of a follower that stopped
		// reading: only a unit's bytes count as the follower's progress
		// (a unit too big for the buffers fails its write instead).
		b.progress.Store(time.Now().UnixNano())
	}
	return nil
}

// RecvMsg reads the follower's next frame (not a ping) into a
// *wrapperspb.BytesValue. The follower must send a byte, or have taken
// some of the primary's, every streamIdle.
func (b *bulkServerStream) RecvMsg(m any) error {
	v, ok := m.(*wrapperspb.BytesValue)
	if !ok {
		return fmt.Errorf("replica: receive a %T on the data-plane stream", m)
	}
	for {
		body, err := readFrame(b.br, b.deadline, maxControlBytes, b.alive)
		if err != nil {
			return err
		}
		if len(body) == 1 && body[0] == kindPing {
			continue
		}
		v.Value = body
		return nil
	}
}

// alive reports whether a read that timed out may wait again: the
// follower took the primary's bytes within streamIdle.
func (b *bulkServerStream) alive() bool {
	return !b.aborted.Load() && time.Since(time.Unix(0, b.progress.Load())) < streamIdle
}

// deadline sets the read deadline, then fails once abort was called
// (abort sets its flag before its deadline: a read either sees the flag
// or is woken by the deadline).
func (b *bulkServerStream) deadline(t time.Time) error {
	_ = b.st.SetReadDeadline(t)
	if b.aborted.Load() {
		return errors.New("replica: stream ended")
	}
	return nil
}

// abort wakes and fails the read in progress (serve's end).
func (b *bulkServerStream) abort() {
	b.aborted.Store(true)
	_ = b.st.SetReadDeadline(time.Unix(1, 0))
}

func frameHead(n int) []byte {
	h := make([]byte, 5)
	h[0] = frameTag
	binary.LittleEndian.PutUint32(h[1:], uint32(n))
	return h
}

// errFinal is readFrame's error for the server's final status where a
// frame was due; the caller reads the status (ClientStream.Final).
var errFinal = errors.New("replica: the stream's final status")

// readFrame reads one frame of at most limit bytes. The first byte is
// awaited for streamIdle, again while again() says so (nil: never); the
// rest is due within streamIdle. A frame cut short is an error: nothing
// of it is returned.
func readFrame(br *bufio.Reader, deadline func(time.Time) error, limit int, again func() bool) ([]byte, error) {
	for {
		if err := deadline(time.Now().Add(streamIdle)); err != nil {
			return nil, fmt.Errorf("%w: %v", errs.ErrUnavailable, err)
		}
		if _, err := br.Peek(1); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && again != nil && again() {
				continue
			}
			return nil, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
		}
		break
	}
	tag, _ := br.ReadByte()
	if tag == bulk.KindFinal {
		return nil, errFinal
	}
	if tag != frameTag {
		return nil, errFrame
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return nil, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	l := binary.LittleEndian.Uint32(n[:])
	if l == 0 || int64(l) > int64(limit) {
		return nil, fmt.Errorf("%w: frame of %d bytes (1..%d)", errFrame, l, limit)
	}
	body := make([]byte, l)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	return body, nil
}

// unitStream is the follower's side of a stream, on either transport.
type unitStream interface {
	// recv returns the next frame that is not a data frame; never empty.
	recv() ([]byte, error)
	// recvData writes the next data frame, of at most left bytes, to out
	// and returns its length.
	recvData(out *os.File, left int64) (int64, error)
	// ack acknowledges unit u.
	ack(u uint64) error
	close()
}

// grpcUnits is the gRPC stream (with the replication codec).
type grpcUnits struct {
	cs interface {
		SendMsg(any) error
		RecvMsg(any) error
	}
	done func()
}

func (g grpcUnits) recv() ([]byte, error) {
	var m wrapperspb.BytesValue
	if err := g.cs.RecvMsg(&m); err != nil {
		return nil, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	if len(m.GetValue()) == 0 {
		return nil, errFrame
	}
	return m.GetValue(), nil
}

func (g grpcUnits) recvData(out *os.File, left int64) (int64, error) {
	var d dataIn
	if err := g.cs.RecvMsg(&d); err != nil {
		return 0, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	n := int64(d.len())
	if n > left { // the file's next bytes, no more than its size
		d.release()
		return 0, errFrame
	}
	if err := d.writeTo(out); err != nil {
		return 0, fmt.Errorf("replica: %w", err)
	}
	return n, nil
}

func (g grpcUnits) ack(u uint64) error {
	if err := g.cs.SendMsg(uvarintFrame(kindAck, u)); err != nil {
		return fmt.Errorf("%w: replica: ack: %v", errs.ErrUnavailable, err)
	}
	return nil
}

func (g grpcUnits) close() { g.done() }

// bulkUnits is the data-plane stream (one goroutine: the follower's).
type bulkUnits struct {
	ctx  context.Context // Follow's: its end ends the stream
	cs   *bulk.ClientStream
	buf  []byte // a data frame's bytes, reused (at most chunkBytes)
	stop func() bool
}

// openBulk opens the stream to addr and sends the hello; ctx bounds the
// opening, and its end closes the stream later.
func openBulk(ctx context.Context, c *bulk.Client, addr string, h hello) (*bulkUnits, error) {
	cs, err := c.Stream(ctx, addr, BulkFollowMethod, &emptypb.Empty{})
	if err != nil {
		return nil, err
	}
	u := &bulkUnits{ctx: ctx, cs: cs}
	u.stop = context.AfterFunc(ctx, func() { _ = cs.SetReadDeadline(time.Unix(1, 0)) })
	if err := u.send(jsonFrame(kindHello, h).GetValue()); err != nil {
		u.close()
		return nil, fmt.Errorf("%w: replica: hello: %v", errs.ErrUnavailable, err)
	}
	return u, nil
}

// fallBack reports whether a data-plane stream's opening failed so that
// the gRPC stream should be used: the primary does not speak the data
// plane, or its data plane lacks the method.
func fallBack(err error) bool {
	return errors.Is(err, bulk.ErrNotSupported) || grpcerr.Code(err) == codes.Unimplemented
}

// deadline sets the read deadline, then fails once ctx has ended (its
// AfterFunc sets a deadline in the past only after ctx.Err is set: a read
// either sees the error or is woken).
func (u *bulkUnits) deadline(t time.Time) error {
	_ = u.cs.SetReadDeadline(t)
	return u.ctx.Err()
}

func (u *bulkUnits) send(b []byte) error {
	return u.cs.Write(net.Buffers{frameHead(len(b)), b}, streamIdle)
}

// next reads the next frame of at most limit bytes, answering pings.
func (u *bulkUnits) next(limit int) ([]byte, error) {
	for {
		b, err := readFrame(u.cs.Reader(), u.deadline, limit, nil)
		if errors.Is(err, errFinal) {
			if err := u.cs.Final(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: replica: the primary ended the stream", errs.ErrUnavailable)
		}
		if err != nil {
			return nil, err
		}
		if len(b) == 1 && b[0] == kindPing {
			if err := u.send(b); err != nil {
				return nil, err
			}
			continue
		}
		return b, nil
	}
}

func (u *bulkUnits) recv() ([]byte, error) { return u.next(maxControlBytes) }

func (u *bulkUnits) recvData(out *os.File, left int64) (int64, error) {
	n, err := readData(u.cs.Reader(), u.deadline, out, left, &u.buf)
	if errors.Is(err, errFinal) {
		if err := u.cs.Final(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: replica: the primary ended the stream mid-file", errs.ErrUnavailable)
	}
	return n, err
}

// readData reads one data frame of 1..min(left, chunkBytes) bytes whole
// into *buf (made at chunkBytes when nil) and only then writes it to out:
// a frame cut short writes nothing. The primary pings only between units,
// so a frame here is data. The server's final status is errFinal.
func readData(br *bufio.Reader, deadline func(time.Time) error, out *os.File, left int64, buf *[]byte) (int64, error) {
	if err := deadline(time.Now().Add(streamIdle)); err != nil {
		return 0, fmt.Errorf("%w: %v", errs.ErrUnavailable, err)
	}
	tag, err := br.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	if tag == bulk.KindFinal {
		return 0, errFinal
	}
	if tag != frameTag {
		return 0, errFrame
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return 0, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	l := int64(binary.LittleEndian.Uint32(n[:]))
	if l == 0 || l > chunkBytes || l > left {
		return 0, fmt.Errorf("%w: data frame of %d bytes (1..%d, %d left)", errFrame, l, chunkBytes, left)
	}
	if *buf == nil {
		*buf = make([]byte, chunkBytes)
	}
	b := (*buf)[:l]
	if _, err := io.ReadFull(br, b); err != nil {
		return 0, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
	}
	if _, err := out.Write(b); err != nil {
		return 0, fmt.Errorf("replica: %w", err)
	}
	return l, nil
}

func (u *bulkUnits) ack(n uint64) error {
	if err := u.send(uvarintFrame(kindAck, n).GetValue()); err != nil {
		return fmt.Errorf("%w: replica: ack: %v", errs.ErrUnavailable, err)
	}
	return nil
}

func (u *bulkUnits) close() {
	u.stop()
	u.cs.Close()
}
