// Package bulk is rlhub's data plane: a plain TCP protocol for requests
// whose body is a large byte string (a pushed gradient), served on the
// same port as gRPC and answered with gRPC statuses.
//
// Why not gRPC for these bytes: grpc-go cuts every message into 16 KiB
// HTTP/2 frames, copies it into its write buffer on the way out and out of
// its read buffer on the way in, and runs flow control per frame. For a
// 4 MiB gradient that is over half the CPU of a push (docs/benchlog/2026-11-30-sessions-1-4.md,
// issue 4). Here the client hands the tensors' memory to writev and the
// server reads the body straight from the socket into the buffer that
// becomes the gradient: the kernel's two copies are the only ones, as with
// a plain TCP copy. Control stays on gRPC; only bodies move here.
//
// # Protocol (docs/wire.md is the normative description)
//
// On a hub with TLS every connection is TLS first, and the ALPN name
// ALPN picks the data plane (anything else is gRPC). A connection then
// starts with the client sending Magic and its token (u16 length, bytes;
// length 0 means none); the server answers Magic (a server that does not
// speak the protocol, such as a bare gRPC server or one of an older
// version, answers anything else or closes, and the client falls back to
// gRPC). Then any number of requests, one at a time:
//
// A Guard that judges tokens (HelloGuard) may refuse the hello: the server
// then answers, in the magic's place, a final status (below; first byte 3,
// never the magic's "R") and closes the connection.
//
//	client: u8 1 (request) | u16 method length | method | u32 header length | header (protobuf)
//	server: u8 2 (continue)                                 — send the body now
//	     or u8 3 (final) | u32 length | google.rpc.Status   — the answer; no body is sent
//	client, after continue: exactly the body's announced bytes
//	server: u8 3 (final) | u32 length | google.rpc.Status
//
// The header message announces the body's length (the method defines
// where). A final status with code OK carries the method's response
// message as its first detail. The server decides before the body is sent
// whether it wants it, so a refused request (a full queue, an unknown
// model) costs no transfer. All integers are little-endian.
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
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
)

// Magic opens a data-plane connection, from the client and, as the
// acknowledgement, from the server. gRPC connections start with the HTTP/2
// preface "PRI * HTTP/2.0…", so the first 8 bytes tell the two apart.
// Version 2 ("…DP2") added the token after the client's magic; a version-1
// client reaching this server is handed to gRPC, fails there, and falls
// back to gRPC.
const Magic = "RLHUBDP2"

// Frame kinds.
const (
	kindRequest  = 1
	kindContinue = 2
	kindFinal    = 3
)

// Limits on a request's frame (not its body, which its handler bounds).
const (
	MaxMethodBytes = 255
	MaxHeaderBytes = 1 << 20
	maxStatusBytes = 4 << 20
)

// Defaults of the Server's limits (docs/security.md, Limits).
const (
	// DefaultFrameTimeout is Server.FrameTimeout's default.
	DefaultFrameTimeout = 10 * time.Second
	// DefaultIdleTimeout is Server.IdleTimeout's default.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConnsPerPeer is Server.MaxConnsPerPeer's default.
	DefaultMaxConnsPerPeer = 256
	// DefaultBodyTimeout and DefaultBodyMinRate are Server.BodyTimeout's
	// and Server.BodyMinRate's defaults: a body of n bytes gets
	// 30 s + n / (1 MiB/s). 1 MiB/s (8 Mbit/s) is far below any link an
	// RL run pushes over, cross-region included, so an honest client never
	// meets it: a 4 MiB gradient gets 34 s, a 1 GiB model (the store's
	// default limit) 17 min. The 30 s covers a slow start (TCP slow start
	// on a long link, a client's GC pause) for small bodies. What it
	// stops is a client that trickles a body to hold a connection and
	// what its handler holds (a reducer queue slot) for ever; the
	// handlers' size checks before the body bound n, hence the hold.
	DefaultBodyTimeout = 30 * time.Second
	DefaultBodyMinRate = 1 << 20
)

// BodyDeadline is how long a body of n bytes may take to arrive under
// a fixed allowance and a minimum rate (bytes/s) — the data plane's
// bound (Server.BodyTimeout, BodyMinRate), which the hub's gRPC pushes
// share. A rate of 0 or less adds nothing; the result saturates instead
// of overflowing.
func BodyDeadline(allowance time.Duration, minRate, n int64) time.Duration {
	if minRate <= 0 || n <= 0 {
		return allowance
	}
	extra := float64(n) / float64(minRate) * float64(time.Second)
	if extra >= float64(1<<62) {
		return 1 << 62
	}
	return allowance + time.Duration(extra)
}

