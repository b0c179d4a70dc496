package bulk_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The test methods. "sum": header UInt64Value n announces an n-byte body;
// the answer is the sum of its bytes. "refuse": fails before the body.
// "half": reads half the body, then fails. "block": waits for release.
type env struct {
	srv     *bulk.Server
	grpc    *grpc.Server
	addr    string
	release chan struct{}
	entered chan struct{}
	served  chan struct{}
}

func start(t *testing.T, configure ...func(*bulk.Server)) *env {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: bulk.NewServer(), grpc: grpc.NewServer(), addr: lis.Addr().String(),
		release: make(chan struct{}), entered: make(chan struct{}, 8), served: make(chan struct{})}
	healthpb.RegisterHealthServer(e.grpc, health.NewServer())
	e.srv.Handle("sum", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
		n, err := announced(r)
		if err != nil {
			return nil, err
		}
		if n > 64<<20 {
			return nil, fmt.Errorf("%w: body of %d bytes", errs.ErrFull, n)
		}
		body, err := r.Body(int64(n))
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, err
		}
		var sum uint64
		for _, b := range buf {
			sum += uint64(b)
		}
		return wrapperspb.UInt64(sum), nil
	})
	e.srv.Handle("refuse", func(context.Context, *bulk.Request) (proto.Message, error) {
		return nil, &errs.StaleError{Model: "m", CurrentVersion: 7, Reason: "too old"}
	})
	e.srv.Handle("half", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
		n, err := announced(r)
		if err != nil {
			return nil, err
		}
		body, err := r.Body(int64(n))
		if err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(body, make([]byte, n/2)); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: NaN in the second half", errs.ErrInvalid)
	})
	e.srv.Handle("block", func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		e.entered <- struct{}{}
		select {
		case <-e.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return wrapperspb.UInt64(1), nil
	})
	for _, f := range configure {
		f(e.srv)
	}
	g := e.srv.Listen(lis)
	go func() { defer close(e.served); _ = e.grpc.Serve(g) }()
	t.Cleanup(func() {
		e.grpc.Stop()
		e.srv.Close()
		<-e.served
	})
	return e
}

func announced(r *bulk.Request) (uint64, error) {
	var h wrapperspb.UInt64Value
	if err := proto.Unmarshal(r.Header, &h); err != nil {
		return 0, fmt.Errorf("%w: header: %v", errs.ErrInvalid, err)
	}
	return h.GetValue(), nil
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return b
}

func byteSum(b []byte) (s uint64) {
	for _, x := range b {
		s += uint64(x)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// A body in several slices arrives whole, calls reuse one connection, and
// gRPC is served on the same port.
func TestCallAndGRPCShareThePort(t *testing.T) {
	e := start(t)
	c := bulk.NewClient()
	defer c.Close()
	a, b := pattern(3<<20+5), pattern(1000)
	for range 3 {
		var resp wrapperspb.UInt64Value
		if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(uint64(len(a)+len(b))), net.Buffers{a, b}, &resp); err != nil {
			t.Fatal(err)
		}
		if want := byteSum(a) + byteSum(b); resp.GetValue() != want {
			t.Fatalf("sum %d, want %d", resp.GetValue(), want)
		}
	}
	if n := e.srv.Requests(); n != 3 {
		t.Fatalf("server answered %d requests, want 3", n)
	}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC beside the data plane: %v, %v", hr, err)
	}
}

// Errors arrive as the same sentinels (and StaleError fields) a gRPC call
// gives; a refusal before the body moves no body bytes, and a handler that
// stops reading midway leaves the connection usable.
func TestErrorsKeepTheConnectionInStep(t *testing.T) {
	e := start(t)
	c := bulk.NewClient()
	defer c.Close()
	body := net.Buffers{pattern(1 << 20)}

	err := c.Call(ctx(t), e.addr, "refuse", wrapperspb.UInt64(1<<20), body, nil)
	var se *errs.StaleError
	if !errors.As(err, &se) || se.CurrentVersion != 7 || grpcerr.Code(err) != codes.FailedPrecondition {
		t.Fatalf("refuse: %v, want a StaleError at version 7", err)
	}
	err = c.Call(ctx(t), e.addr, "half", wrapperspb.UInt64(1<<20), body, nil)
	if !errors.Is(err, errs.ErrInvalid) || grpcerr.Code(err) != codes.InvalidArgument {
		t.Fatalf("half: %v, want InvalidArgument", err)
	}
	err = c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(65<<20), nil, nil)
	if !errors.Is(err, errs.ErrFull) {
		t.Fatalf("oversize: %v, want ResourceExhausted", err)
	}
	err = c.Call(ctx(t), e.addr, "nope", wrapperspb.UInt64(1), nil, nil)
	if grpcerr.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v, want Unimplemented", err)
	}
	// The longest method name, of control bytes, comes back cut as every
	// client string in an error is (errs.Quote), not 1 KB of escapes.
	err = c.Call(ctx(t), e.addr, strings.Repeat("\x1b", bulk.MaxMethodBytes), wrapperspb.UInt64(1), nil, nil)
	if msg := err.Error(); grpcerr.Code(err) != codes.Unimplemented || len(msg) > 400 || !strings.Contains(msg, "(255 bytes)") {
		t.Fatalf("unknown method of 255 control bytes: %d-byte message %.100q, want Unimplemented, short, saying its length", len(msg), msg)
	}
	var resp wrapperspb.UInt64Value
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(1<<20), body, &resp); err != nil || resp.GetValue() != byteSum(body[0]) {
		t.Fatalf("after the errors: %v, %d", err, resp.GetValue())
	}
}

