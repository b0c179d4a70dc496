package reducer_test

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/reducer"
)

// TestGradientOfADeletedModelIsRefusedThroughARemoteSecondary is
// TestGradientOfADeletedModelIsRefused with the gradient taken by a
// secondary in another process (`serve --role reducer --primary`), the
// only secondary there is: the life the push names must reach the
// primary in the forwarded Admit (ReducerAdmitRequest.base_life), or the
// primary cannot tell the deleted model's version 3 from the new one's.
// The gradient is refused FAILED_PRECONDITION (STALE_VERSION), counted
// stale once, and the new model's weights are unchanged; a gradient of the
// new life is then applied through the same secondary.
func TestGradientOfADeletedModelIsRefusedThroughARemoteSecondary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 64
	_, args := restoreOwnerFixture(t, n)
	hubProc := startProc(t, append(args, "--reducer-secondaries", "-1")...)
	defer hubProc.Kill()
	leaf := startProc(t, "serve", "--role", "reducer", "--primary", hubProc.Addr(), "--listen", "127.0.0.1:0", "--data", "", "--reduce-batch-size", "1", "--max-wait", "1ms")
	defer leaf.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := reducer.NewClient(reducer.ClientConfig{Hub: hubProc.Addr(), ClientID: "g"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sc := storeClient(t, hubProc.Addr())
	for {
		ss, err := cl.Secondaries(ctx)
		if err == nil && len(ss) == 1 && ss[0].Addr == leaf.Addr() {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("secondaries: %v, %v; want only the one at %s", ss, err, leaf.Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	steps := &gradSteps{t: t, ctx: ctx, hub: hubProc, cl: cl, sc: sc, n: n, via: leaf}
	refusesADeletedLifesGradient(steps, sgdOnM(), " through the remote secondary")
}