// Request is one request as its handler sees it.
type Request struct {
	// Method names the handler, e.g. "rlhub.v1.Reducer/Push".
	Method string
	// Header is the method's header message, protobuf-encoded.
	Header []byte

	conn      *serverConn
	continued bool
	remaining int64     // body bytes the client will still send
	deadline  time.Time // the whole body is due by then (Server.BodyTimeout); set by Body
	expired   bool      // a body read failed because deadline passed
	idled     bool      // a body read failed because no byte came within BodyIdleTimeout
	replied   bool      // Reply was called (data.go)
	broken    bool      // a Reply write failed: the connection is out of step
	notTaken  bool      // ... because the client did not take it within its deadline
	stream    *Stream
}

// Body tells the client to send the body, which the caller has decided
// to take and whose announced length is n, and returns a reader of exactly
// those n bytes. Reads go straight from the socket into the caller's
// buffer when it is at least 64 KiB. Call it at most once; bytes the
// handler leaves unread are read and discarded before the answer is sent.
func (r *Request) Body(n int64) (io.Reader, error) {
	if r.continued {
		return nil, errors.New("bulk: Body called twice")
	}
	if r.stream != nil {
		return nil, errors.New("bulk: Body after Stream")
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: negative body length %d", errs.ErrInvalid, n)
	}
	r.continued = true
	r.remaining = n
	// The whole body, whatever its pace, is due by the deadline: the idle
	// bound alone lets a client that sends a byte every 29 s keep the
	// request (and its handler's queue slot) for ever.
	r.deadline = r.conn.bodyDue(n)
	if err := r.conn.writeFrame([]byte{kindContinue}); err != nil {
		return nil, fmt.Errorf("%w: bulk: ask for the body: %v", errs.ErrUnavailable, err)
	}
	return bodyReader{r}, nil
}

type bodyReader struct{ r *Request }

func (b bodyReader) Read(p []byte) (int, error) {
	if b.r.remaining <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.r.remaining {
		p = p[:b.r.remaining]
	}
	// A client that stops sending midway, or sends too slowly, must not
	// hold what the handler holds (a reducer's queue slot) for ever.
	_ = b.r.conn.SetReadDeadline(b.r.conn.pieceDeadline(b.r.deadline))
	n, err := b.r.conn.br.Read(p)
	b.r.remaining -= int64(n)
	if err == io.EOF && b.r.remaining > 0 {
		err = io.ErrUnexpectedEOF
	}
	if overdue(err, b.r.deadline) {
		b.r.expired = true
		return n, errBodyDeadline(b.r.conn.bodyTimeout, b.r.conn.bodyMinRate)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.r.idled = true // the handler sees the timeout; the answer names the bound (handle)
	}
	return n, err
}

// errBodyIdle is the answer to a request whose body's read found no byte
// within idle (Server.BodyIdleTimeout).
func errBodyIdle(idle time.Duration) error {
	return status.Errorf(codes.DeadlineExceeded, "bulk: no byte of the request's body within %v (BodyIdleTimeout)", idle)
}

// bodyDue is when a body of n bytes sent or received on sc from now is
// due whole (BodyDeadline: Server.BodyTimeout, BodyMinRate).
func (sc *serverConn) bodyDue(n int64) time.Time {
	return time.Now().Add(BodyDeadline(sc.bodyTimeout, sc.bodyMinRate, n))
}

// pieceDeadline is the deadline of a body's next read or write on sc: the
// idle bound (Server.BodyIdleTimeout) from now, but never past due, the
// whole body's.
func (sc *serverConn) pieceDeadline(due time.Time) time.Time {
	if d := time.Now().Add(sc.idle); d.Before(due) {
		return d
	}
	return due
}

// overdue reports whether err, a body's read or write error, is the whole
// body's deadline (due) passing, not the idle bound or another failure.
func overdue(err error, due time.Time) bool {
	return err != nil && isTimeout(err) && !time.Now().Before(due)
}

// ErrBodyDeadline is what a body read returns once the body's deadline
// (Server.BodyTimeout, BodyMinRate) has passed: the request is answered
// DEADLINE_EXCEEDED and its connection closed. It wraps
// context.DeadlineExceeded.
var ErrBodyDeadline = fmt.Errorf("request body not received within its deadline: %w", context.DeadlineExceeded)

// errBodyDeadline names the limit, never anything the client sent.
func errBodyDeadline(allowance time.Duration, minRate int64) error {
	return fmt.Errorf("bulk: %w (%v plus 1 s per %d bytes announced: the server's body timeout and minimum rate)",
		ErrBodyDeadline, allowance, minRate)
}