// rawConn opens a data-plane connection by hand.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(bulk.Hello("")); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, len(bulk.Magic))
	if _, err := io.ReadFull(conn, ack); err != nil || string(ack) != bulk.Magic {
		t.Fatalf("ack %q, %v", ack, err)
	}
	return conn
}

// partialBody opens a data-plane connection by hand, sends a request for
// method with header, waits for "continue" and sends only n body bytes.
func partialBody(t *testing.T, addr, method string, header proto.Message, n int) net.Conn {
	t.Helper()
	conn := rawConn(t, addr)
	h, err := proto.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(bulk.RequestFrame(method, h)); err != nil {
		t.Fatal(err)
	}
	k := make([]byte, 1)
	if _, err := io.ReadFull(conn, k); err != nil || k[0] != 2 {
		t.Fatalf("want continue (2), got %v, %v", k, err)
	}
	if _, err := conn.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readFinal reads a final frame's status code and message, then expects
// the server to hang up.
func readFinal(t *testing.T, conn net.Conn) (codes.Code, string) {
	t.Helper()
	code, msg := readFinalKeep(t, conn)
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the server kept the connection open after a malformed frame (%d, %v)", n, err)
	}
	return code, msg
}

// readFinalKeep reads a final frame's status code and message.
func readFinalKeep(t *testing.T, conn net.Conn) (codes.Code, string) {
	t.Helper()
	head := make([]byte, 5)
	if _, err := io.ReadFull(conn, head); err != nil {
		t.Fatal(err)
	}
	if head[0] != 3 {
		t.Fatalf("frame kind %d, want final (3)", head[0])
	}
	b := make([]byte, binary.LittleEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(conn, b); err != nil {
		t.Fatal(err)
	}
	return parseStatus(t, b)
}

// parseStatus decodes google.rpc.Status by hand (field 1 code, field 2
// message), so the test does not share the server's decoding.
func parseStatus(t *testing.T, b []byte) (codes.Code, string) {
	t.Helper()
	var code codes.Code
	var msg string
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		b = b[n:]
		switch key {
		case 1<<3 | 0:
			v, n := binary.Uvarint(b)
			code, b = codes.Code(v), b[n:]
		case 2<<3 | 2:
			l, n := binary.Uvarint(b)
			msg, b = string(b[n:n+int(l)]), b[n+int(l):]
		case 3<<3 | 2: // a detail (an OK answer's response): skipped
			l, n := binary.Uvarint(b)
			b = b[n+int(l):]
		default:
			t.Fatalf("unexpected status field key %d", key)
		}
	}
	return code, msg
}

// Malformed frames get InvalidArgument and a closed connection; the
// server goes on serving others.
func TestMalformedFrames(t *testing.T) {
	e := start(t)
	cases := map[string][]byte{
		"wrong kind":      {9},
		"empty method":    {1, 0, 0},
		"oversize header": append([]byte{1, 3, 0, 's', 'u', 'm'}, binary.LittleEndian.AppendUint32(nil, bulk.MaxHeaderBytes+1)...),
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			conn := rawConn(t, e.addr)
			if _, err := conn.Write(frame); err != nil {
				t.Fatal(err)
			}
			if code, msg := readFinal(t, conn); code != codes.InvalidArgument {
				t.Fatalf("code %v (%s), want InvalidArgument", code, msg)
			}
		})
	}
	c := bulk.NewClient()
	defer c.Close()
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(4), net.Buffers{{1, 2, 3, 4}}, nil); err != nil {
		t.Fatal(err)
	}
}

