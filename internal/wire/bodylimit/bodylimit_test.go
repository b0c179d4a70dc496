package bodylimit_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The interceptor's handler goroutines, and those of streams it cut, end
// with the server.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The exchange: the client sends bodies (a HostResult announcing
// params.total_bytes, then chunks); for each one received whole the server
// answers with a body of replyBytes (a HostStep announcing grad, then
// chunks). Push: a one-body stream ("/rlhub.test.Bodies/Push").
const (
	exchange   = "/rlhub.test.Bodies/Exchange"
	push       = "/rlhub.test.Bodies/Push"
	replyBytes = 32 << 20
	chunkBytes = 64 << 10
	// minRate: a reply is due within the allowance + 4 s, a 1 MiB body
	// within the allowance + 125 ms.
	minRate = 8 << 20
)

var rules = map[string]bodylimit.Rule{
	exchange: {
		Recv: func(m proto.Message) (uint64, bool) {
			r, ok := m.(*rlhubv1.HostMessage)
			return r.GetResult().GetParams().GetTotalBytes(), ok && r.GetResult() != nil
		},
		Send: func(m proto.Message) (uint64, bool) {
			r, ok := m.(*rlhubv1.PrimaryMessage)
			return r.GetStep().GetGrad().GetTotalBytes(), ok && r.GetStep() != nil
		},
	},
	push: {Push: true, Recv: func(m proto.Message) (uint64, bool) {
		r, ok := m.(*rlhubv1.HostMessage)
		return r.GetResult().GetParams().GetTotalBytes(), ok && r.GetResult() != nil
	}},
}

type server struct {
	lim      *bodylimit.Limiter
	addr     string
	returned chan error // each handler's result, as it returns
}

func start(t *testing.T, allowance time.Duration) *server {
	t.Helper()
	s := &server{lim: bodylimit.New(bodylimit.Config{Allowance: allowance, MinRate: minRate, Rules: rules, Logger: testkit.Logger()}),
		returned: make(chan error, 16)}
	reply := make([]byte, replyBytes)
	handler := func(replies bool) grpc.StreamHandler {
		return func(_ any, ss grpc.ServerStream) error { return s.handle(ss, replies, reply) }
	}
	g := grpc.NewServer(grpc.StreamInterceptor(s.lim.StreamInterceptor()))
	g.RegisterService(&grpc.ServiceDesc{ServiceName: "rlhub.test.Bodies", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{
		{StreamName: "Exchange", Handler: handler(true), ServerStreams: true, ClientStreams: true},
		{StreamName: "Push", Handler: handler(false), ClientStreams: true},
	}}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		s.lim.Wait()
	})
	return s
}

// handle serves a stream: it receives bodies and, with replies, answers
// each one received whole with reply.
func (s *server) handle(ss grpc.ServerStream, replies bool, reply []byte) (err error) {
	defer func() { s.returned <- err }()
	need := int64(-1)
	for {
		var m rlhubv1.HostMessage
		if err := ss.RecvMsg(&m); errors.Is(err, io.EOF) {
			// The client's half ended: one last message (a
			// client-streaming call's answer), no body.
			return ss.SendMsg(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Welcome{Welcome: &rlhubv1.HostWelcome{}}})
		} else if err != nil {
			return err
		}
		if r := m.GetResult(); r != nil {
			need = int64(r.GetParams().GetTotalBytes())
			continue
		}
		need -= int64(len(m.GetChunk().GetData()))
		if need != 0 || !replies {
			continue
		}
		if err := ss.SendMsg(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Step{Step: &rlhubv1.HostStep{
			Grad: &rlhubv1.BlobInfo{TotalBytes: replyBytes}}}}); err != nil {
			return err
		}
		for b := reply; len(b) > 0; b = b[chunkBytes:] {
			if err := ss.SendMsg(&rlhubv1.PrimaryMessage{Body: &rlhubv1.PrimaryMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b[:chunkBytes]}}}); err != nil {
				return err
			}
		}
	}
}

func (s *server) open(t *testing.T, ctx context.Context, method string) grpc.ClientStream {
	t.Helper()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: method == exchange, ClientStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// sendBody sends a body of n bytes, of which only the first sent.
func sendBody(t *testing.T, cs grpc.ClientStream, n, sent int) {
	t.Helper()
	if err := cs.SendMsg(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
		Params: &rlhubv1.BlobInfo{TotalBytes: uint64(n)}}}}); err != nil {
		t.Fatal(err)
	}
	for b := make([]byte, sent); len(b) > 0; {
		k := min(len(b), chunkBytes)
		if err := cs.SendMsg(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b[:k]}}}); err != nil {
			t.Fatal(err)
		}
		b = b[k:]
	}
}

