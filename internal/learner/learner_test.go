package learner

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The session's watcher leaves on any state but READY, except the
// CONNECTING a channel may still report just after a Welcome: grpc-go
// lets RPCs through on the READY picker before the channel says READY
// (once, in CI, that detached a learner right after it attached).
func TestLeftHub(t *testing.T) {
	for _, tc := range []struct {
		st        connectivity.State
		seenReady bool
		want      bool
	}{
		{connectivity.Ready, false, false},
		{connectivity.Ready, true, false},
		{connectivity.Connecting, false, false},
		{connectivity.Connecting, true, true},
		{connectivity.Idle, false, true}, // a GOAWAY before the watcher ran
		{connectivity.Idle, true, true},
		{connectivity.TransientFailure, false, true},
		{connectivity.Shutdown, false, true},
	} {
		if got := leftHub(tc.st, tc.seenReady); got != tc.want {
			t.Errorf("leftHub(%v, seenReady=%v) = %v, want %v", tc.st, tc.seenReady, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func(ctx context.Context, t *LearnTask) (map[string]any, error) { return nil, nil }
	dem := func(ctx context.Context, id string) (Demand, error) { return Demand{}, nil }
	for name, cfg := range map[string]Config{
		"no id":       {Hub: "x", OnDemand: dem, OnLearn: ok},
		"no hub":      {ID: "a", OnDemand: dem, OnLearn: ok},
		"no OnLearn":  {ID: "a", Hub: "x", OnDemand: dem},
		"no OnDemand": {ID: "a", Hub: "x", OnLearn: ok},
		"bad backoff": {ID: "a", Hub: "x", OnDemand: dem, OnLearn: ok, Backoff: -1},
	} {
		if err := Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: Run succeeded", name)
		}
	}
}

// Run keeps trying to attach to a hub that is not there and returns ctx's
// cause when ctx ends.
func TestRunStopsWithContextWithoutHub(t *testing.T) {
	addr := testkit.FreeAddr(t) // nothing listens there; below the ephemeral range, no source port either
	ex := &Example{ID: "a"}
	cause := errors.New("test over")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(cause) })
	if err := Run(ctx, ex.Config(addr)); !errors.Is(err, cause) {
		t.Fatalf("Run = %v, want the context's cause", err)
	}
}

func TestLinearGradAgainstHandComputation(t *testing.T) {
	x := tensor.FromFloat32s("x", []int64{2, 2}, []float32{1, 2, 3, 4})
	y := tensor.FromFloat32s("y", []int64{2}, []float32{1, 0})
	sd, _ := tensor.NewStateDict(x, y)
	w := []float32{0.5, -1}
	// r0 = 0.5 - 2 - 1 = -2.5; r1 = 1.5 - 4 - 0 = -2.5
	// grad = r0*[1,2] + r1*[3,4] = [-10, -15]; loss = ½(6.25+6.25) = 6.25
	g, loss, err := LinearGrad(sd, w)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(g[0]+10) > 1e-9 || math.Abs(g[1]+15) > 1e-9 || math.Abs(loss-6.25) > 1e-9 {
		t.Fatalf("grad %v loss %v, want [-10 -15] 6.25", g, loss)
	}
	if _, _, err := LinearGrad(sd, []float32{1, 2, 3}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("wrong dimension: %v", err)
	}
	noY, _ := tensor.NewStateDict(x)
	if _, _, err := LinearGrad(noY, w); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("missing y: %v", err)
	}
}

func TestExampleRefusesTaskWithoutWeights(t *testing.T) {
	ex := &Example{ID: "a"}
	for _, info := range []map[string]any{{}, {"w": []any{}}, {"w": []any{"x"}}, {"w": 3.0}} {
		if err := ex.OnStart(context.Background(), "t", info); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("OnStart(%v) = %v, want ErrInvalid", info, err)
		}
	}
	if err := ex.OnStart(context.Background(), "t", map[string]any{"w": []any{1.0, 2.0}}); err != nil {
		t.Fatal(err)
	}
	d, err := ex.OnDemand(context.Background(), "t")
	if err != nil || d.BatchSize != 32 || d.Fields["dim"] != 2 {
		t.Fatalf("demand %+v, %v", d, err)
	}
}