// Handler serves one method. It returns the response message, or an error
// converted with errs.ToStatus, like a gRPC handler. ctx ends when the
// server is closed.
type Handler func(ctx context.Context, r *Request) (proto.Message, error)

// Server serves the data plane beside a gRPC server on one listener.
// Register handlers with Handle, then call Listen; Shutdown or Close stops
// it.
type Server struct {
	// BodyIdleTimeout bounds how long a body read may wait for the next
	// bytes; a client silent for longer fails its request (the handler's
	// read returns a timeout) and loses the connection. NewServer sets
	// DefaultBodyIdleTimeout; change it before Listen.
	BodyIdleTimeout time.Duration
	// BodyTimeout and BodyMinRate (bytes/s) bound the whole of a body:
	// one of n bytes must be in, bytes the server discards after its
	// handler failed included, within BodyTimeout + n/BodyMinRate of the
	// handler asking for it (BodyDeadline). Past it the handler's read
	// fails with ErrBodyDeadline, the request is answered
	// DEADLINE_EXCEEDED, the connection is closed and counted
	// (RefusedBodyTimeout). NewServer sets DefaultBodyTimeout and
	// DefaultBodyMinRate; BodyMinRate 0 means the deadline does not
	// grow with n. Change them before Listen.
	BodyTimeout time.Duration
	BodyMinRate int64
	// FrameTimeout bounds every partial frame: a new connection's first 8
	// bytes (the sniff), the rest of a request frame once its first byte
	// arrived, and every write to the client. A connection that sends the
	// magic and part of a request, then stops, is closed once it passes.
	// NewServer sets DefaultFrameTimeout; change it before Listen.
	FrameTimeout time.Duration
	// IdleTimeout bounds how long a data-plane connection may wait for
	// the first byte of its next request (or its first one after the
	// magic); an idle connection is then closed, and its client redials
	// on its next call. NewServer sets DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConnsPerPeer caps the connections one peer IP may hold open on
	// the listener at once, gRPC and data plane alike, counted from
	// accept to close; a connection over the cap is closed at accept.
	// NewServer sets DefaultMaxConnsPerPeer; negative means no cap.
	MaxConnsPerPeer int
	// TLS, when set, makes every connection on the listener TLS (both
	// planes): the data plane is chosen by ALPN, every other connection
	// goes to gRPC already handshaken (serve gRPC with TLSCredentials).
	// Set before Listen.
	TLS *tls.Config
	// Guard, when set, checks every request before its handler runs
	// (package auth: the token from the handshake, the method, the header).
	// Set before Listen.
	Guard Guard

	handlers map[string]Handler
	ctx      context.Context
	cancel   context.CancelFunc

	wg       sync.WaitGroup // the accept loop and every connection's goroutine
	mu       sync.Mutex     // guards the fields below
	lis      net.Listener
	requeue  func(net.Conn) // lis's Requeue, or nil
	grpcSide *grpcListener
	conns    map[*serverConn]struct{}
	sniffing map[net.Conn]struct{} // new connections not yet routed
	closing  bool
	requests uint64                // requests served (answered), any outcome
	answered map[requestKey]uint64 // requests answered, by method and code (Stats)

	// peersMu guards peers and open. It is taken apart from mu because
	// connections are closed (and so uncounted) with mu held.
	peersMu sync.Mutex
	peers   map[string]int         // open connections per peer IP
	open    map[*peerConn]struct{} // every accepted connection not yet closed (CloseAccepted)

	refused [len(RefusalReasons)]atomic.Uint64 // connections closed for their client's fault, by reason
}

type requestKey struct {
	method string
	code   codes.Code
}

// Why the server closed a connection for its client's fault (Stats.Refused,
// in RefusalReasons' order).
const (
	// RefusedPeerCap: over MaxConnsPerPeer at accept (gRPC or data plane).
	RefusedPeerCap = "peer_cap"
	// RefusedHandshake: the first bytes, a TLS handshake or the data-plane
	// hello did not arrive within FrameTimeout or were invalid (a client
	// that closed before sending a byte is not counted).
	RefusedHandshake = "handshake"
	// RefusedFrameTimeout: a data-plane request frame begun and not
	// finished within FrameTimeout.
	RefusedFrameTimeout = "frame_timeout"
	// RefusedMalformed: a malformed data-plane request frame (answered
	// INVALID_ARGUMENT, then closed).
	RefusedMalformed = "malformed"
	// RefusedBodyTimeout: a data-plane request body not received within
	// its deadline (BodyTimeout + n/BodyMinRate), or with no byte within
	// BodyIdleTimeout (answered DEADLINE_EXCEEDED, then closed).
	RefusedBodyTimeout = "body_timeout"
	// RefusedReplyTimeout: a data-plane reply body not taken by the
	// client within its deadline (BodyTimeout + n/BodyMinRate; the
	// connection closed mid-body, releasing what the reply held).
	RefusedReplyTimeout = "reply_timeout"
	// RefusedUnauthenticated: a data-plane hello whose token the Guard
	// refused (HelloGuard: none, unknown or expired), answered with a
	// final status in place of the magic, then closed.
	RefusedUnauthenticated = "unauthenticated"
)