// readReply reads one reply body whole.
func readReply(t *testing.T, cs grpc.ClientStream) {
	t.Helper()
	var head rlhubv1.PrimaryMessage
	if err := cs.RecvMsg(&head); err != nil || head.GetStep().GetGrad().GetTotalBytes() != replyBytes {
		t.Fatalf("reply head: %v, %v", &head, err)
	}
	for got := 0; got < replyBytes; {
		var m rlhubv1.PrimaryMessage
		if err := cs.RecvMsg(&m); err != nil {
			t.Fatalf("reply after %d bytes: %v", got, err)
		}
		got += len(m.GetChunk().GetData())
	}
}

// finalStatus reads on until the stream fails and returns its status.
func finalStatus(cs grpc.ClientStream) *status.Status {
	for {
		var m rlhubv1.PrimaryMessage
		if err := cs.RecvMsg(&m); errors.Is(err, io.EOF) {
			return status.New(codes.OK, "")
		} else if err != nil {
			return status.Convert(err)
		}
	}
}

// Bodies sent and taken within their deadlines, with pauses longer than
// the allowance between them, are never cut: only a body in progress is
// bounded, in either direction.
func TestBodiesWithinTheirDeadlinesAreServed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := start(t, time.Second)
	cs := s.open(t, ctx, exchange)
	for range 3 {
		sendBody(t, cs, 1<<20, 1<<20)
		readReply(t, cs)
		time.Sleep(1200 * time.Millisecond) // idle between bodies: allowed
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if st := finalStatus(cs); st.Code() != codes.OK {
		t.Fatalf("the exchange ended with %v", st.Err())
	}
	if st := s.lim.Stats(); st != (bodylimit.Stats{}) {
		t.Fatalf("stats %+v after bodies within their deadlines", st)
	}
}

// A body that stops half-way is cut at its deadline: DEADLINE_EXCEEDED
// naming the limit, the handler's receive fails and it returns.
func TestHalfSentBodyIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := start(t, time.Second)
	cs := s.open(t, ctx, exchange)
	sendBody(t, cs, 1<<20, 1<<20)
	readReply(t, cs)
	sendBody(t, cs, 1<<20, 1<<19) // and then nothing
	st := finalStatus(cs)
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "body-timeout") {
		t.Fatalf("the half-sent body ended the stream with %v, want DEADLINE_EXCEEDED naming the body timeout", st.Err())
	}
	if err := <-s.returned; err == nil {
		t.Fatal("the handler of the cut stream returned nil")
	}
	if st := s.lim.Stats(); st != (bodylimit.Stats{Received: 1}) {
		t.Fatalf("stats %+v, want one received body cut", st)
	}
}

// A reply the client does not take is cut at its deadline: UNAVAILABLE
// naming the limit, the handler's send fails and it returns, dropping
// what it was sending.
func TestUntakenReplyIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := start(t, time.Second)
	cs := s.open(t, ctx, exchange)
	sendBody(t, cs, 1<<20, 1<<20) // and read nothing
	select {
	case err := <-s.returned:
		if err == nil {
			t.Fatal("the handler of the cut stream returned nil")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler still sends a reply nobody reads")
	}
	if st := finalStatus(cs); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "body-timeout") {
		t.Fatalf("the untaken reply ended the stream with %v, want UNAVAILABLE naming the body timeout", st.Err())
	}
	if st := s.lim.Stats(); st != (bodylimit.Stats{Sent: 1}) {
		t.Fatalf("stats %+v, want one sent body cut", st)
	}
}

// A push stream's first message is due within the allowance, and its body
// within its deadline from the stream's start; a push that sends its whole
// body and then never closes its half is cut too (its handler waits for
// the end).
func TestPushIsBoundFromItsStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := start(t, time.Second)
	silent := s.open(t, ctx, push)
	whole := s.open(t, ctx, push)
	sendBody(t, whole, 1<<20, 1<<20) // whole, never closed
	for name, cs := range map[string]grpc.ClientStream{"silent": silent, "never closed": whole} {
		st := status.Convert(cs.RecvMsg(&rlhubv1.PrimaryMessage{}))
		if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "body-timeout") {
			t.Errorf("%s push: %v, want DEADLINE_EXCEEDED naming the body timeout", name, st.Err())
		}
	}
	if st := s.lim.Stats(); st != (bodylimit.Stats{Received: 2}) {
		t.Fatalf("stats %+v, want two received bodies cut", st)
	}
	// A push that closes in time is served.
	ok := s.open(t, ctx, push)
	sendBody(t, ok, 1<<10, 1<<10)
	if err := ok.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var answer rlhubv1.PrimaryMessage
	if err := ok.RecvMsg(&answer); err != nil || answer.GetWelcome() == nil {
		t.Fatalf("a push closed in time: %v, %v", &answer, err)
	}
}
