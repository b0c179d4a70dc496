package bulk

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/netsec"
)

// ErrNotSupported is returned by Client.Call when the server at an address
// does not speak the data plane (it did not answer Magic); the caller uses
// gRPC instead. The client remembers it for NotSupportedFor.
var ErrNotSupported = errors.New("bulk: the server does not speak the data plane")

// ErrNothingSent matches (errors.Is) every error of Call, CallRecv and
// Stream returned before the first byte of the request (its method,
// header or body) went onto a connection: a connect that failed or got no
// answer, a TLS handshake that failed, a data-plane hello the server
// reset, closed, refused (its token) or left unanswered (NoAnswerError),
// ErrNotSupported, the call's context ending in any of these, a closed
// client, a request refused as invalid before it was sent. The server
// then certainly did not serve the request, so a caller may send it
// elsewhere without risking it twice (a gradient push is not "outcome
// unknown"). An error after the request started does not match — also
// one on a new connection after the request went out on an idle one whose
// server had closed it — whatever it says. The error keeps matching what
// it matched without the mark (errs.ErrUnavailable, NoAnswerError, a
// refusal's sentinel, context errors).
var ErrNothingSent = errors.New("bulk: nothing of the request was sent")

// nothingSent is err marked ErrNothingSent; its text is err's.
type nothingSent struct{ err error }

func (e nothingSent) Error() string        { return e.err.Error() }
func (e nothingSent) Unwrap() error        { return e.err }
func (e nothingSent) Is(target error) bool { return target == ErrNothingSent }

// unsent marks err (nil stays nil) as failing before anything was sent.
func unsent(err error) error {
	if err == nil {
		return nil
	}
	return nothingSent{err}
}

// NotSupportedFor is how long a client keeps using gRPC for an address
// that did not speak the data plane before it tries again.
const NotSupportedFor = time.Minute

// maxIdlePerAddr bounds the idle connections a client keeps per address.
const maxIdlePerAddr = 8

// Client makes data-plane calls, keeping idle connections per address for
// reuse (one call at a time on a connection). Safe for concurrent use.
type Client struct {
	dialer net.Dialer
	cfg    ClientConfig

	mu     sync.Mutex // guards the fields below
	idle   map[string][]*clientConn
	noBulk map[string]time.Time
	closed bool
}

