package reducer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
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
	sgd := reducer.ModelConfig{Model: "m", Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}
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
	seq := uint64(0)
	// step pushes one gradient at base of life and waits for base+1.
	step := func(base, life uint64) {
		t.Helper()
		seq++
		r, err := cl.PushLife(ctx, "m", base, life, seq, gradFor(n, "g", seq))
		if err != nil {
			t.Fatalf("push at version %d (life %d): %v", base, life, err)
		}
		if r.Addr != leaf.Addr() {
			t.Fatalf("push at version %d taken by %q, want the remote secondary %q", base, r.Addr, leaf.Addr())
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if snap, err := sc.WaitNewer(wctx, "m", base); err != nil || snap.Version != base+1 {
			t.Fatalf("the step from version %d: %v; output:\n%s\nsecondary's:\n%s", base, err, hubProc.Output(), leaf.Output())
		}
	}
	// stale reads the whole reducer's counters: the primary's hub merges
	// those of the secondaries in other processes (ClusterStats).
	stale := func() (drops, applied uint64) {
		t.Helper()
		st, err := cl.HubStats(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Unreachable) > 0 {
			t.Fatalf("stats: unreachable secondaries %v", st.Unreachable)
		}
		return st.Total.Dropped[reduce.ReasonStale], st.Total.Applied
	}

	if _, _, err := cl.Register(ctx, sgd); err != nil {
		t.Fatal(err)
	}
	step(1, 0)
	step(2, 0)
	old, err := sc.Get(ctx, "m", 0)
	if err != nil || old.Version != 3 || old.Life() == 0 {
		t.Fatalf("pull: version %d, life %d, %v; want version 3 of a known life", old.Version, old.Life(), err)
	}

	// Deleted, pushed again up to version 3 by another writer, registered.
	if err := sc.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	for v := uint64(1); v <= 3; v++ {
		if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blobOf(t, gradFor(n, "second life", v))}); err != nil {
			t.Fatal(err)
		}
	}
	if version, _, err := cl.Register(ctx, sgd); err != nil || version != 3 {
		t.Fatalf("register again: version %d, %v; want the new model's version 3", version, err)
	}
	now, err := sc.Get(ctx, "m", 0)
	if err != nil || now.Version != 3 || now.Life() == old.Life() {
		t.Fatalf("the new model: version %d, life %d (deleted one's %d), %v", now.Version, now.Life(), old.Life(), err)
	}
	staleBefore, appliedBefore := stale()

	seq++
	_, err = cl.PushLife(ctx, "m", 3, old.Life(), seq, gradFor(n, "g", seq))
	if !errors.Is(err, errs.ErrStale) || grpcerr.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), `"m"`) || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("gradient of the deleted model's version 3 through the remote secondary: %v; want FAILED_PRECONDITION naming model \"m\" and version 3", err)
	}
	staleAfter, appliedAfter := stale()
	if d := staleAfter - staleBefore; d != 1 || appliedAfter != appliedBefore {
		t.Fatalf("stats: %d more stale drops (want 1), applied %d → %d (want unchanged)", d, appliedBefore, appliedAfter)
	}
	hs, err := cl.HubStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if m := hs.Models["m"]; m.Version != 3 {
		t.Fatalf("the registration's version after the refusal: %d, want 3", m.Version)
	}
	got, err := sc.Get(ctx, "m", 0)
	if err != nil || got.Version != 3 || got.Life() != now.Life() {
		t.Fatalf("the new model after the refusal: version %d, life %d, %v; want version 3 of life %d", got.Version, got.Life(), err, now.Life())
	}
	want := gradFor(n, "second life", 3)
	for _, tt := range want.Tensors() {
		if !slices.Equal(f32s(t, got.Tensors, tt.Name), f32s(t, want, tt.Name)) {
			t.Fatalf("%s of the new model changed by the refused gradient", tt.Name)
		}
	}

	// The new model's life is trained through the same secondary.
	step(3, now.Life())
}