// RefusalReasons lists every refusal reason, in a fixed order.
var RefusalReasons = [...]string{RefusedPeerCap, RefusedHandshake, RefusedFrameTimeout, RefusedMalformed, RefusedBodyTimeout, RefusedReplyTimeout, RefusedUnauthenticated}

func (s *Server) refuse(reason string) { s.refusal(reason).Add(1) }

func (s *Server) refusal(reason string) *atomic.Uint64 {
	for i, r := range RefusalReasons {
		if r == reason {
			return &s.refused[i]
		}
	}
	panic("bulk: unknown refusal reason " + reason)
}

// UnknownMethod is the method Stats counts a request under when it names
// no registered method (so a client cannot grow the counts' labels).
const UnknownMethod = "unknown"

// RequestCount is how many requests of one method were answered with one
// status code.
type RequestCount struct {
	Method string
	Code   codes.Code
	N      uint64
}

// Stats are a server's counts since it started.
type Stats struct {
	// Requests counts the requests answered, by method (a registered one,
	// or UnknownMethod) and status code, sorted by method then code.
	Requests []RequestCount
	// Refused counts the connections closed for their client's fault, by
	// reason (every one of RefusalReasons, zeros included).
	Refused map[string]uint64
}

// Stats returns the server's counts.
func (s *Server) Stats() Stats {
	st := Stats{Refused: make(map[string]uint64, len(RefusalReasons))}
	for i, r := range RefusalReasons {
		st.Refused[r] = s.refused[i].Load()
	}
	s.mu.Lock()
	for k, n := range s.answered {
		st.Requests = append(st.Requests, RequestCount{Method: k.method, Code: k.code, N: n})
	}
	s.mu.Unlock()
	sort.Slice(st.Requests, func(i, j int) bool {
		a, b := st.Requests[i], st.Requests[j]
		return a.Method < b.Method || a.Method == b.Method && a.Code < b.Code
	})
	return st
}

// DefaultBodyIdleTimeout is Server.BodyIdleTimeout's default.
const DefaultBodyIdleTimeout = 30 * time.Second

// NewServer returns a server with no handlers.
func NewServer() *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{BodyIdleTimeout: DefaultBodyIdleTimeout, BodyTimeout: DefaultBodyTimeout, BodyMinRate: DefaultBodyMinRate, FrameTimeout: DefaultFrameTimeout, IdleTimeout: DefaultIdleTimeout,
		MaxConnsPerPeer: DefaultMaxConnsPerPeer, handlers: map[string]Handler{}, ctx: ctx, cancel: cancel,
		conns: map[*serverConn]struct{}{}, sniffing: map[net.Conn]struct{}{}, peers: map[string]int{},
		open: map[*peerConn]struct{}{}, answered: map[requestKey]uint64{}}
}

// Handle registers h for method; it must be called before Listen.
func (s *Server) Handle(method string, h Handler) {
	if len(method) == 0 || len(method) > MaxMethodBytes {
		panic(fmt.Sprintf("bulk: method name %q must be 1..%d bytes", method, MaxMethodBytes))
	}
	s.handlers[method] = h
}