// ClientConfig is how a client connects; the zero value is plaintext with
// no token. internal/dial builds it from the one connection Config.
type ClientConfig struct {
	// TLS, when set, makes every connection TLS with ALPN (its NextProtos
	// are replaced; an empty ServerName means the dialed host).
	TLS *tls.Config
	// Token is sent in every connection's handshake ("" sends none).
	// Without TLS, a connection to an address that is not loopback is
	// refused before it is dialled (netsec.PlaintextToken).
	Token string
	// HandshakeTimeout bounds the wait for the server's answer to a new
	// connection's hello (and for its TLS handshake), within the call's
	// context; 0 or negative means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// handshakeTimeout is cfg's HandshakeTimeout, or the default.
func (cfg ClientConfig) handshakeTimeout() time.Duration {
	if cfg.HandshakeTimeout <= 0 {
		return DefaultHandshakeTimeout
	}
	return cfg.HandshakeTimeout
}

// NoAnswerError is a connect or handshake to Addr that got no answer
// within its bound (Bound) while the call's context still had time: the
// address takes no connection, or sends nothing on it (a hub that is
// stopped or wedged, a dead machine, a listener that is not a hub's). It
// matches errs.ErrUnavailable, as any failure to reach the server; a
// caller that retries tries such an address again only once (Unanswered),
// since a server silent for that long does not start answering on a later
// try. The client returns it marked ErrNothingSent, except after the
// request went out on an idle connection first (CallRecv).
type NoAnswerError struct {
	// Addr is the address dialled.
	Addr string
	// Op is what got no answer: "dial", "TLS handshake" or "handshake".
	Op string
	// Bound is the timeout that ran out (the connect or handshake
	// timeout).
	Bound time.Duration
	// Detail says what the server sent, if anything, and the error.
	Detail string
}

func (e *NoAnswerError) Error() string {
	with := " with"
	if e.Op == "dial" {
		with = ""
	}
	return fmt.Sprintf("bulk: %s%s %s: no answer within %v: %s", e.Op, with, e.Addr, e.Bound, e.Detail)
}

// Is reports whether target is errs.ErrUnavailable.
func (e *NoAnswerError) Is(target error) bool { return target == errs.ErrUnavailable }

// NoAnswerTries is how many connects or handshakes to one address may go
// unanswered (NoAnswerError, each a whole connect or handshake timeout)
// in one call that retries (storerpc's calls, a reducer push) before it
// stops trying that address. A server that sent nothing for that long is
// stopped, wedged or not a hub: it does not start answering on a later
// try, and the retries (for a hub restarting or a connection that broke,
// which fail at once) spent the call's whole timeout on it, 10 s a try,
// to end Unavailable all the same. One more try covers a server that was
// only briefly stalled.
const NoAnswerTries = 2

// Unanswered counts one retrying call's NoAnswerErrors by address; the
// zero value is ready. Not safe for concurrent use (one per call).
type Unanswered struct {
	n map[string]int
}

// GiveUp records err if it is (or wraps) a NoAnswerError; at the
// NoAnswerTries-th for the same address it returns err saying the address
// is not tried again (still a NoAnswerError, errs.ErrUnavailable), which
// the call returns instead of retrying. Otherwise it returns nil.
func (u *Unanswered) GiveUp(err error) error {
	var na *NoAnswerError
	if !errors.As(err, &na) {
		return nil
	}
	if u.n == nil {
		u.n = map[string]int{}
	}
	u.n[na.Addr]++
	if n := u.n[na.Addr]; n >= NoAnswerTries {
		return fmt.Errorf("%w (%d times in this call: not tried again)", err, n)
	}
	return nil
}

// timedOut reports whether err is a socket's or a connect's timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// NewClient returns a plaintext client with no token and no connections
// yet.
func NewClient() *Client { return NewClientConfig(ClientConfig{}) }

// NewClientConfig returns a client that connects as cfg says.
func NewClientConfig(cfg ClientConfig) *Client {
	d := net.Dialer{Timeout: connectTimeout, KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepIdle, Interval: keepInterval, Count: keepCount},
		Control: setUserTimeout}
	return &Client{cfg: cfg, dialer: d, idle: map[string][]*clientConn{}, noBulk: map[string]time.Time{}}
}

type clientConn struct {
	net.Conn
	br *bufio.Reader
}

// Supported reports whether addr is worth trying: false for NotSupportedFor
// after it failed to answer Magic.
func (c *Client) Supported(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.noBulk[addr]
	return !ok || time.Since(at) > NotSupportedFor
}

// Call sends one request: header (the method's header message), then, if
// the server asks for it, body (written with writev straight from the
// slices' memory, which must not change until Call returns). On success
// the server's response message is unmarshalled into resp.
//
// Errors: the server's answer as an errs sentinel (errs.FromStatus, as a
// gRPC call would return it); ErrNotSupported when addr does not speak
// the data plane; ctx's error when it ended first; otherwise a broken
// connection, which matches errs.ErrUnavailable (the request may or may
// not have been served). Any of these that came before the request was
// written also matches ErrNothingSent (not served).
func (c *Client) Call(ctx context.Context, addr, method string, header proto.Message, body net.Buffers, resp proto.Message) error {
	return c.CallRecv(ctx, addr, method, header, body, nil, resp)
}

