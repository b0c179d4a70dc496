package storerpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// Calls under a context without a deadline to a hub that accepts the
// connection and never answers (silent), stops mid-message (half of an
// HTTP/2 SETTINGS frame), or completes the HTTP/2 preface and then
// answers nothing, fail with DeadlineExceeded once CallTimeout has passed,
// saying what they waited for; on gRPC and on the data plane.
func TestCallsWithoutDeadlineToSilentHubFail(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"half-sent", testkit.HalfSettings},
		{"preface-only", testkit.PrefaceOnly},
	} {
		for _, transport := range []string{"", "grpc"} {
			t.Run(hub.name+"/"+transport, func(t *testing.T) {
				c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: testkit.SilentHub(t, hub.first), Transport: transport, CallTimeout: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				bg := context.Background()
				for _, call := range []struct {
					name string
					do   func() error
				}{
					{"List", func() error { _, err := c.List(bg); return err }},
					{"Get", func() error { _, err := c.Get(bg, "m", 0); return err }},
					{"Push", func() error {
						_, err := c.Push(bg, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: make([]byte, 64)})
						return err
					}},
				} {
					done := make(chan error, 1)
					go func() { done <- call.do() }()
					var err error
					select {
					case err = <-done:
					case <-time.After(30 * time.Second):
						c.Close() // ends the call, so that its goroutine does not leak
						<-done
						t.Fatalf("%s without a deadline to a silent hub did not return within 30s", call.name)
					}
					if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "CallTimeout") {
						t.Errorf("%s to a silent hub: %v, want DeadlineExceeded naming CallTimeout", call.name, err)
					}
				}
			})
		}
	}
}

// A data-plane Get or Push to a hub that accepts the connection and sends
// nothing (or the start of Magic, then nothing) for a whole handshake
// tries it twice, not MaxAttempts times: it ends Unavailable, saying it
// was not tried again, with most of CallTimeout left (the retries spent
// five handshakes on it to end Unavailable all the same).
func TestSilentHandshakeIsTriedTwicePerCall(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"half-magic", []byte(bulk.Magic[:4])},
	} {
		for _, call := range []struct {
			name string
			do   func(c *storerpc.Client) error
		}{
			{"Get", func(c *storerpc.Client) error { _, err := c.Get(context.Background(), "m", 0); return err }},
			{"Push", func(c *storerpc.Client) error {
				_, err := c.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: make([]byte, 64)})
				return err
			}},
		} {
			t.Run(hub.name+"/"+call.name, func(t *testing.T) {
				addr, accepted := testkit.SilentHubCounting(t, hub.first)
				// Long enough for the default five attempts of 300 ms each.
				c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, CallTimeout: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				storerpc.SetBulk(c, bulk.NewClientConfig(bulk.ClientConfig{HandshakeTimeout: 300 * time.Millisecond}))
				err = call.do(c)
				var na *bulk.NoAnswerError
				if !errors.Is(err, errs.ErrUnavailable) || !errors.As(err, &na) || na.Addr != addr ||
					!strings.Contains(err.Error(), "not tried again") {
					t.Errorf("%s to a hub silent in the handshake: %v, want Unavailable, no answer from %s, not tried again", call.name, err, addr)
				}
				if n := accepted(); n != 2 {
					t.Errorf("%s to a hub silent in the handshake connected %d times, want 2", call.name, n)
				}
			})
		}
	}
}
