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