// CallRecv is Call for a method whose answer may carry a data frame
// (data.go): recv takes its body straight from the socket. recv runs at
// most once per call; a call whose final status is not OK, or whose
// connection breaks after recv ran, returns an error, and what recv wrote
// is then not a valid answer.
func (c *Client) CallRecv(ctx context.Context, addr, method string, header proto.Message, body net.Buffers, recv RecvFunc, resp proto.Message) error {
	if len(method) == 0 || len(method) > MaxMethodBytes {
		return unsent(fmt.Errorf("%w: bulk: method name %q", errs.ErrInvalid, method))
	}
	hb, err := proto.Marshal(header)
	if err != nil {
		return unsent(fmt.Errorf("%w: bulk: encode header: %v", errs.ErrInvalid, err))
	}
	if len(hb) > MaxHeaderBytes {
		return unsent(fmt.Errorf("%w: bulk: header of %d bytes exceeds %d", errs.ErrInvalid, len(hb), MaxHeaderBytes))
	}
	var st *spb.Status
	for fresh := false; ; fresh = true {
		cc, reused, err := c.get(ctx, addr, fresh)
		if err != nil {
			if ns := (nothingSent{}); fresh && errors.As(err, &ns) {
				// The request went out on an idle connection first, and
				// its server may have read it before it closed: whatever
				// this connection's failure, something may have been sent.
				return fmt.Errorf("%w (after %s went out on an idle connection that broke)", ns.err, method)
			}
			return err
		}
		// The context's deadline and cancellation reach the connection as
		// a deadline in the past, which fails the read or write in progress.
		if dl, ok := ctx.Deadline(); ok {
			_ = cc.SetDeadline(dl)
		}
		stop := context.AfterFunc(ctx, func() { _ = cc.SetDeadline(time.Unix(1, 0)) })
		var answered bool
		st, answered, err = exchange(cc, method, hb, body, recv)
		if stopped := stop(); err == nil && stopped {
			_ = cc.SetDeadline(time.Time{})
			c.put(addr, cc)
			break
		}
		cc.Close()
		if cerr := ended(ctx); cerr != nil {
			return errors.Join(cerr, err)
		}
		if re := (recvError{}); errors.As(err, &re) {
			return re.err
		}
		if reused && !answered {
			// An idle connection the server has since closed (it restarted,
			// or shut idle ones down): nothing was served, try a new one.
			continue
		}
		return fmt.Errorf("%w: bulk: %s to %s: %v", errs.ErrUnavailable, method, addr, err)
	}
	if codes.Code(st.GetCode()) != codes.OK {
		return grpcerr.FromStatus(status.ErrorProto(st))
	}
	if resp != nil {
		if len(st.GetDetails()) == 0 {
			return fmt.Errorf("bulk: %s answered OK without a response", method)
		}
		d := st.GetDetails()[0]
		if !d.MessageIs(resp) {
			// UnmarshalTo's error would quote the peer's type name whole.
			return fmt.Errorf("bulk: %s answered with a %s", method, errs.Quote(d.GetTypeUrl()))
		}
		if err := d.UnmarshalTo(resp); err != nil {
			return fmt.Errorf("bulk: %s response: %w", method, err)
		}
	}
	return nil
}

// exchange runs one request on cc and returns the final status, or an
// error when the connection broke (cc is then out of step); answered
// reports whether the server sent anything for this request.
func exchange(cc *clientConn, method string, header []byte, body net.Buffers, recv RecvFunc) (st *spb.Status, answered bool, err error) {
	frame := make([]byte, 0, 7+len(method)+len(header))
	frame = append(frame, kindRequest)
	frame = binary.LittleEndian.AppendUint16(frame, uint16(len(method)))
	frame = append(frame, method...)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(header)))
	frame = append(frame, header...)
	if _, err := cc.Write(frame); err != nil {
		return nil, answered, err
	}
	kind, err := cc.br.ReadByte()
	if err != nil {
		return nil, answered, err
	}
	answered = true
	if kind == kindContinue {
		bufs := append(net.Buffers(nil), body...) // WriteTo consumes its receiver
		if _, err := bufs.WriteTo(cc.Conn); err != nil {
			return nil, answered, err
		}
		if kind, err = cc.br.ReadByte(); err != nil {
			return nil, answered, err
		}
	}
	if kind == kindData {
		if err := readData(cc, recv); err != nil {
			return nil, answered, err
		}
		if kind, err = cc.br.ReadByte(); err != nil {
			return nil, answered, err
		}
	}
	if kind != kindFinal {
		return nil, answered, fmt.Errorf("frame kind %d, want a final status (3)", kind)
	}
	st, err = readStatus(cc.br)
	return st, answered, err
}

// get returns an idle connection to addr (reused), unless fresh, or dials
// one.
func (c *Client) get(ctx context.Context, addr string, fresh bool) (cc *clientConn, reused bool, err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, unsent(fmt.Errorf("%w: bulk: client is closed", errs.ErrUnavailable))
	}
	if l := c.idle[addr]; len(l) > 0 && !fresh {
		cc := l[len(l)-1]
		c.idle[addr] = l[:len(l)-1]
		c.mu.Unlock()
		return cc, true, nil
	}
	c.mu.Unlock()
	cc, err = c.dial(ctx, addr)
	return cc, false, err
}

