package bulk

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc/credentials"
)

// ALPN is the TLS application protocol name of the data plane. On a TLS
// listener a connection that negotiates it is the data plane; gRPC's "h2"
// (or none) goes to the gRPC server.
const ALPN = "rlhub-dp/2"

// MaxTokenBytes bounds the token a client sends in the handshake.
const MaxTokenBytes = 1024

// Guard decides whether a request may run, before its body is asked for.
// token is the one the client sent in its handshake ("" for none), tls is
// the connection's TLS state (nil on plaintext), header the request's
// header bytes. It returns the context the handler runs with (carrying the
// caller's identity), or an error that becomes the final status
// (errs.ErrUnauthenticated, errs.ErrPermission). ctx is the request's own:
// it is cancelled when the request ends, so a Guard may tie per-request
// state to it (context.AfterFunc). A handler that fails under a context
// the Guard cancelled with a cause (a revoked token) answers with that
// cause.
type Guard interface {
	Check(ctx context.Context, token string, tls *tls.ConnectionState, method string, header []byte) (context.Context, error)
}

// HelloGuard is a Guard that also judges a connection's token at its
// hello, before the server reads a request: an unauthenticated peer must
// not make the server read and hold request headers (up to
// MaxHeaderBytes each) and keep an idle connection (IdleTimeout) only to
// be refused request by request. A non-nil error (errs.ErrUnauthenticated)
// is sent as the final status in place of the magic, and the connection
// is closed. Every request is still checked by Check: a token revoked
// later is refused there.
type HelloGuard interface {
	Guard
	CheckHello(token string, tls *tls.ConnectionState) error
}

// checkHello runs the Guard's hello check on a new data-plane connection,
// when it has one.
func (s *Server) checkHello(sc *serverConn) error {
	g, ok := s.Guard.(HelloGuard)
	if !ok {
		return nil
	}
	return g.CheckHello(sc.token, tlsState(sc.Conn))
}

func tlsState(c net.Conn) *tls.ConnectionState {
	if tc, ok := c.(*tls.Conn); ok {
		cs := tc.ConnectionState()
		return &cs
	}
	return nil
}

// guard runs the Guard for req; done must be called when the request
// ends (it cancels the request's context).
func (s *Server) guard(sc *serverConn, req *Request) (ctx context.Context, done func(), err error) {
	if s.Guard == nil {
		return s.ctx, func() {}, nil
	}
	rctx, cancel := context.WithCancel(s.ctx)
	ctx, err = s.Guard.Check(rctx, sc.token, tlsState(sc.Conn), req.Method, req.Header)
	return ctx, cancel, err
}

// causeOf is the cause a Guard cancelled ctx with, in place of the
// handler's err, when there is one.
func causeOf(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if c := context.Cause(ctx); c != nil && c != ctx.Err() {
		return c
	}
	return err
}

// handshakeTLS runs the server side of TLS on a new connection (under the
// caller's read deadline) and reports whether it chose the data plane.
func (s *Server) handshakeTLS(c net.Conn) (*tls.Conn, bool, error) {
	tc := tls.Server(c, s.TLS)
	if err := tc.Handshake(); err != nil {
		return nil, false, err
	}
	return tc, tc.ConnectionState().NegotiatedProtocol == ALPN, nil
}

// ServerTLS returns cfg prepared for a hub's listener: a clone offering
// both planes' ALPN names ("h2" first, so gRPC clients that offer both
// get gRPC).
func ServerTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.NextProtos = []string{"h2", ALPN}
	return c
}

// Hello is what a client sends to open a data-plane connection: Magic,
// then the token's u16 length and bytes ("" for none).
func Hello(token string) []byte {
	b := append([]byte(Magic), byte(len(token)), byte(len(token)>>8))
	return append(b, token...)
}

// readToken reads the handshake's token: u16 length, then the bytes.
func readToken(r io.Reader) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	l := int(binary.LittleEndian.Uint16(n[:]))
	if l > MaxTokenBytes {
		return "", fmt.Errorf("bulk: token of %d bytes exceeds %d", l, MaxTokenBytes)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// TLSCredentials are the gRPC server credentials for a Server with TLS:
// the connections it hands to gRPC have finished their TLS handshake, so
// the credentials only report the TLS state (for peer.AuthInfo: client
// certificates) and never handshake again.
func TLSCredentials() credentials.TransportCredentials { return handshaken{} }

type handshaken struct{}

func (handshaken) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("bulk: TLSCredentials are server-side only")
}

func (handshaken) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, errors.New("bulk: a plaintext connection reached a TLS gRPC server")
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handshaken) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}
func (h handshaken) Clone() credentials.TransportCredentials { return h }
func (handshaken) OverrideServerName(string) error           { return nil }