// Methods lists the registered methods, sorted (the policy test walks
// them).
func (s *Server) Methods() []string {
	out := make([]string, 0, len(s.handlers))
	for m := range s.handlers {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Requeuer is a listener that takes back a connection its server
// accepted but served nothing on before it shut down, for whoever
// serves the socket next (a cluster node hands one socket from role to
// role: internal/replica).
type Requeuer interface {
	net.Listener
	Requeue(net.Conn)
}

// Listen takes over lis: connections that open with Magic are served
// here, every other one is passed to the returned listener, which the
// gRPC server serves. The server owns lis and closes it on Shutdown or
// Close; closing the returned listener (as grpc.Server.Stop does) only
// stops handing connections to gRPC. When lis is a Requeuer, a plain
// (not TLS) connection still being sniffed, or not yet taken by gRPC,
// when Shutdown begins is given back to it, with the bytes already read
// replayed first, instead of closed.
func (s *Server) Listen(lis net.Listener) net.Listener {
	g := &grpcListener{addr: lis.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
	s.mu.Lock()
	s.lis, s.grpcSide = lis, g
	if r, ok := lis.(Requeuer); ok && s.TLS == nil {
		s.requeue = r.Requeue
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go s.acceptLoop(lis, g)
	return g
}

// Accept accepts the next connection from lis. Running out of file
// descriptors (EMFILE) and the like pass: it backs off and accepts again,
// as grpc-go's and net/http's accept loops do, until done is closed; any
// other error is returned at once.
func Accept(lis net.Listener, done <-chan struct{}) (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := lis.Accept()
		if err == nil {
			return c, nil
		}
		if te, ok := err.(interface{ Temporary() bool }); !ok || !te.Temporary() {
			return nil, err
		}
		backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
		select {
		case <-time.After(backoff):
		case <-done:
			return nil, err
		}
	}
}

func (s *Server) acceptLoop(lis net.Listener, g *grpcListener) {
	defer s.wg.Done()
	for {
		c, err := Accept(lis, s.ctx.Done())
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if !closing {
				// The listener failed: so does gRPC's side of it. When
				// Shutdown closed it, gRPC's side stays open until the gRPC
				// server closes it, so that its Serve returns nil.
				g.fail(err)
			}
			return
		}
		c, ok := s.admitPeer(c)
		if !ok {
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sniff(c, g)
		}()
	}
}

// PeerIP is the peer a remote address counts against in a per-peer cap:
// its IP for TCP (MaxConnsPerPeer, and internal/wire/streamcap's streams,
// count alike), else the whole address.
func PeerIP(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return a.String()
}

// admitPeer counts c against its peer's cap and returns it wrapped so
// that closing it, by whoever ends up owning it (the data plane or gRPC),
// uncounts it; over the cap it closes c and returns false.
func (s *Server) admitPeer(c net.Conn) (net.Conn, bool) {
	ip := PeerIP(c.RemoteAddr())
	s.peersMu.Lock()
	if s.MaxConnsPerPeer >= 0 && s.peers[ip] >= s.MaxConnsPerPeer {
		s.peersMu.Unlock()
		s.refuse(RefusedPeerCap)
		c.Close()
		return nil, false
	}
	s.peers[ip]++
	pc := &peerConn{Conn: c}
	pc.release = func() {
		s.peersMu.Lock()
		if s.peers[ip]--; s.peers[ip] <= 0 {
			delete(s.peers, ip)
		}
		delete(s.open, pc)
		s.peersMu.Unlock()
	}
	s.open[pc] = struct{}{}
	s.peersMu.Unlock()
	return pc, true
}

// CloseAccepted closes every connection the server accepted that is still
// open, those it handed to gRPC included: for a hard stop. A stopping
// grpc-go server (Stop as well as GracefulStop) waits for each HTTP/2
// handshake in progress, up to its connection timeout, whatever its
// owner's deadline; a client that sent its preface and no more held the
// hub's stop that long. Closed, the handshake ends at once.
func (s *Server) CloseAccepted() {
	s.peersMu.Lock()
	conns := make([]*peerConn, 0, len(s.open))
	for c := range s.open {
		conns = append(conns, c)
	}
	s.peersMu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// peerConn is an accepted connection counted against its peer's cap
// until it is closed.
type peerConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// PeerConns returns how many connections peer IP ip holds open, and how
// many connections were closed at accept for being over the cap.
func (s *Server) PeerConns(ip string) (open int, refused uint64) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	return s.peers[ip], s.refusal(RefusedPeerCap).Load()
}

// sniff reads a new connection's first 8 bytes and routes it.
func (s *Server) sniff(c net.Conn, g *grpcListener) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.unserved(c)
		return
	}
	s.sniffing[c] = struct{}{}
	s.mu.Unlock()
	// The sniff, a TLS handshake and the data-plane handshake all finish
	// within FrameTimeout (reads and the handshake's writes).
	_ = c.SetDeadline(time.Now().Add(s.FrameTimeout))
	raw := c
	if s.TLS != nil {
		tc, dataPlane, err := s.handshakeTLS(c)
		if err != nil || !dataPlane {
			_ = raw.SetDeadline(time.Time{})
			s.mu.Lock()
			delete(s.sniffing, raw)
			closing := s.closing
			s.mu.Unlock()
			if err != nil && !closing && !errors.Is(err, io.EOF) { // EOF: it left before a byte
				s.refuse(RefusedHandshake)
			}
			if err != nil || closing {
				raw.Close()
				return
			}
			s.toGRPC(tc, g)
			return
		}
		c = tc
	}
	var head [len(Magic)]byte
	n, err := io.ReadFull(c, head[:])
	var token string
	if err == nil && string(head[:]) == Magic {
		token, err = readToken(c)
	}
	_ = raw.SetDeadline(time.Time{})
	s.mu.Lock()
	delete(s.sniffing, raw)
	closing := s.closing
	s.mu.Unlock()
	if closing {
		if n == len(head) && string(head[:]) == Magic {
			c.Close() // its token was read (or cut): nothing to replay
			return
		}
		s.unserved(&prefixConn{Conn: c, prefix: append([]byte(nil), head[:n]...)})
		return
	}
	if string(head[:]) == Magic {
		if err != nil {
			if !errors.Is(err, io.EOF) { // a token cut off, too long or too slow
				s.refuse(RefusedHandshake)
			}
			c.Close()
			return
		}
		s.serve(c, token)
		return
	}
	if s.TLS != nil { // a TLS connection that chose the data plane must speak it
		if n > 0 || !errors.Is(err, io.EOF) {
			s.refuse(RefusedHandshake)
		}
		c.Close()
		return
	}
	if ne, ok := err.(net.Error); n == 0 || (ok && ne.Timeout()) {
		// Nothing, or fewer than 8 bytes in FrameTimeout: no client of
		// either protocol is that slow with its first bytes (gRPC's
		// preface is 24 bytes in one write).
		if ok && ne.Timeout() {
			s.refuse(RefusedHandshake)
		}
		c.Close()
		return
	}
	// Not ours: gRPC reads the bytes taken here first, then the socket.
	s.toGRPC(&prefixConn{Conn: c, prefix: append([]byte(nil), head[:n]...)}, g)
}