// dial opens a connection to addr and exchanges Magic; its errors are
// marked ErrNothingSent (no request is written before it returns).
func (c *Client) dial(ctx context.Context, addr string) (*clientConn, error) {
	cc, err := c.connect(ctx, addr)
	return cc, unsent(err)
}

// connect is dial without the mark.
func (c *Client) connect(ctx context.Context, addr string) (*clientConn, error) {
	if c.cfg.TLS == nil && c.cfg.Token != "" {
		// The handshake would write the token in the clear.
		if err := netsec.PlaintextToken(addr); err != nil {
			return nil, fmt.Errorf("bulk: %w", err)
		}
	}
	conn, err := c.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return nil, cerr
		}
		if timedOut(err) {
			return nil, &NoAnswerError{Addr: addr, Op: "dial", Bound: connectTimeout, Detail: err.Error()}
		}
		return nil, fmt.Errorf("%w: bulk: dial %s: %v", errs.ErrUnavailable, addr, err)
	}
	if c.cfg.TLS != nil {
		tc := c.cfg.TLS.Clone()
		tc.NextProtos = []string{ALPN}
		if tc.ServerName == "" {
			if h, _, err := net.SplitHostPort(addr); err == nil {
				tc.ServerName = h
			}
		}
		tconn := tls.Client(conn, tc)
		hctx, cancel := context.WithTimeout(ctx, c.cfg.handshakeTimeout())
		err := tconn.HandshakeContext(hctx)
		cancel()
		if err == nil && tconn.ConnectionState().NegotiatedProtocol != ALPN {
			err = ErrNotSupported
		}
		if err != nil {
			conn.Close()
			if errors.Is(err, ErrNotSupported) {
				c.mu.Lock()
				c.noBulk[addr] = time.Now()
				c.mu.Unlock()
				return nil, err
			}
			if cerr := ended(ctx); cerr != nil {
				return nil, cerr
			}
			if timedOut(err) || errors.Is(err, context.DeadlineExceeded) { // hctx's timeout: ctx has time left
				return nil, &NoAnswerError{Addr: addr, Op: "TLS handshake", Bound: c.cfg.handshakeTimeout(), Detail: err.Error()}
			}
			return nil, fmt.Errorf("%w: bulk: TLS with %s: %v", errs.ErrUnavailable, addr, err)
		}
		conn = tconn
	}
	cc := &clientConn{Conn: conn, br: bufio.NewReaderSize(conn, 4096)}
	if err := handshake(ctx, cc, c.cfg.Token, c.cfg.handshakeTimeout()); err != nil {
		conn.Close()
		if hr := (helloRefusal{}); errors.As(err, &hr) {
			return nil, hr.err // the server's answer to the hello (its token), as a request's refusal
		}
		if errors.Is(err, ErrNotSupported) {
			c.mu.Lock()
			c.noBulk[addr] = time.Now()
			c.mu.Unlock()
			return nil, err
		}
		if cerr := ended(ctx); cerr != nil {
			return nil, cerr
		}
		if timedOut(err) {
			return nil, &NoAnswerError{Addr: addr, Op: "handshake", Bound: c.cfg.handshakeTimeout(), Detail: err.Error()}
		}
		return nil, fmt.Errorf("%w: bulk: handshake with %s: %v", errs.ErrUnavailable, addr, err)
	}
	return cc, nil
}

// ended is ctx's error, or context.DeadlineExceeded once ctx's deadline
// has passed: a socket deadline set from ctx's fires at the same instant
// as ctx's own timer, and may fail a dial or read before ctx.Err() says
// so (the call failed because ctx ended, not because the peer is down).
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// connectTimeout bounds a TCP connect (within the call's context): a
// machine that died, or is cut off, answers no SYN, and the kernel would
// wait about two minutes (tcp_syn_retries) for it.
const connectTimeout = 10 * time.Second

