package storerpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
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