// toGRPC hands c to the gRPC server.
func (s *Server) toGRPC(c net.Conn, g *grpcListener) {
	if s.requeue != nil {
		c = &handedConn{Conn: c, requeue: s.requeue}
	}
	select {
	case g.conns <- c:
	case <-g.done:
		s.unserved(c)
	case <-s.ctx.Done():
		s.unserved(c)
	}
}

// unserved gives c, on which nothing was served, back to the listener
// when it takes connections back (Requeuer), or closes it.
func (s *Server) unserved(c net.Conn) {
	if s.requeue != nil {
		s.requeue(c)
		return
	}
	c.Close()
}

// serverConn is one data-plane connection.
type serverConn struct {
	net.Conn
	br    *bufio.Reader
	idle  time.Duration // Server.BodyIdleTimeout
	frame time.Duration // Server.FrameTimeout
	busy  bool          // a request is being served (guarded by Server.mu)
	token string        // from the handshake; "" when none was sent

	bodyTimeout time.Duration // Server.BodyTimeout
	bodyMinRate int64         // Server.BodyMinRate
}

// Write writes to the client within FrameTimeout: a client that stops
// reading cannot hold the connection (and what its handler holds).
func (c *serverConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.frame))
	return c.Conn.Write(b)
}

func (c *serverConn) writeFrame(b []byte) error {
	_, err := c.Write(b)
	return err
}

// serve runs one connection's requests until it breaks or the server
// closes.
func (s *Server) serve(c net.Conn, token string) {
	sc := &serverConn{Conn: c, br: bufio.NewReaderSize(c, 64<<10), idle: s.BodyIdleTimeout, frame: s.FrameTimeout, token: token,
		bodyTimeout: s.BodyTimeout, bodyMinRate: s.BodyMinRate}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		c.Close()
	}()
	if err := s.checkHello(sc); err != nil {
		// Refused before anything larger than the hello is read: the
		// answer takes the magic's place and the connection ends. The
		// client sent its hello and waits for the answer, so nothing
		// unread is left to turn the close into a reset.
		s.refuse(RefusedUnauthenticated)
		_ = writeFinal(sc, toStatus(nil, err))
		return
	}
	if err := sc.writeFrame([]byte(Magic)); err != nil {
		return
	}
	for {
		if !s.awaitRequest(sc) {
			return
		}
		req, err := readRequest(sc)
		if err != nil {
			var mid midFrameError
			switch st, ok := err.(frameError); {
			case ok: // a malformed frame: answer, then hang up
				s.refuse(RefusedMalformed)
				_ = writeFinal(sc, status.New(codes.InvalidArgument, st.Error()).Proto())
			case errors.As(err, &mid) && isTimeout(mid.err) && !s.isClosing():
				s.refuse(RefusedFrameTimeout)
			}
			return
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			_ = writeFinal(sc, status.New(codes.Unavailable, "bulk: server is shutting down").Proto())
			return
		}
		sc.busy = true
		s.mu.Unlock()
		ok := s.handle(sc, req)
		s.mu.Lock()
		sc.busy = false
		closing := s.closing
		s.mu.Unlock()
		if !ok || closing {
			return
		}
	}
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// awaitRequest arms the deadline for the next request's first byte
// (IdleTimeout), unless the server is closing. It holds s.mu, as Shutdown
// does when it wakes idle connections, so the two cannot cross.
func (s *Server) awaitRequest(sc *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	_ = sc.SetReadDeadline(time.Now().Add(s.IdleTimeout))
	return true
}