// With Weights and Push set, the example reads the model's weights and
// pushes the share's gradient sum computed on that version.
func TestExamplePushesGradientOnItsVersion(t *testing.T) {
	var pushed []float32
	var pushedVersion uint64
	ex := &Example{ID: "a",
		Weights: func(ctx context.Context) ([]float32, uint64, uint64, error) { return []float32{0.5, -1}, 9, 0, nil },
		Push: func(ctx context.Context, v, _ uint64, g *tensor.StateDict) error {
			pushedVersion = v
			f, err := g.Get("w").Float32s()
			pushed = append([]float32(nil), f...)
			return err
		},
	}
	if err := ex.OnStart(context.Background(), "t", map[string]any{}); err != nil {
		t.Fatalf("OnStart without w but with Weights: %v", err)
	}
	x := tensor.FromFloat32s("x", []int64{2, 2}, []float32{1, 2, 3, 4})
	y := tensor.FromFloat32s("y", []int64{2}, []float32{1, 0})
	sd, _ := tensor.NewStateDict(x, y)
	info, err := ex.OnLearn(context.Background(), &LearnTask{TaskID: "t", Rows: 2, Batch: sd})
	if err != nil {
		t.Fatal(err)
	}
	if pushedVersion != 9 || len(pushed) != 2 || pushed[0] != -10 || pushed[1] != -15 {
		t.Fatalf("pushed %v on version %d, want [-10 -15] on 9", pushed, pushedVersion)
	}
	if info["pushed"] != true || info["version"] != int64(9) {
		t.Fatalf("info %v", info)
	}
	ex.Push = func(ctx context.Context, v, _ uint64, g *tensor.StateDict) error { return errs.ErrFull }
	if _, err := ex.OnLearn(context.Background(), &LearnTask{TaskID: "t", Rows: 2, Batch: sd}); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("failed push: %v", err)
	}
}

// newerHub welcomes a learner and then sends it a message it does not
// know (an empty oneof: what a newer hub's new message looks like to it).
type newerHub struct {
	rlhubv1.UnimplementedLearnerAggregatorServer
	attaches atomic.Int32
}

func (h *newerHub) Attach(s grpc.BidiStreamingServer[rlhubv1.LearnerMessage, rlhubv1.AggregatorMessage]) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	h.attaches.Add(1)
	if err := s.Send(&rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Welcome{Welcome: &rlhubv1.Welcome{LeaseMs: 10000}}}); err != nil {
		return err
	}
	if err := s.Send(&rlhubv1.AggregatorMessage{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// A message from the hub the learner does not understand is not a refusal:
// the learner re-attaches after its backoff instead of giving up for good
// (a rolling upgrade's newer hub must not stop every older learner).
func TestUnknownHubMessageIsRetried(t *testing.T) {
	hub := &newerHub{}
	runUntilReattached(t, hub, &hub.attaches, "the unknown message")
}

// runUntilReattached runs a learner against hub until it has attached
// three times (it re-attached after what hub sent: what), failing if Run
// returns meanwhile, then stops it.
func runUntilReattached(t *testing.T, hub rlhubv1.LearnerAggregatorServer, attaches *atomic.Int32, what string) {
	t.Helper()
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterLearnerAggregatorServer(g, hub) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Hub: addr, ID: "l1", Backoff: 20 * time.Millisecond, Logger: testkit.Logger(),
			OnDemand: func(context.Context, string) (Demand, error) { return Demand{BatchSize: 1}, nil },
			OnLearn:  func(context.Context, *LearnTask) (map[string]any, error) { return nil, nil }})
	}()
	testkit.Eventually(t, 30*time.Second, "the learner attaches again after "+what, func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned after %d attach(es): %v", attaches.Load(), err)
		default:
		}
		return attaches.Load() >= 3
	})
	cancel()
	testkit.Recv(t, done, 30*time.Second, "Run returns once its context ends")
}

// badShareHub welcomes a learner and sends it a learn task whose share is
// malformed (share returns the announced size and the chunks).
type badShareHub struct {
	rlhubv1.UnimplementedLearnerAggregatorServer
	share    func() (uint64, [][]byte)
	attaches atomic.Int32
}

func (h *badShareHub) Attach(s grpc.BidiStreamingServer[rlhubv1.LearnerMessage, rlhubv1.AggregatorMessage]) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	h.attaches.Add(1)
	if err := s.Send(&rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Welcome{Welcome: &rlhubv1.Welcome{LeaseMs: 10000}}}); err != nil {
		return err
	}
	total, chunks := h.share()
	if err := s.Send(&rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Learn{Learn: &rlhubv1.LearnTask{
		RequestId: 1, TaskId: "t", Rows: 1, Blob: &rlhubv1.BlobInfo{TotalBytes: total}}}}); err != nil {
		return err
	}
	for _, c := range chunks {
		if err := s.Send(&rlhubv1.AggregatorMessage{Body: &rlhubv1.AggregatorMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: c}}}); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	return nil
}

// A malformed share from the hub (a blob too small to be safetensors,
// chunks past the announced size, bytes that do not decode) breaks the
// protocol; it is not a refusal of the learner: Run re-attaches after its
// backoff instead of returning.
func TestMalformedShareFromHubIsRetried(t *testing.T) {
	garbage := []byte{16, 0, 0, 0, 0, 0, 0, 0, '{', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', '}'}
	for name, share := range map[string]func() (uint64, [][]byte){
		"blob under 10 bytes":   func() (uint64, [][]byte) { return 5, nil },
		"chunks past the size":  func() (uint64, [][]byte) { return 16, [][]byte{{2, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 16)} },
		"bytes not safetensors": func() (uint64, [][]byte) { return uint64(len(garbage)), [][]byte{garbage} },
	} {
		t.Run(name, func(t *testing.T) {
			hub := &badShareHub{share: share}
			runUntilReattached(t, hub, &hub.attaches, "the malformed share")
		})
	}
}
