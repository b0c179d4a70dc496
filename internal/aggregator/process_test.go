package aggregator

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func shareSizes(resp *rlhubv1.LearnResponse) (ids []string, rows []int64) {
	for _, s := range resp.Shares {
		ids = append(ids, s.LearnerId)
		rows = append(rows, s.Rows)
	}
	return ids, rows
}

// Three learner processes: demand merge, split sizes and order, info merge
// with homogeneous keys.
func TestProcessesDemandSplitAndInfo(t *testing.T) {
	h := newHarness(t, Config{})
	h.startLearners(t, childOpts{batchSize: 8}, childOpts{batchSize: 16}, childOpts{batchSize: 24})
	ctx := testCtx(t, 60*time.Second)

	st, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Learners, []string{"L1", "L2", "L3"}) {
		t.Fatalf("started %v", st.Learners)
	}
	d, err := h.client.GetDataDemand(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Demand.BatchSize != 48 || d.Demand.Fields.Fields["dim"].GetNumberValue() != 4 {
		t.Fatalf("merged demand = %v, want batch 48 and dim 4", d.Demand)
	}
	if !slices.Equal(d.Learners, []string{"L1", "L2", "L3"}) || !slices.Equal(d.BatchSizes, []int64{8, 16, 24}) {
		t.Fatalf("recorded order %v sizes %v", d.Learners, d.BatchSizes)
	}

	for _, rows := range []int64{48, 100} { // the demand exactly, then a bigger batch split proportionally
		batch := regressionBatch(t, rows, uint64(rows))
		resp, err := h.client.Learn(ctx, "t1", batch, map[string]string{"step": "7"})
		if err != nil {
			t.Fatal(err)
		}
		ids, sizes := shareSizes(resp)
		wantSizes := []int64{8, 16, 24}
		if rows == 100 {
			wantSizes = []int64{17, 33, 50} // 16.67, 33.33, 50: remainders .67 > .33
		}
		if !slices.Equal(ids, []string{"L1", "L2", "L3"}) || !slices.Equal(sizes, wantSizes) {
			t.Fatalf("rows %d: shares %v %v, want L1,L2,L3 %v", rows, ids, sizes, wantSizes)
		}
		checkExactlyOnce(t, resp, batch)
		if got := strs(field(resp.Info, "learner")); !slices.Equal(got, []string{"L1", "L2", "L3"}) {
			t.Fatalf("info learner = %v", got)
		}
		if v := field(resp.Info, "learner_step"); v.GetIntValue() != 7 { // an int, as the learners sent it
			t.Fatalf("homogeneous learner_step = %v, want single 7", v)
		}
		if v := field(resp.Info, "task_id"); v.GetStringValue() != "t1" {
			t.Fatalf("homogeneous task_id = %v, want single t1", v)
		}
		if len(resp.Failed) != 0 {
			t.Fatalf("failed = %v", resp.Failed)
		}
	}
}

// A learner SIGKILLed in the middle of Learn: the re-split result arrives
// within the deadline; the learner then rejoins and the next task uses it.
func TestProcessKilledMidLearnResplitThenRejoin(t *testing.T) {
	h := newHarness(t, Config{})
	ps := h.startLearners(t, childOpts{batchSize: 8}, childOpts{batchSize: 16, delay: time.Hour}, childOpts{batchSize: 24})
	ctx := testCtx(t, 60*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch := regressionBatch(t, 48, 1)
	type result struct {
		resp *rlhubv1.LearnResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := h.client.Learn(testCtx(t, 30*time.Second), "t1", batch, map[string]string{"step": "1"})
		done <- result{resp, err}
	}()
	ps[1].waitLine(t, "learn-begin 8 16") // L2 holds rows [8,24) and sleeps
	ps[1].kill()
	r := <-done // bounded by the 30s deadline
	if r.err != nil {
		t.Fatalf("Learn after SIGKILL: %v (want a re-split result)", r.err)
	}
	if !slices.Equal(r.resp.Failed, []string{"L2"}) {
		t.Fatalf("failed = %v, want [L2]", r.resp.Failed)
	}
	ids, sizes := shareSizes(r.resp)
	// L2's 16 rows re-split over L1 and L3 by their demand 8:24 → 4 and 12.
	if !slices.Equal(ids, []string{"L1", "L1", "L3", "L3"}) || !slices.Equal(sizes, []int64{8, 4, 12, 24}) {
		t.Fatalf("shares %v %v", ids, sizes)
	}
	checkExactlyOnce(t, r.resp, batch)

	// L2 comes back (same id, new process); the aggregator starts it on the
	// current task, and the next demand and learn include it.
	startLearner(t, h.addr, "L2", childOpts{batchSize: 16})
	h.waitAttached(t, "t1", "L1", "L3", "L2")
	d, err := h.client.GetDataDemand(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Learners, []string{"L1", "L3", "L2"}) || d.Demand.BatchSize != 48 {
		t.Fatalf("demand after rejoin: %v %v", d.Learners, d.Demand)
	}
	batch = regressionBatch(t, 48, 2)
	resp, err := h.client.Learn(ctx, "t1", batch, map[string]string{"step": "2"})
	if err != nil {
		t.Fatal(err)
	}
	ids, sizes = shareSizes(resp)
	if !slices.Equal(ids, []string{"L1", "L3", "L2"}) || !slices.Equal(sizes, []int64{8, 24, 16}) {
		t.Fatalf("after rejoin shares %v %v", ids, sizes)
	}
	checkExactlyOnce(t, resp, batch)
	st, _ := h.client.Status(ctx)
	if st.RemovedTotal != 1 || st.Resplits != 1 || st.AttachedTotal != 4 || st.LearnOk != 2 {
		t.Fatalf("status counters %+v", st)
	}

}

// With the fail policy, a learner SIGKILLed mid-Learn fails the task with an
// error naming it, within the deadline.
func TestProcessKilledMidLearnFailsClearly(t *testing.T) {
	h := newHarness(t, Config{OnFailure: PolicyFail})
	ps := h.startLearners(t, childOpts{batchSize: 8}, childOpts{batchSize: 16, delay: time.Hour}, childOpts{batchSize: 24})
	ctx := testCtx(t, 60*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Learn(testCtx(t, 30*time.Second), "t1", regressionBatch(t, 48, 1), nil)
		done <- err
	}()
	ps[1].waitLine(t, "learn-begin")
	ps[1].kill()
	err := <-done
	if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), `learner "L2"`) {
		t.Fatalf("Learn after SIGKILL with the fail policy: err = %v, want ErrUnavailable naming L2", err)
	}

	// Zero learners: kill the rest; Learn and Start fail clearly.
	ps[0].kill()
	ps[2].kill()
	h.waitAttached(t, "")
	if _, err := h.client.Learn(ctx, "t1", regressionBatch(t, 4, 1), nil); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "no learners") {
		t.Fatalf("Learn with zero learners: %v", err)
	}
	if _, err := h.client.Start(ctx, "t2", map[string]any{"w": testWeights}); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "no learners") {
		t.Fatalf("Start with zero learners: %v", err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("GetDataDemand with zero learners: %v", err)
	}
}