// Requests is the number of requests this server has answered (or was
// about to answer when the connection broke).
func (s *Server) Requests() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// handle serves one request and reports whether the connection is still
// in step (every body byte read, the answer written).
func (s *Server) handle(sc *serverConn, req *Request) bool {
	var st *spb.Status
	h, ok := s.handlers[req.Method]
	if !ok {
		st = status.Newf(codes.Unimplemented, "bulk: unknown method %s", errs.Quote(req.Method)).Proto()
	} else if ctx, done, err := s.guard(sc, req); err != nil {
		done()
		st = toStatus(nil, err)
	} else {
		resp, err := h(ctx, req)
		st = toStatus(resp, causeOf(ctx, err))
		done()
	}
	// Keep the connection in step: drop what the handler did not read
	// (under the body's deadline too).
	inStep := !req.broken && req.stream == nil
	if inStep && req.remaining > 0 && !req.idled { // a silent client is not waited for again
		if _, err := io.CopyN(io.Discard, bodyReader{req}, req.remaining); err != nil {
			inStep = false
		}
	}
	if req.idled && !req.expired {
		st = toStatus(nil, errBodyIdle(sc.idle))
	}
	if req.expired {
		// Whatever the handler made of its failed read, the answer names
		// the limit (a handler may have wrapped the error in its words).
		st = toStatus(nil, errBodyDeadline(sc.bodyTimeout, sc.bodyMinRate))
	}
	key := requestKey{method: req.Method, code: codes.Code(st.Code)}
	if !ok {
		key.method = UnknownMethod
	}
	s.mu.Lock()
	s.answered[key]++
	s.mu.Unlock()
	switch {
	case req.broken:
		if req.notTaken {
			s.refuse(RefusedReplyTimeout)
		}
		return false
	case req.expired, req.idled: // its deadline passed mid-body, or it fell silent: say why, then hang up
		s.refuse(RefusedBodyTimeout)
		_ = writeFinal(sc, st)
		return false
	case req.stream != nil: // its final status, then the connection ends (stream.go)
		_ = writeFinal(sc, st)
		return false
	case !inStep:
		return false
	}
	s.mu.Lock()
	s.requests++ // before the answer leaves, so a client that has it sees the count
	s.mu.Unlock()
	// A token refused (revoked or expired since the hello) is the
	// connection's: every later request would be refused too, each header
	// read and held first, so the connection ends with the answer.
	return writeFinal(sc, st) == nil && codes.Code(st.Code) != codes.Unauthenticated
}

func toStatus(resp proto.Message, err error) *spb.Status {
	if err != nil {
		st, _ := status.FromError(grpcerr.ToStatus(err))
		return st.Proto()
	}
	p := &spb.Status{Code: int32(codes.OK)}
	if resp != nil {
		a, aerr := anypb.New(resp)
		if aerr != nil {
			return status.Newf(codes.Internal, "bulk: encode response: %v", aerr).Proto()
		}
		p.Details = []*anypb.Any{a}
	}
	return p
}

// frameError is a malformed request frame.
type frameError struct{ msg string }

func (e frameError) Error() string { return e.msg }

// midFrameError is a read that failed after a request frame's first byte.
type midFrameError struct{ err error }

func (e midFrameError) Error() string { return "bulk: request frame cut off: " + e.err.Error() }
func (e midFrameError) Unwrap() error { return e.err }