// A peer whose machine died (or was cut off) sends nothing, not even a
// reset: a request waiting for its answer would wait for the call's
// deadline, and one whose bytes are unacknowledged for the kernel's
// retransmissions (~15 min). TCP keep-alives probe an idle wait (gone
// after keepIdle + keepCount × keepInterval), and TCP_USER_TIMEOUT drops a
// connection whose sent bytes (or probes) stay unacknowledged for
// userTimeout (Linux; setUserTimeout): the call then fails Unavailable.
const (
	keepIdle     = 5 * time.Second
	keepInterval = 2 * time.Second
	keepCount    = 3
	userTimeout  = 20 * time.Second
)

// DefaultHandshakeTimeout bounds the wait for the server's Magic (and a
// TLS handshake) when ClientConfig.HandshakeTimeout is 0.
const DefaultHandshakeTimeout = 10 * time.Second

// handshake sends the hello and reads Magic within timeout (or
// ctx's deadline, when sooner). ctx's cancellation ends the wait too (a
// deadline in the past): a process that is stopped, not dead, accepts
// connections through the kernel's backlog and answers nothing, and a
// caller that gave up on it (a standby whose primary was replaced) must
// not wait out the timeout. Once ctx has ended it returns ctx's error.
func handshake(ctx context.Context, cc *clientConn, token string, timeout time.Duration) error {
	if len(token) > MaxTokenBytes {
		return fmt.Errorf("token of %d bytes exceeds %d", len(token), MaxTokenBytes)
	}
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = cc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = cc.SetDeadline(time.Unix(1, 0)) })
	n, prefix, refusal, err := greet(cc, token)
	if !stop() {
		// ctx ended: its deadline in the past may be set now or soon; the
		// caller closes the connection.
		return ctx.Err()
	}
	_ = cc.SetDeadline(time.Time{})
	switch {
	case refusal != nil:
		return refusal
	case err == nil && n < 0:
		return nil
	case prefix && timedOut(err):
		// The start of Magic, then nothing: a hub that stalled as it
		// answered, not a server without the data plane.
		return fmt.Errorf("the server sent %d bytes of its answer, then nothing: %w", n, err)
	case n > 0 || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// Something else answered (a gRPC server sends its SETTINGS
		// frame, or hangs up on a bad preface).
		return ErrNotSupported
	case timedOut(err):
		return fmt.Errorf("the server sent nothing: %w", err)
	default:
		return err
	}
}

// greet writes the hello and reads the server's first len(Magic) bytes:
// n is -1 when they are Magic, else how many were read (prefix: 1 to
// len(Magic)-1 bytes that start Magic, the read then failing). A server that
// refused the hello (HelloGuard) answers a final status instead: refusal
// is it, as Call returns a refusal (errs.FromStatus).
func greet(cc *clientConn, token string) (n int, prefix bool, refusal, err error) {
	if _, err := cc.Write(Hello(token)); err != nil {
		return 0, false, nil, err
	}
	b, err := cc.br.Peek(1)
	if err != nil {
		return 0, false, nil, err
	}
	if b[0] == kindFinal {
		_, _ = cc.br.ReadByte()
		st, err := readStatus(cc.br)
		if err != nil || codes.Code(st.GetCode()) == codes.OK {
			return 1, false, nil, err // not a refusal: something else answered
		}
		return 1, false, helloRefusal{grpcerr.FromStatus(status.ErrorProto(st))}, nil
	}
	var got [len(Magic)]byte
	n, err = io.ReadFull(cc.br, got[:])
	if err == nil && string(got[:]) == Magic {
		return -1, false, nil, nil
	}
	return n, err != nil && n > 0 && string(got[:n]) == Magic[:n], nil, err
}

// helloRefusal is the server's final status in answer to the hello.
type helloRefusal struct{ err error }

func (e helloRefusal) Error() string { return e.err.Error() }
func (e helloRefusal) Unwrap() error { return e.err }

func (c *Client) put(addr string, cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle[addr]) >= maxIdlePerAddr {
		cc.Close()
		return
	}
	c.idle[addr] = append(c.idle[addr], cc)
}

// Close closes the idle connections; calls in progress finish on theirs,
// which are then closed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for addr, l := range c.idle {
		for _, cc := range l {
			cc.Close()
		}
		delete(c.idle, addr)
	}
	return nil
}
