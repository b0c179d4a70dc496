package bulk_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/bulk/bulktest"
)

// helloRefuser refuses every hello (as a hub refuses a token it does not
// know).
type helloRefuser struct{}

func (helloRefuser) Check(ctx context.Context, _ string, _ *tls.ConnectionState, _ string, _ []byte) (context.Context, error) {
	return ctx, nil
}

func (helloRefuser) CheckHello(string, *tls.ConnectionState) error {
	return fmt.Errorf("%w: unknown token", errs.ErrUnauthenticated)
}

// A call or stream that failed before any byte of its request went onto a
// connection — a refused connect, a TLS handshake that failed, a hello the
// server reset, closed, refused or left unanswered — matches
// ErrNothingSent (as well as what it matched before): a reducer push that
// failed so was certainly not applied, and is not "outcome unknown". One
// that failed after the request started does not, also when the request
// went out on an idle connection whose server had gone and the new
// connection then failed to connect.
func TestNothingSent(t *testing.T) {
	refused := testkit.Listen(t)
	refusedAddr := refused.Addr().String()
	refused.Close()
	plain := bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 200 * time.Millisecond})
	defer plain.Close()
	withTLS := bulk.NewClientConfig(bulk.ClientConfig{TLS: &tls.Config{}, HandshakeTimeout: 200 * time.Millisecond})
	defer withTLS.Close()
	refusing := start(t, func(s *bulk.Server) { s.Guard = helloRefuser{} })
	cases := []struct {
		name string
		c    *bulk.Client
		addr string
		also error // what the error matches besides
		want bool  // nothing sent
	}{
		{"connect refused", plain, refusedAddr, errs.ErrUnavailable, true},
		{"hello reset", plain, bulktest.HangUp(t, false, true), errs.ErrUnavailable, true},
		{"hello closed", plain, bulktest.HangUp(t, false, false), bulk.ErrNotSupported, true},
		{"hello refused", plain, refusing.addr, errs.ErrUnauthenticated, true},
		{"hello unanswered", plain, testkit.SilentHub(t, testkit.Silent), errs.ErrUnavailable, true},
		{"TLS handshake failed", withTLS, testkit.SilentHub(t, []byte("HTTP/1.1 400 Bad Request\r\n\r\n")), errs.ErrUnavailable, true},
		{"request reset", plain, bulktest.HangUp(t, true, true), errs.ErrUnavailable, false},
		{"request closed", plain, bulktest.HangUp(t, true, false), errs.ErrUnavailable, false},
	}
	for _, c := range cases {
		calls := map[string]func() error{
			"call": func() error { return c.c.Call(ctx(t), c.addr, "sum", wrapperspb.UInt64(1), nil, nil) },
			"stream": func() error {
				s, err := c.c.Stream(ctx(t), c.addr, "sum", wrapperspb.UInt64(1))
				if err == nil {
					s.Close()
				}
				return err
			},
		}
		for kind, call := range calls {
			err := call()
			if !errors.Is(err, c.also) {
				t.Errorf("%s, %s: %v, want it to match %v", c.name, kind, err, c.also)
			}
			if got := errors.Is(err, bulk.ErrNothingSent); got != c.want {
				t.Errorf("%s, %s: %v matches ErrNothingSent: %v, want %v", c.name, kind, err, got, c.want)
			}
		}
	}
	var na *bulk.NoAnswerError
	if err := plain.Call(ctx(t), cases[4].addr, "sum", wrapperspb.UInt64(1), nil, nil); !errors.As(err, &na) {
		t.Errorf("a hello unanswered: %v, want a NoAnswerError still", err)
	}

	// The request went out on an idle connection whose server then
	// stopped (it may have read it), and the new connection was refused.
	e := start(t)
	if err := plain.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), [][]byte{{1, 2}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Shutdown(ctx(t)); err != nil {
		t.Fatal(err)
	}
	e.grpc.Stop()
	<-e.served
	err := plain.Call(ctx(t), e.addr, "sum", wrapperspb.UInt64(2), [][]byte{{1, 2}}, nil)
	if !errors.Is(err, errs.ErrUnavailable) || errors.Is(err, bulk.ErrNothingSent) {
		t.Errorf("a call whose idle connection broke, then refused: %v, want Unavailable, not ErrNothingSent", err)
	}
}