func readRequest(sc *serverConn) (*Request, error) {
	kind, err := sc.br.ReadByte()
	if err != nil {
		return nil, err
	}
	if kind != kindRequest {
		return nil, frameError{fmt.Sprintf("bulk: frame kind %d, want a request (1)", kind)}
	}
	// The rest of the frame is due within FrameTimeout: a client that
	// sends part of a request and stops is cut off.
	_ = sc.SetReadDeadline(time.Now().Add(sc.frame))
	var n [4]byte
	if _, err := io.ReadFull(sc.br, n[:2]); err != nil {
		return nil, midFrameError{err}
	}
	ml := int(binary.LittleEndian.Uint16(n[:2]))
	if ml == 0 || ml > MaxMethodBytes {
		return nil, frameError{fmt.Sprintf("bulk: method name of %d bytes (1..%d)", ml, MaxMethodBytes)}
	}
	method := make([]byte, ml)
	if _, err := io.ReadFull(sc.br, method); err != nil {
		return nil, midFrameError{err}
	}
	if _, err := io.ReadFull(sc.br, n[:]); err != nil {
		return nil, midFrameError{err}
	}
	hl := binary.LittleEndian.Uint32(n[:])
	if hl > MaxHeaderBytes {
		return nil, frameError{fmt.Sprintf("bulk: header of %d bytes exceeds %d", hl, MaxHeaderBytes)}
	}
	header, err := readClaimed(sc.br, int(hl))
	if err != nil {
		return nil, midFrameError{err}
	}
	return &Request{Method: string(method), Header: header, conn: sc}, nil
}

// readClaimed reads the n bytes a peer claimed to send, allocating as
// they arrive (io.ReadAll's growth: at most as much again as arrived): a
// request's header is read before the guard knows who sent it, and a peer
// that claims a megabyte and sends a byte held the megabyte for the
// frame's timeout, per connection.
func readClaimed(r io.Reader, n int) ([]byte, error) {
	buf, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err == nil && len(buf) < n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, err
	}
	return buf, nil
}

func writeFinal(w io.Writer, st *spb.Status) error {
	b, err := proto.Marshal(st)
	if err != nil {
		return err
	}
	frame := make([]byte, 5, 5+len(b))
	frame[0] = kindFinal
	binary.LittleEndian.PutUint32(frame[1:], uint32(len(b)))
	_, err = w.Write(append(frame, b...))
	return err
}

// Shutdown stops accepting connections and requests, lets requests in
// progress finish until ctx ends, then closes every connection and waits
// for all goroutines. Idle connections close at once (their clients
// reconnect or fall back).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	lis := s.lis
	for c := range s.conns {
		if !c.busy {
			_ = c.SetReadDeadline(time.Unix(1, 0)) // wake its read of the next request
		}
	}
	for c := range s.sniffing {
		if s.requeue != nil {
			// Wake its read: the sniff gives it back with what it read.
			_ = c.SetReadDeadline(time.Unix(1, 0))
			continue
		}
		c.Close()
	}
	s.mu.Unlock()
	if lis != nil {
		lis.Close()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes the listener and every connection at once and waits for
// all goroutines. Safe to call more than once.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	lis := s.lis
	for c := range s.conns {
		c.Close()
	}
	for c := range s.sniffing {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	if lis != nil {
		lis.Close()
	}
	s.wg.Wait()
}

// grpcListener is the listener the gRPC server serves: the connections the
// sniffer did not take.
type grpcListener struct {
	addr  net.Addr
	conns chan net.Conn

	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func (g *grpcListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		g.mu.Lock()
		defer g.mu.Unlock()
		return nil, g.err
	}
}

// fail ends Accept with err (the underlying listener's).
func (g *grpcListener) fail(err error) {
	g.once.Do(func() {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		close(g.done)
	})
}

func (g *grpcListener) Close() error {
	g.fail(net.ErrClosed)
	return nil
}

func (g *grpcListener) Addr() net.Addr { return g.addr }

// handedConn is a connection handed to gRPC from a Requeuer's socket.
// grpc-go closes a connection its Serve accepted without reading or
// writing a byte when the server stops before the connection's goroutine
// starts (handleRawConn checks quit first); the client, its preface sent,
// sees a reset ("error reading server preface"). Such a connection goes
// back to the socket for the role that serves next, as one the sniff
// still held does (seen as a CI flake: TestRoleSwitchNeverRefusesAConnection).
type handedConn struct {
	net.Conn
	requeue func(net.Conn)
	used    atomic.Bool // gRPC read or wrote
	closed  atomic.Bool
}

func (c *handedConn) Read(p []byte) (int, error) {
	if !c.used.Load() {
		c.used.Store(true)
	}
	return c.Conn.Read(p)
}

func (c *handedConn) Write(p []byte) (int, error) {
	if !c.used.Load() {
		c.used.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *handedConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if !c.used.Load() {
		_ = c.Conn.SetDeadline(time.Time{})
		c.requeue(c.Conn)
		return nil
	}
	return c.Conn.Close()
}

// prefixConn replays bytes already read from a connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
