package reducer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
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
