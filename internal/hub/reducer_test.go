package hub

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestReducerStatsGoAPIMatchesRPC: Hub.Reducer().Stats() and the Stats RPC
// (what `rlhub reducer stats` prints) report the same numbers.
func TestReducerStatsGoAPIMatchesRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 8))
	h, c := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{Secondaries: 2, BatchSize: 1}}, model)
	for range 3 {
		if _, err := c.PushGrad(ctx, "m", 0, model); err != nil {
			t.Fatal(err)
		}
	}
	bad, _ := tensor.NewStateDict(tensor.NewF32("w", 9))
	if _, err := c.PushGrad(ctx, "m", 0, bad); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("push of a wrong shape: %v", err)
	}
	var st reducer.Stats
	testkit.Eventually(t, 20*time.Second, "3 applied and the queue empty", func() bool {
		st = h.Reducer().Stats()
		return st.Total.Applied == 3 && st.QueueDepth == 0
	})
	if st.Total.Pushed != 4 || st.Total.Dropped[reduce.ReasonInvalid] != 1 || st.Models["m"].Version != 4 || st.Models["m"].Counters.Applied != 3 {
		t.Fatalf("Go API stats %+v: want 4 pushed, 1 invalid, version 4", st)
	}
	got, err := c.HubStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	st.P50, st.P99 = st.P50.Truncate(time.Microsecond), st.P99.Truncate(time.Microsecond) // the RPC carries µs
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("RPC stats\n%+v\nGo API stats\n%+v", got, st)
	}
}
