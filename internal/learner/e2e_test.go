package learner_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// Data-parallel training end to end through one hub: a coordinator drives
// three example learners through the aggregator; each computes the gradient
// of its share on the model's newest version from the store and pushes it to
// the reducer, whose primary steps (SGD on the summed gradient) and
// publishes the next version. The weights converge to the generating ones.
func TestDataParallelTrainingThroughTheHub(t *testing.T) {
	quiet := testkit.Logger()
	h := hubtest.Start(t, hub.Config{Logger: quiet,
		Reducer: reducer.Config{BatchSize: 3, MaxWait: time.Minute}})
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const model, rows, steps = "linreg", 48, 25
	wTrue := []float32{1, -2, 0.5, 3}
	blob, err := safetensors.Encode(mustSD(t, tensor.NewF32("w", int64(len(wTrue)))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: model, Version: 1, Expect: 0, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "coordinator"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	// Sum of the shares' gradient sums = the batch's; lr 0.5/rows halves
	// the error per step for x ~ N(0, I).
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Reduction: reduce.Sum,
		Optimizer: optim.Config{Kind: optim.SGD, LR: 0.5 / rows}}); err != nil {
		t.Fatal(err)
	}

	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	for i := range 3 {
		ex := &learner.Example{ID: "l" + strconv.Itoa(i+1), BatchSize: rows / 3}
		closeClients, err := ex.UseHub(addr, model)
		if err != nil {
			t.Fatal(err)
		}
		cfg := ex.Config(addr)
		cfg.Logger = quiet
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer closeClients()
			learner.Run(lctx, cfg)
		}()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agg := aggregator.NewClient(conn)
	testkit.Eventually(t, time.Minute, "3 learners attached", func() bool {
		ls, err := agg.Resources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(ls) == 3
	})
	if _, err := agg.Start(ctx, "train", nil); err != nil {
		t.Fatal(err)
	}
	d, err := agg.GetDataDemand(ctx, "train")
	if err != nil || d.Demand.BatchSize != rows {
		t.Fatalf("demand %v, %v", d, err)
	}

	r := rand.New(rand.NewPCG(3, 4))
	for step := uint64(1); step <= steps; step++ {
		x := tensor.NewF32("x", rows, int64(len(wTrue)))
		xs, _ := x.Float32s()
		y := tensor.NewF32("y", rows)
		ys, _ := y.Float32s()
		for i := range ys {
			for j, wj := range wTrue {
				xs[i*len(wTrue)+j] = float32(r.NormFloat64())
				ys[i] += xs[i*len(wTrue)+j] * wj
			}
		}
		resp, err := agg.Learn(ctx, "train", mustSD(t, x, y), map[string]string{"step": strconv.FormatUint(step, 10)})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for _, v := range resp.Info.GetMapValue().GetFields()["version"].GetListValue().GetValues() {
			if uint64(v.GetIntValue()) != step {
				t.Fatalf("step %d: a learner computed on version %v", step, v)
			}
		}
		if _, err := h.Store().WaitNewer(ctx, model, step); err != nil {
			t.Fatalf("step %d: the reducer published no new version: %v", step, err)
		}
	}
	snap, err := h.Store().Get(ctx, model, 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Version != steps+1 {
		t.Fatalf("model at version %d after %d steps", snap.Version, steps)
	}
	w, _ := snap.Tensors.Get("w").Float32s()
	for j := range wTrue {
		if math.Abs(float64(w[j]-wTrue[j])) > 1e-3 {
			t.Fatalf("trained weights %v, generating weights %v", w, wTrue)
		}
	}
}

func mustSD(t *testing.T, ts ...*tensor.Tensor) *tensor.StateDict {
	t.Helper()
	sd, err := tensor.NewStateDict(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

// A learner whose attach is refused for good (here an id the hub does not
// take) returns the error instead of re-attaching forever.
func TestRunReturnsAPermanentRefusal(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	ex := &learner.Example{ID: "a b"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := learner.Run(ctx, ex.Config(h.Addr().String()))
	if !errors.Is(err, errs.ErrInvalid) || ctx.Err() != nil {
		t.Fatalf("Run with a refused id = %v (context %v), want InvalidArgument before the deadline", err, ctx.Err())
	}
	if strings.Contains(err.Error(), "context") {
		t.Fatalf("Run waited out its context: %v", err)
	}
}

// Learners' infos that merge past the hub's message bound (each well under
// it) fail the Learn with a clear error naming the bound, not a transport
// error that reads as retryable: the shares were learned, so a coordinator

// twoLearnerTask is an aggregator client of the hub at addr (its
// connection closed at the test's cleanup) once two learners are
// attached, with task "t" started and its demand asked for.
func twoLearnerTask(t *testing.T, ctx context.Context, addr string, opts ...grpc.DialOption) *aggregator.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	agg := aggregator.NewClient(conn)
	testkit.Eventually(t, time.Minute, "2 learners attached", func() bool {
		ls, err := agg.Resources(ctx)
		return err == nil && len(ls) == 2
	})
	if _, err := agg.Start(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := agg.GetDataDemand(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	return agg
}

// that redid the Learn would apply them twice.
func TestMergedInfoOverTheMessageBoundIsAClearError(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()}) // 4 MiB messages
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var learned sync.WaitGroup
	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	big := strings.Repeat("x", 3<<20) // 3 MiB: one learner's reply fits
	for _, id := range []string{"l1", "l2"} {
		cfg := learner.Config{Hub: addr, ID: id, Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
			OnDemand: func(context.Context, string) (learner.Demand, error) { return learner.Demand{BatchSize: 2}, nil },
			OnLearn: func(context.Context, *learner.LearnTask) (map[string]any, error) {
				learned.Done() // a gradient would be pushed here
				return map[string]any{"log": big}, nil
			}}
		wg.Go(func() { learner.Run(lctx, cfg) })
	}
	agg := twoLearnerTask(t, ctx, addr, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	learned.Add(2)
	_, err := agg.Learn(ctx, "t", mustSD(t, tensor.NewF32("x", 4, 2)), nil)
	learned.Wait()
	if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "merged info") {
		t.Fatalf("Learn whose merged info is over 4 MiB = %v, want InvalidArgument naming the merged info", err)
	}
}

// A learner whose reply is over the hub's message bound fails that share
// alone, with an error naming the bound: sent, the hub would refuse it and
// end the stream, failing the share as a lost learner and detaching it.
func TestReplyOverTheMessageBoundFailsThatShareAlone(t *testing.T) {
	var hubLog testkit.Buffer
	h := hubtest.Start(t, hub.Config{Logger: slog.New(slog.NewTextHandler(&hubLog, nil))}) // 4 MiB messages
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	var attaches, learns atomic.Int32
	for _, id := range []string{"a", "b"} {
		cfg := learner.Config{Hub: addr, ID: id, Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
			OnAttach: func() {
				if id == "a" {
					attaches.Add(1)
				}
			},
			OnDemand: func(context.Context, string) (learner.Demand, error) { return learner.Demand{BatchSize: 2}, nil },
			OnLearn: func(context.Context, *learner.LearnTask) (map[string]any, error) {
				if id == "a" && learns.Add(1) == 1 {
					return map[string]any{"log": strings.Repeat("x", 5<<20)}, nil
				}
				return map[string]any{"ok": 1}, nil
			}}
		wg.Go(func() { learner.Run(lctx, cfg) })
	}
	agg := twoLearnerTask(t, ctx, addr)
	for step, wantFailed := range [][]string{{"a"}, nil} { // a takes the next share
		res, err := agg.Learn(ctx, "t", mustSD(t, tensor.NewF32("x", 4, 2)), nil)
		if err != nil {
			t.Fatalf("Learn %d: %v", step, err)
		}
		var learners []string
		for _, s := range res.Shares {
			learners = append(learners, s.LearnerId)
		}
		if !slices.Equal(res.Failed, wantFailed) || !slices.Contains(learners, "a") == (step == 1) {
			t.Fatalf("Learn %d: failed %v, shares by %v; want failed %v, a sharing only in Learn 1", step, res.Failed, learners, wantFailed)
		}
	}
	st, err := agg.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.RemovedTotal != 0 || attaches.Load() != 1 {
		t.Fatalf("learner a removed %d time(s), attached %d time(s); want it attached throughout", st.RemovedTotal, attaches.Load())
	}
	if log := hubLog.String(); !strings.Contains(log, "exceeds the hub's message bound of 4194304 bytes") || strings.Contains(log, strings.Repeat("x", 1024)) {
		t.Fatalf("hub log does not name the bound (or echoes the info):\n%.4000s", log)
	}
}
