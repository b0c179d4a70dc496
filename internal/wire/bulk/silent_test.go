package bulk_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// silentServer accepts connections and reads the client's hello, and then
// answers nothing, as a SIGSTOPped process does (the kernel completes the
// connection through the backlog). hellos receives one value per hello
// read whole.
func silentServer(t *testing.T) (addr string, hellos <-chan struct{}) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				if _, err := io.ReadFull(c, make([]byte, len(bulk.Hello("")))); err == nil {
					ch <- struct{}{}
				}
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String(), ch
}

// A call or stream whose handshake waits on a server that answers nothing
// ends when its context is cancelled, with the context's error — not when
// the handshake's own 10 s timeout runs out (a standby opening its stream
// to a primary that was SIGSTOPped and then replaced waited that long
// before it could take over: issue 15).
func TestHandshakeEndsOnCancel(t *testing.T) {
	addr, hellos := silentServer(t)
	c := bulk.NewClient()
	defer c.Close()
	calls := map[string]func(context.Context) error{
		"stream": func(ctx context.Context) error {
			s, err := c.Stream(ctx, addr, "echo", wrapperspb.UInt64(0))
			if err == nil {
				s.Close()
			}
			return err
		},
		"call": func(ctx context.Context) error {
			return c.Call(ctx, addr, "sum", wrapperspb.UInt64(1), nil, nil)
		},
	}
	for name, call := range calls {
		cctx, cancel := context.WithCancel(context.Background()) // no deadline: only the cancel ends it
		errc := make(chan error, 1)
		go func() { errc <- call(cctx) }()
		<-hellos // the client waits for Magic now
		cancel()
		// Well below the handshake's 10 s: the cancel, not the timeout,
		// ended the wait.
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s cancelled in its handshake: %v, want context.Canceled", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s cancelled in its handshake still waits after 5s", name)
		}
	}
}

// A handshake that gets no answer within ClientConfig.HandshakeTimeout
// while the call has time left — the server sent nothing, or the start of
// Magic and then nothing — fails with a NoAnswerError naming the address
// and the bound, which is Unavailable; a server that sent something else
// does not speak the data plane, and a call whose own deadline ended the
// wait fails with DeadlineExceeded.
func TestHandshakeWithoutAnswerIsNoAnswer(t *testing.T) {
	c := bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 200 * time.Millisecond})
	defer c.Close()
	call := func(ctx context.Context, addr string) error {
		return c.Call(ctx, addr, "sum", wrapperspb.UInt64(1), nil, nil)
	}
	for name, first := range map[string][]byte{"silent": testkit.Silent, "half-magic": []byte(bulk.Magic[:5])} {
		addr := testkit.SilentHub(t, first)
		err := call(context.Background(), addr)
		var na *bulk.NoAnswerError
		if !errors.As(err, &na) || na.Addr != addr || na.Op != "handshake" || na.Bound != 200*time.Millisecond ||
			!errors.Is(err, errs.ErrUnavailable) || grpcerr.Code(err) != codes.Unavailable {
			t.Errorf("%s: a handshake without an answer: %v, want a NoAnswerError for %s, Unavailable", name, err, addr)
		}
		if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "200ms") {
			t.Errorf("%s: %q does not name the address and the bound", name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // ends before the handshake's bound
		err = call(ctx, addr)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &na) {
			t.Errorf("%s: a handshake ended by the call's deadline: %v, want DeadlineExceeded", name, err)
		}
	}
	if err := call(context.Background(), testkit.SilentHub(t, testkit.HalfSettings)); !errors.Is(err, bulk.ErrNotSupported) {
		t.Errorf("a handshake answered by something else: %v, want ErrNotSupported", err)
	}
}