// A client that dies mid-body leaves the server running; a client whose
// context ends mid-call returns the context's error promptly.
func TestBrokenClients(t *testing.T) {
	e := start(t)
	conn := partialBody(t, e.addr, "sum", wrapperspb.UInt64(1<<20), 1000)
	conn.Close() // 1000 of 1 MiB

	c := bulk.NewClient()
	defer c.Close()
	cctx, cancel := context.WithCancel(ctx(t))
	errc := make(chan error, 1)
	go func() { errc <- c.Call(cctx, e.addr, "block", wrapperspb.UInt64(0), nil, nil) }()
	<-e.entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	close(e.release)
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(3), net.Buffers{{1, 1, 1}}, nil); err != nil {
		t.Fatal(err)
	}
}

// A bare gRPC server does not speak the data plane: Call says so, and the
// client stops trying that address for a while.
func TestNotSupported(t *testing.T) {
	addr := testkit.ServeGRPC(t, nil, func(*grpc.Server) {}) // serves nothing: not a data plane
	c := bulk.NewClient()
	defer c.Close()
	if !c.Supported(addr) {
		t.Fatal("an untried address is not Supported")
	}
	if err := c.Call(ctx(t), addr, "sum", wrapperspb.UInt64(1), net.Buffers{{1}}, nil); !errors.Is(err, bulk.ErrNotSupported) {
		t.Fatalf("call to a gRPC server: %v, want ErrNotSupported", err)
	}
	if c.Supported(addr) {
		t.Fatal("still Supported after the failed handshake")
	}
}

// An idle connection the server has closed (a restart on the same
// address) is replaced without failing the call.
func TestStaleIdleConnectionIsReplaced(t *testing.T) {
	e := start(t)
	c := bulk.NewClient()
	defer c.Close()
	call := func() error {
		return c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), net.Buffers{{1, 2}}, nil)
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	// Shut the server down (closing the idle connection the client holds)
	// and serve again on the same port.
	if err := e.srv.Shutdown(ctx(t)); err != nil {
		t.Fatal(err)
	}
	e.grpc.Stop()
	<-e.served
	lis, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", e.addr, err)
	}
	srv2 := bulk.NewServer()
	srv2.Handle("sum", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
		body, err := r.Body(2)
		if err != nil {
			return nil, err
		}
		_, err = io.ReadFull(body, make([]byte, 2))
		return nil, err
	})
	g := srv2.Listen(lis)
	defer func() { g.Close(); srv2.Close() }()
	if err := call(); err != nil {
		t.Fatalf("call after the restart: %v", err)
	}
	if srv2.Requests() != 1 {
		t.Fatalf("the new server answered %d requests", srv2.Requests())
	}
}

// Shutdown lets a request in progress finish, then stops.
func TestShutdownFinishesRequestsInProgress(t *testing.T) {
	e := start(t)
	c := bulk.NewClient()
	defer c.Close()
	var wg sync.WaitGroup
	var callErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var resp wrapperspb.UInt64Value
		callErr = c.Call(ctx(t), e.addr, "block", wrapperspb.UInt64(0), nil, &resp)
	}()
	<-e.entered
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx(t)) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a request was in progress", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(e.release)
	wg.Wait()
	if callErr != nil {
		t.Fatalf("the request in progress failed: %v", callErr)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(1), net.Buffers{{1}}, nil); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("call after Shutdown: %v, want Unavailable", err)
	}
}

// A client that goes silent midway through a body loses its request after
// BodyIdleTimeout: the handler's read fails (so it lets go of what it
// holds), the connection closes, and others are served meanwhile.
func TestSilentClientTimesOut(t *testing.T) {
	handlerErr := make(chan error, 1)
	e := start(t, func(s *bulk.Server) {
		s.BodyIdleTimeout = 100 * time.Millisecond
		s.Handle("hold", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
			body, err := r.Body(1 << 20)
			if err != nil {
				return nil, err
			}
			_, err = io.ReadFull(body, make([]byte, 1<<20))
			handlerErr <- err
			return nil, err
		})
	})
	conn := partialBody(t, e.addr, "hold", wrapperspb.UInt64(0), 1000)
	// Silent from here on.
	select {
	case err := <-handlerErr:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the handler's read ended with %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's read never gave up on a silent client")
	}
	// The server hangs up (after its answer, if the socket takes it).
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("the server did not close the silent client's connection: %v", err)
	}
	c := bulk.NewClient()
	defer c.Close()
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), net.Buffers{{1, 2}}, nil); err != nil {
		t.Fatal(err)
	}
}

// flakyListener fails its first Accepts with a temporary error, as a
// listener out of file descriptors does.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

type temporaryErr struct{}

func (temporaryErr) Error() string   { return "accept: too many open files" }
func (temporaryErr) Temporary() bool { return true }
func (temporaryErr) Timeout() bool   { return false }

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	fail := l.fails > 0
	if fail {
		l.fails--
	}
	l.mu.Unlock()
	if fail {
		return nil, temporaryErr{}
	}
	return l.Listener.Accept()
}

