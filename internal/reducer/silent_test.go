package reducer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A push under a context without a deadline (context.Background(), as a
// user passes) to a hub that accepts the connection and never answers, or
// stops mid-message, fails with DeadlineExceeded once CallTimeout has
// passed, instead of retrying the listing of secondaries forever.
func TestPushWithoutDeadlineToSilentHubFails(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{{"silent", testkit.Silent}, {"half-sent", testkit.HalfSettings}} {
		t.Run(hub.name, func(t *testing.T) {
			c, err := NewClient(ClientConfig{Hub: testkit.SilentHub(t, hub.first), CallTimeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			done := make(chan error, 1)
			go func() {
				_, err := c.PushGrad(context.Background(), "m", 1, testLayout(4))
				done <- err
			}()
			var err2 error
			select {
			case err2 = <-done:
			case <-time.After(30 * time.Second):
				c.Close() // ends the push, so that its goroutine does not leak
				<-done
				t.Fatal("a push without a deadline to a silent hub did not return within 30s")
			}
			if !errors.Is(err2, context.DeadlineExceeded) || !strings.Contains(err2.Error(), "CallTimeout") {
				t.Fatalf("push to a silent hub: %v, want DeadlineExceeded naming CallTimeout", err2)
			}
		})
	}
}

// listingHub is a primary hub that lists one secondary at addr (a hub
// that is not this one).
type listingHub struct {
	rlhubv1.UnimplementedReducerServer
	addr string
}

func (h *listingHub) Secondaries(context.Context, *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	return &rlhubv1.ReducerSecondariesResponse{Secondaries: []*rlhubv1.ReducerSecondary{{Addr: h.addr, Id: "s0"}}}, nil
}

// A data-plane push to a secondary whose hub accepts the connection and
// sends nothing (or the start of Magic, then nothing) for a whole
// handshake tries it twice, not until CallTimeout: it ends Unavailable,
// saying it was not tried again, as storerpc's calls do (the retries spent
// twelve 10 s handshakes of the default 2 min on it, to end Unavailable
// all the same).
func TestSilentSecondaryIsTriedTwicePerPush(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"half-magic", []byte(bulk.Magic[:4])},
	} {
		t.Run(hub.name, func(t *testing.T) {
			sec, accepted := testkit.SilentHubCounting(t, hub.first)
			primary := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterReducerServer(g, &listingHub{addr: sec}) })
			// Time for some ten handshakes of 300 ms.
			c, err := NewClient(ClientConfig{Hub: primary, CallTimeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.bulk.Close()
			c.bulk = bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 300 * time.Millisecond})
			_, err = c.PushGrad(context.Background(), "m", 1, testLayout(4))
			var na *bulk.NoAnswerError
			if !errors.Is(err, errs.ErrUnavailable) || !errors.As(err, &na) || na.Addr != sec ||
				!strings.Contains(err.Error(), "not tried again") {
				t.Errorf("push to a secondary silent in the handshake: %v, want Unavailable, no answer from %s, not tried again", err, sec)
			}
			if n := accepted(); n != 2 {
				t.Errorf("push to a secondary silent in the handshake connected %d times, want 2", n)
			}
		})
	}
}

// A data-plane connect or handshake with no answer sent nothing of the
// push: it does not make the push's outcome unknown (sentNothing), which on
// a cluster whose primary changed meanwhile failed it ErrOutcomeUnknown,
// counted lost, though it was certainly not applied. The no-answer is the
// data-plane client's own (bulk.ErrNothingSent), from a real silent hub.
func TestNoAnswerIsNothingSent(t *testing.T) {
	bc := bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 100 * time.Millisecond})
	defer bc.Close()
	na := bc.Call(context.Background(), testkit.SilentHub(t, testkit.Silent), BulkPushMethod, &rlhubv1.ReducerPushHeader{}, nil, nil)
	if !errors.As(na, new(*bulk.NoAnswerError)) {
		t.Fatalf("a call to a silent hub: %v, want a NoAnswerError", na)
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"no answer", na, true},
		{"no answer, not tried again", fmt.Errorf("%w (2 times in this call: not tried again)", na), true},
		{"dial refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"read reset", &net.OpError{Op: "read", Err: errors.New("connection reset")}, false},
		{"unavailable", fmt.Errorf("%w: bulk: call: broken", errs.ErrUnavailable), false},
	} {
		if got := sentNothing(c.err); got != c.want {
			t.Errorf("%s: sentNothing %v, want %v", c.name, got, c.want)
		}
	}
}
