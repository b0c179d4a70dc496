package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// `rlhub ping` answers for a relay as for a hub: a relay serves the gRPC
// health service (SERVING while it runs), so a probe tells whether it is
// up.
func TestPingRelay(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	relayAddr := freeAddr(t)
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan int, 1)
	go func() {
		code, _, _ := run(t, rctx, "relay", "--upstream", h.Addr().String(), "--model", "m", "--id", "relay-p", "--listen", relayAddr, "--no-shm")
		relayDone <- code
	}()
	defer func() { rcancel(); testkit.Recv(t, relayDone, 30*time.Second, "the relay to stop") }()
	code, out, errOut := run(t, ctx, "ping", "--hub", relayAddr, "--wait", "--timeout", "20s")
	if code != 0 || !strings.Contains(out, "SERVING") {
		t.Fatalf("ping a relay: exit %d, stdout %q, stderr %q; want SERVING", code, out, errOut)
	}
}
