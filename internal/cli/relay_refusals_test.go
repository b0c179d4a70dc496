package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A version over the relay's --max-model-bytes shows on the relay's
// /metrics as rlhub_relay_versions_refused_total: before, Relay.Refusals
// counted it but no metric did, so a relay stuck on an old version for
// this reason was seen only in its log.
func TestRelayExportsItsRefusals(t *testing.T) {
	addr := serveCLI(t)
	if code, _, errOut := run(t, context.Background(), "ping", "--wait", "--hub", addr, "--timeout", "20s"); code != 0 {
		t.Fatalf("hub never healthy: %s", errOut)
	}
	hub, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	relayMetrics := freeAddr(t)
	if err := push(hub, "m", 1, storetest.Blob(t, 1, 4)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := run(t, ctx, "relay", "--upstream", addr, "--model", "m", "--no-shm", "--listen", "127.0.0.1:0",
			"--max-model-bytes", "2KiB", "--metrics-listen", relayMetrics)
		done <- code
	}()
	defer func() {
		cancel()
		testkit.Recv(t, done, 30*time.Second, "the relay stops")
	}()
	testkit.Eventually(t, 20*time.Second, "the relay exports no refusal yet", func() bool {
		return strings.Contains(get(relayMetrics, "/metrics"), "\nrlhub_relay_versions_refused_total 0\n")
	})
	if err := push(hub, "m", 2, storetest.Blob(t, 2, 1024)); err != nil { // 4 KiB of floats
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the relay exports its refusal of v2", func() bool {
		return strings.Contains(get(relayMetrics, "/metrics"), "\nrlhub_relay_versions_refused_total 1\n")
	})
}