// A temporary accept error (EMFILE) does not stop the server: it backs
// off and accepts again, for the data plane and for gRPC.
func TestTemporaryAcceptErrorsPass(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := bulk.NewServer()
	srv.Handle("sum", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
		body, err := r.Body(1)
		if err != nil {
			return nil, err
		}
		_, err = io.ReadFull(body, make([]byte, 1))
		return nil, err
	})
	g := srv.Listen(&flakyListener{Listener: lis, fails: 3})
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(g) }()
	defer func() { gs.Stop(); srv.Close(); <-served }()
	c := bulk.NewClient()
	defer c.Close()
	if err := c.Call(ctx(t), lis.Addr().String(), "sum", wrapperspb.UInt64(1), net.Buffers{{7}}, nil); err != nil {
		t.Fatalf("data plane after temporary accept errors: %v", err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("gRPC after temporary accept errors: %v", err)
	}
}

// requeueListener takes connections back (bulk.Requeuer).
type requeueListener struct {
	net.Listener
	back chan net.Conn
}

func (l *requeueListener) Requeue(c net.Conn) { l.back <- c }

// given returns the connection given back, failing t when none comes.
func (l *requeueListener) given(t *testing.T, what string) net.Conn {
	t.Helper()
	select {
	case c := <-l.back:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not given back", what)
		return nil
	}
}

// requeueing starts a server on a Requeuer listener on 127.0.0.1 and a
// client connection to it that has written first; it returns the
// listener, the server, gRPC's side of it and the client's connection.
func requeueing(t *testing.T, first string) (*requeueListener, *bulk.Server, net.Listener, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &requeueListener{Listener: lis, back: make(chan net.Conn, 1)}
	srv := bulk.NewServer()
	t.Cleanup(func() { srv.Close() })
	g := srv.Listen(rl)
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	return rl, srv, g, c
}

// A connection still being sniffed when Shutdown begins is given back to
// a Requeuer listener with the bytes already read replayed, not closed:
// the next server on the socket serves it whole.
func TestShutdownGivesUnservedConnectionsBack(t *testing.T) {
	rl, srv, g, c := requeueing(t, "PRI") // 3 of gRPC's 24-byte preface
	gs := grpc.NewServer()
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(g) }()
	// The sniff holds the connection, waiting for the rest of its first
	// 8 bytes, until Shutdown.
	testkit.Eventually(t, 10*time.Second, "the connection accepted", func() bool { open, _ := srv.PeerConns("127.0.0.1"); return open > 0 })
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	gs.Stop()
	<-served
	back := rl.given(t, "the unserved connection")
	if _, err := c.Write([]byte(" * HTTP/2.0")); err != nil {
		t.Fatalf("the client's connection was closed: %v", err)
	}
	_ = back.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 14)
	if _, err := io.ReadFull(back, got); err != nil {
		t.Fatalf("read the given-back connection: %v", err)
	}
	if string(got) != "PRI * HTTP/2.0" {
		t.Fatalf("the given-back connection reads %q, want the sniffed bytes then the rest", got)
	}
}

// lateListener returns the connection it accepted only once it is
// closed: the gRPC server gets it after its stop began, as happens when
// its Serve accepts just before the stop and the connection's goroutine
// runs just after.
type lateListener struct {
	net.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *lateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	<-l.closed
	return c, nil
}

func (l *lateListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// A connection the gRPC server accepted but closed at its stop without
// reading or writing a byte goes back to a Requeuer listener, whole,
// instead of resetting a client whose preface was sent.
func TestGRPCStopGivesUntouchedConnectionsBack(t *testing.T) {
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	rl, srv, g, _ := requeueing(t, preface)
	late := &lateListener{Listener: g, closed: make(chan struct{})}
	gs := grpc.NewServer()
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(late) }()
	testkit.Eventually(t, 10*time.Second, "the connection accepted", func() bool { open, _ := srv.PeerConns("127.0.0.1"); return open > 0 })
	gs.Stop() // hands the held connection to Serve after quit
	<-served
	back := rl.given(t, "the connection gRPC closed untouched")
	_ = back.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(preface))
	if _, err := io.ReadFull(back, got); err != nil {
		t.Fatalf("read the given-back connection: %v", err)
	}
	if string(got) != preface {
		t.Fatalf("the given-back connection reads %q, want the client's preface", got)
	}
}

// A connection gRPC read from is closed when gRPC closes it: only an
// untouched one goes back.
func TestGRPCClosesConnectionsItUsed(t *testing.T) {
	rl, _, g, c := requeueing(t, "not the data plane")
	sc, err := g.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the client's connection is still open after gRPC closed it")
	}
	select {
	case <-rl.back:
		t.Fatal("a connection gRPC read from was given back")
	default:
	}
}
