package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/reducer"
)

// serveOrRefusal runs `serve --listen 127.0.0.1:0 --data "" ARGS` in
// this process until it writes its address (then calls serving with the
// address and stops it as SIGINT would) or exits; it returns serve's exit
// code and stderr.
func serveOrRefusal(t *testing.T, serving func(addr string), args ...string) (int, string) {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	var code int
	var errOut string
	go func() {
		defer close(done)
		code, _, errOut = run(t, ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--data", ""}, args...)...)
	}()
	for {
		select {
		case <-done:
			return code, errOut
		case <-time.After(20 * time.Millisecond):
		}
		if b, err := os.ReadFile(addrFile); err == nil && strings.HasSuffix(string(b), "\n") {
			if serving != nil {
				serving(strings.TrimSpace(string(b)))
			}
			cancel()
			<-done
			return code, errOut
		}
	}
}

// TestServeReducerSecondariesZeroIsNotOne: --reducer-secondaries says
// "secondary reducers hosted here (-1: none)"; 0 must host none or be
// refused, not silently host one (reducer.Config: "0 means 1").
func TestServeReducerSecondariesZeroIsNotOne(t *testing.T) {
	code, errOut := serveOrRefusal(t, func(addr string) {
		c, err := reducer.NewClient(reducer.ClientConfig{Hub: addr})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		secs, err := c.Secondaries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(secs) != 0 {
			t.Errorf("serve --reducer-secondaries 0 hosts %d secondaries (%v)", len(secs), secs)
		}
	}, "--reducer-secondaries", "0")
	t.Logf("serve --reducer-secondaries 0: exit %d %s", code, strings.TrimSpace(errOut))
}

// TestServeZeroDurationsAreRefusedOrDocumented: a 0 given to these flags
// is replaced by the default (hub.Config/Limits: "0 means ..."):
// --stop-timeout 0 is a 5 s graceful stop, --body-min-rate 0 is 1 MiB/s,
// --max-wait 0 is 5 ms. Either serve refuses 0, or the flag's help says
// what 0 does.
func TestServeZeroDurationsAreRefusedOrDocumented(t *testing.T) {
	root := newRootCmd(nil, nil)
	serve, _, err := root.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"stop-timeout", "body-min-rate", "body-timeout", "frame-timeout", "idle-timeout", "max-wait", "max-streams-per-peer", "max-conns-per-peer", "auth-reload"} {
		usage := serve.Flags().Lookup(flag).Usage
		if strings.Contains(usage, "0:") || strings.Contains(usage, "0 means") {
			continue
		}
		code, errOut := serveOrRefusal(t, nil, "--"+flag, "0")
		if code == 0 {
			t.Errorf("serve --%s 0 was accepted (it means the default) and the help does not say what 0 does: %q", flag, usage)
		} else {
			t.Logf("serve --%s 0 refused: %s", flag, strings.TrimSpace(errOut))
		}
	}
}

// TestZeroAndNegativeLimitsAreRefused: the store, reducer and ARS configs
// read 0 as their default (store.Config: "0 means 128", ...), so serve
// --store-retain 0 silently kept 3 versions, --max-model-bytes 0 took
// 1 GiB pushes and --reduce-batch-size 0 batched 4 (and
// --ars-max-ended-runs 0 would keep 1,000 ended runs); worker ars
// --max-tasks 0 leased 8 and --retry-for 0 retried for 30 s. Each is now
// refused, naming the flag, and so is a negative value, which failed with
// the whole configuration struct printed ("hub: negative limit in
// {FrameTimeout:10s ...}") or, for a worker, only after it dialed.
func TestZeroAndNegativeLimitsAreRefused(t *testing.T) {
	for _, c := range [][2]string{
		{"reduce-batch-size", "0"}, {"reduce-journal-compact", "0"}, {"store-retain", "0"}, {"max-model-bytes", "0"},
		{"max-push-bytes-in-flight", "0"}, {"max-header-bytes", "0"}, {"max-name-bytes", "0"}, {"max-policy-params", "0"},
		{"max-policy-params", "-1"}, {"ars-max-ended-runs", "0"}, {"ars-max-ended-runs", "-1"},
		{"body-timeout", "-1s"}, {"frame-timeout", "-1s"}, {"idle-timeout", "-1s"},
	} {
		code, errOut := serveOrRefusal(t, nil, "--"+c[0], c[1])
		if code == 0 || !strings.Contains(errOut, "rlhub: --"+c[0]+" ") || strings.Contains(errOut, "{") {
			t.Errorf("serve --%s %s: exit %d, stderr %q; want it refused, naming the flag", c[0], c[1], code, strings.TrimSpace(errOut))
		}
	}
	for _, c := range [][2]string{{"max-tasks", "0"}, {"max-tasks", "-1"}, {"retry-for", "0"}} {
		// An address where no hub listens: a refused flag never dials.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code, _, errOut := run(t, ctx, "worker", "ars", "--hub", "127.0.0.1:1", "--"+c[0], c[1])
		cancel()
		if code == 0 || !strings.Contains(errOut, "rlhub: --"+c[0]+" ") {
			t.Errorf("worker ars --%s %s: exit %d, stderr %q; want it refused, naming the flag", c[0], c[1], code, strings.TrimSpace(errOut))
		}
	}
}
