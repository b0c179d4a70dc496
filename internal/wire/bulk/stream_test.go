package bulk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// serveEcho registers "echo": header UInt64Value n; n == 0 is refused
// before the stream opens; otherwise the handler opens a stream, checks
// that a stream's request takes neither Body nor Reply, then answers each
// 4-byte frame from the client with the same bytes reversed, n times, and
// ends with an OK status.
func serveEcho(misuse chan<- error) func(*bulk.Server) {
	return func(s *bulk.Server) {
		s.Handle("echo", func(_ context.Context, r *bulk.Request) (proto.Message, error) {
			n, err := announced(r)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				return nil, fmt.Errorf("%w: echo: zero frames", errs.ErrInvalid)
			}
			st, err := r.Stream()
			if err != nil {
				return nil, err
			}
			_, berr := r.Body(1)
			misuse <- errors.Join(berr, r.Reply([]byte("h")))
			_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
			for range n {
				var f [4]byte
				if _, err := io.ReadFull(st, f[:]); err != nil {
					return nil, err
				}
				f[0], f[1], f[2], f[3] = f[3], f[2], f[1], f[0]
				if err := st.Write(net.Buffers{f[:]}); err != nil {
					return nil, err
				}
			}
			return wrapperspb.UInt64(n), nil
		})
	}
}

// A stream carries the method's frames both ways and ends with the
// server's final status; a refusal before it opens is the client's error;
// a stream's handler cannot also Reply or take a Body.
func TestStreamCarriesFramesBothWays(t *testing.T) {
	misuse := make(chan error, 1)
	e := start(t, serveEcho(misuse))
	c := bulk.NewClient()
	defer c.Close()

	if _, err := c.Stream(ctx(t), e.addr, "echo", wrapperspb.UInt64(0)); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("a refused stream: %v, want ErrInvalid", err)
	}
	s, err := c.Stream(ctx(t), e.addr, "echo", wrapperspb.UInt64(3))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := <-misuse; err == nil || !strings.Contains(err.Error(), "Body after Stream") || !strings.Contains(err.Error(), "Reply after Stream") {
		t.Fatalf("Body and Reply after Stream: %v, want both refused", err)
	}
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	for _, f := range []string{"abcd", "wxyz", "1234"} {
		if err := s.Write(net.Buffers{[]byte(f)}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		var got [4]byte
		if _, err := io.ReadFull(s.Reader(), got[:]); err != nil {
			t.Fatal(err)
		}
		if want := string([]byte{f[3], f[2], f[1], f[0]}); string(got[:]) != want {
			t.Fatalf("echo of %q: %q, want %q", f, got, want)
		}
	}
	kind, err := s.Reader().ReadByte()
	if err != nil || kind != bulk.KindFinal {
		t.Fatalf("after the frames: kind %d, %v; want the final status", kind, err)
	}
	if err := s.Final(); err != nil {
		t.Fatalf("final status: %v", err)
	}
}
