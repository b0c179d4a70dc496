package bulk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

func TestBodyDeadline(t *testing.T) {
	for _, c := range []struct {
		allowance time.Duration
		rate, n   int64
		want      time.Duration
	}{
		{30 * time.Second, 1 << 20, 0, 30 * time.Second},
		{30 * time.Second, 1 << 20, 4 << 20, 34 * time.Second},
		{30 * time.Second, 0, 4 << 20, 30 * time.Second},
		{time.Second, 1, 1 << 62, 1 << 62}, // saturates
	} {
		if got := bulk.BodyDeadline(c.allowance, c.rate, c.n); got != c.want {
			t.Errorf("BodyDeadline(%v, %d, %d) = %v, want %v", c.allowance, c.rate, c.n, got, c.want)
		}
	}
}

// A client that sends its body a byte at a time, each byte well within
// BodyIdleTimeout, used to keep its request (and whatever its handler
// holds) for as long as it liked. Now the whole body is due within
// BodyTimeout + n/BodyMinRate: the request is answered DEADLINE_EXCEEDED
// naming the limit (not the client's input), the connection is closed,
// the handler's read failed, and the refusal is counted. A body sent
// slowly but within the bound, and other clients meanwhile, are served.
func TestTrickledBodyIsCutOff(t *testing.T) {
	handlerErr := make(chan error, 1)
	e := start(t, func(s *bulk.Server) {
		s.BodyIdleTimeout = 10 * time.Second // every byte comes well within it
		s.BodyTimeout = time.Second
		s.BodyMinRate = 1 << 20
		s.Handle("hold", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
			body, err := r.Body(64)
			if err != nil {
				return nil, err
			}
			_, err = io.ReadFull(body, make([]byte, 64))
			handlerErr <- err
			return nil, fmt.Errorf("model %q: %w", "m", err)
		})
	})
	// 64 bytes at one per 50 ms would take 3.2 s, past the 1 s bound.
	conn := partialBody(t, e.addr, "hold", wrapperspb.UInt64(0), 0)
	sent := testkit.Trickle(conn, pattern(64), 50*time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() { // an honest client meanwhile
		c := bulk.NewClient()
		defer c.Close()
		if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), net.Buffers{{1, 2}}, nil); err != nil {
			t.Errorf("a client beside the trickling one: %v", err)
		}
	})
	select {
	case err := <-handlerErr:
		if !errors.Is(err, bulk.ErrBodyDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the handler's read ended with %v, want ErrBodyDeadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler's read never gave up on a trickling client")
	}
	code, msg := readFinal(t, conn)
	if code != codes.DeadlineExceeded || !strings.Contains(msg, "body timeout") || strings.Contains(msg, `"m"`) {
		t.Fatalf("answer %v %q, want DeadlineExceeded naming the body timeout, not the handler's words", code, msg)
	}
	<-sent
	wg.Wait()
	testkit.Eventually(t, 10*time.Second, "the cut-off counted", func() bool {
		st := e.srv.Stats()
		for _, r := range st.Requests {
			if r.Method == "hold" && r.Code == codes.DeadlineExceeded && r.N == 1 {
				return st.Refused[bulk.RefusedBodyTimeout] == 1
			}
		}
		return false
	})

	// Slow but within the bound: two halves with a pause between.
	conn = partialBody(t, e.addr, "sum", wrapperspb.UInt64(64), 32)
	time.Sleep(100 * time.Millisecond)
	if _, err := conn.Write(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	if code, msg := readFinalKeep(t, conn); code != codes.OK {
		t.Fatalf("a slow body within the bound: %v %q", code, msg)
	}
	c := bulk.NewClient()
	defer c.Close()
	if err := c.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), net.Buffers{{1, 2}}, nil); err != nil {
		t.Fatalf("a client after the cut-off: %v", err)
	}
}

// A reply's body has the bound a request body has: a client that reads
// it steadily, each piece well within the idle bound, but too slowly to
// take it all within BodyTimeout + its length at BodyMinRate, has the
// reply cut (the handler's Reply fails, the connection closes) instead
// of holding the bytes it reads — a store version — for as long as it
// likes. Before, only each 4 MiB piece had a deadline.
func TestSlowReaderOfAReplyIsCutOff(t *testing.T) {
	const size = 64 << 20
	replied := make(chan error, 1)
	e := start(t, func(s *bulk.Server) {
		s.BodyIdleTimeout = 10 * time.Second // every piece is taken well within it
		s.BodyTimeout = 2 * time.Second
		s.BodyMinRate = 1 << 30 // 64 MiB due in 2.06 s
		body := make([]byte, size)
		s.Handle("big", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
			err := r.Reply([]byte("h"), body)
			replied <- err
			return nil, err
		})
	})
	conn := rawConn(t, e.addr)
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(64 << 10)
	}
	if _, err := conn.Write(bulk.RequestFrame("big", nil)); err != nil {
		t.Fatal(err)
	}
	// 64 KiB every 10 ms: about 6 MB/s, a 4 MiB piece in under a second,
	// the whole reply in about 10 s.
	read := make(chan int64, 1)
	go func() {
		var n int64
		buf := make([]byte, 64<<10)
		for {
			k, err := conn.Read(buf)
			n += int64(k)
			if err != nil {
				read <- n
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	select {
	case err := <-replied:
		if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "not taken within its deadline") {
			t.Fatalf("the slow reader's reply ended with %v, want the reply deadline", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reply never gave up on a slow reader")
	}
	if n := <-read; n >= size {
		t.Fatalf("the slow reader got the whole reply (%d bytes) before the connection closed", n)
	}
	// Counted once the connection closed (the read ended).
	if n := e.srv.Stats().Refused[bulk.RefusedReplyTimeout]; n != 1 {
		t.Fatalf("%d replies counted not taken, want 1", n)
	}
	// A reader at full speed is served the same reply.
	c := bulk.NewClient()
	defer c.Close()
	var got int64
	err := c.CallRecv(ctx(t), e.addr, "big", wrapperspb.UInt64(0), nil, func(_ []byte, n int64, r io.Reader) error {
		var err error
		got, err = io.Copy(io.Discard, r)
		return err
	}, nil)
	if err != nil || got != size {
		t.Fatalf("a fast reader: %d bytes, %v; want %d", got, err, size)
	}
	if n := e.srv.Stats().Refused[bulk.RefusedReplyTimeout]; n != 1 {
		t.Fatalf("%d replies counted not taken after a fast reader, want 1", n)
	}
}

// TestSilentBodyIsAnsweredAndCountedOnce: a client that sends part of a
// body and falls silent fails after one BodyIdleTimeout: the handler's
// read failed, and the server then waited a second BodyIdleTimeout to
// drop the rest, hung up without an answer, and counted no refusal. It
// now answers DeadlineExceeded naming the idle bound, counts a
// body_timeout refusal, and hangs up.
func TestSilentBodyIsAnsweredAndCountedOnce(t *testing.T) {
	e := start(t, func(s *bulk.Server) { s.BodyIdleTimeout = 300 * time.Millisecond })
	conn := partialBody(t, e.addr, "sum", wrapperspb.UInt64(1000), 10) // 10 of 1000, then silence
	code, msg := readFinal(t, conn)
	if code != codes.DeadlineExceeded || !strings.Contains(msg, "BodyIdleTimeout") {
		t.Fatalf("a body fallen silent: %v %q, want DeadlineExceeded naming BodyIdleTimeout", code, msg)
	}
	if n := e.srv.Stats().Refused[bulk.RefusedBodyTimeout]; n != 1 {
		t.Fatalf("body_timeout refusals: %d, want 1", n)
	}
}