// A learner process returning malformed info fails the task with an error
// naming it and the key; nothing hangs and the learners stay usable.
// Under the strict rule a string among numbers is malformed (DI-engine's
// rule would list them as they are).
func TestProcessMalformedInfo(t *testing.T) {
	h := newHarness(t, Config{MergeRule: RuleStrict})
	h.startLearners(t, childOpts{batchSize: 8}, childOpts{batchSize: 8, badInfo: true}, childOpts{batchSize: 8})
	ctx := testCtx(t, 60*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	_, err := h.client.Learn(ctx, "t1", regressionBatch(t, 24, 1), map[string]string{"step": "1"})
	if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), `learner "L2"`) || !strings.Contains(err.Error(), `"loss_sum"`) {
		t.Fatalf("malformed info: err = %v, want ErrInvalid naming L2 and loss_sum", err)
	}
	if ids := h.learnerIDs(t, "t1"); len(ids) != 3 {
		t.Fatalf("learners after malformed info: %v", ids)
	}
}

// Membership changing between GetDataDemand and Learn never truncates or
// duplicates rows: a recorded learner leaves and a new one joins; every row
// is processed exactly once by the recorded learners still present, and the
// newcomer is used from the next demand on.
func TestMembershipChangeBetweenDemandAndLearn(t *testing.T) {
	h := newHarness(t, Config{})
	ps := h.startLearners(t, childOpts{batchSize: 10}, childOpts{batchSize: 20}, childOpts{batchSize: 30})
	ctx := testCtx(t, 60*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	ps[2].kill()
	h.waitAttached(t, "", "L1", "L2")
	startLearner(t, h.addr, "L4", childOpts{batchSize: 40})
	h.waitAttached(t, "t1", "L1", "L2", "L4")

	batch := regressionBatch(t, 60, 3) // sized for the recorded demand of 60
	resp, err := h.client.Learn(ctx, "t1", batch, map[string]string{"step": "1"})
	if err != nil {
		t.Fatal(err)
	}
	ids, sizes := shareSizes(resp)
	if !slices.Equal(ids, []string{"L1", "L2"}) || !slices.Equal(sizes, []int64{20, 40}) {
		t.Fatalf("recomputed split %v %v, want L1 20, L2 40", ids, sizes)
	}
	checkExactlyOnce(t, resp, batch)

	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch = regressionBatch(t, 70, 4)
	resp, err = h.client.Learn(ctx, "t1", batch, map[string]string{"step": "2"})
	if err != nil {
		t.Fatal(err)
	}
	ids, sizes = shareSizes(resp)
	if !slices.Equal(ids, []string{"L1", "L2", "L4"}) || !slices.Equal(sizes, []int64{10, 20, 40}) {
		t.Fatalf("next task split %v %v", ids, sizes)
	}
	checkExactlyOnce(t, resp, batch)
}

// Two of three learner processes SIGKILLed mid-Learn: both shares go to the
// one left, and every row is still processed exactly once.
func TestProcessTwoKilledMidLearnResplitOntoTheLast(t *testing.T) {
	h := newHarness(t, Config{})
	ps := h.startLearners(t, childOpts{batchSize: 8}, childOpts{batchSize: 16, delay: time.Hour}, childOpts{batchSize: 24, delay: time.Hour})
	ctx := testCtx(t, 60*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch := regressionBatch(t, 48, 5)
	type result struct {
		resp *rlhubv1.LearnResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := h.client.Learn(testCtx(t, 30*time.Second), "t1", batch, map[string]string{"step": "1"})
		done <- result{resp, err}
	}()
	ps[1].waitLine(t, "learn-begin")
	ps[2].waitLine(t, "learn-begin")
	ps[2].kill()
	ps[1].kill()
	r := <-done
	if r.err != nil {
		t.Fatalf("Learn after two SIGKILLs: %v", r.err)
	}
	slices.Sort(r.resp.Failed)
	if !slices.Equal(r.resp.Failed, []string{"L2", "L3"}) {
		t.Fatalf("failed = %v", r.resp.Failed)
	}
	for _, s := range r.resp.Shares {
		if s.LearnerId != "L1" {
			t.Fatalf("share %v went to a dead learner", s)
		}
	}
	checkExactlyOnce(t, r.resp, batch)
}
