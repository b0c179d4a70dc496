package reducer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// stepHost is an optimizer host driven by the test over real gRPC, one
// message at a time, as rlhub.OptimizerHost speaks: it reads a step, then
// (when the test says) checkpoints its state to the store as
// <model>/host-state and replies.
type stepHost struct {
	t      *testing.T
	stream grpc.BidiStreamingClient[rlhubv1.HostMessage, rlhubv1.PrimaryMessage]
	// welcome is the version the host was welcomed at.
	welcome uint64
}

func attachStepHost(t *testing.T, ctx context.Context, conn *grpc.ClientConn, model string) *stepHost {
	t.Helper()
	s, err := rlhubv1.NewOptimizerHostClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Hello{Hello: &rlhubv1.HostHello{Model: model}}}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("attach: %v", grpcerr.FromStatus(err))
	}
	return &stepHost{t: t, stream: s, welcome: m.GetWelcome().GetVersion()}
}

// recvStep reads one step and its gradient's chunks.
func (h *stepHost) recvStep() *rlhubv1.HostStep {
	h.t.Helper()
	m, err := h.stream.Recv()
	if err != nil || m.GetStep() == nil {
		h.t.Fatalf("host: want a step, got %v, %v", m, err)
	}
	st := m.GetStep()
	for got := 0; got < int(st.Grad.TotalBytes); {
		c, err := h.stream.Recv()
		if err != nil {
			h.t.Fatal(err)
		}
		got += len(c.GetChunk().GetData())
	}
	return st
}

// reply sends weights as the step's result.
func (h *stepHost) reply(st *rlhubv1.HostStep, weights []byte) {
	h.t.Helper()
	if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
		StepId: st.StepId, Params: &rlhubv1.BlobInfo{TotalBytes: uint64(len(weights))}}}}); err != nil {
		h.t.Fatal(err)
	}
	if err := wire.ChunksOf(weights, 1024, func(b []byte) error {
		return h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
	}); err != nil {
		h.t.Fatal(err)
	}
}

// checkpoint pushes the host state of the step st (version st.Version+1)
// over the store's Push RPC, naming the life the step was of
// (st.Grad.Life) in the header, as the Python host does; who marks the
// state's metadata.
func (h *stepHost) checkpoint(ctx context.Context, conn *grpc.ClientConn, model string, st *rlhubv1.HostStep, who string) error {
	h.t.Helper()
	blob, err := safetensors.Encode(gradFor(4, who, st.Version), map[string]string{"host.who": who})
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := rlhubv1.NewModelStoreClient(conn).Push(ctx)
	if err != nil {
		return grpcerr.FromStatus(err)
	}
	if err := s.Send(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Header{Header: &rlhubv1.StorePushHeader{
		Blob:      &rlhubv1.BlobInfo{Model: model + reducer.HostStateSuffix, Version: st.Version + 1, TotalBytes: uint64(len(blob)), Life: st.Grad.GetLife()},
		ExpectAny: true,
	}}}); err != nil {
		return grpcerr.FromStatus(err)
	}
	if err := wire.ChunksOf(blob, 1024, func(b []byte) error {
		return s.Send(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
	}); err != nil {
		return grpcerr.FromStatus(err)
	}
	_, err = s.CloseAndRecv()
	return grpcerr.FromStatus(err)
}

// TestHostStateOfADeletedLifeIsRefused: the host of an external model
// holds a step when an administrator deletes the model (its stream ends
// ABORTED, its host state is deleted with it), and only then checkpoints
// that step, as a host busy in optimizer.step() does. The checkpoint
// landed: <model>/host-state was created again with the deleted model's
// state, and the model pushed again under the same name found it at its
// versions — its host's own checkpoint at version 2 was then refused as
// stale, and a host welcomed there loaded the deleted model's state. The
// step names its model's life (HostStep.grad.life) and the checkpoint
// carries it: the hub refuses a checkpoint of a life that ended
// (FAILED_PRECONDITION, naming the model) and stores nothing, and the
// next life's host checkpoints and steps as usual.
func TestHostStateOfADeletedLifeIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(),
		Reducer: reducer.Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}})
	addr := h.Addr().String()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "learner"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// life starts one life of "m": version 1 pushed, registered external,
	// a host attached and one gradient pushed, whose step the host holds.
	life := func(who string) (*stepHost, *rlhubv1.HostStep) {
		blob, err := safetensors.Encode(gradFor(4, "init-"+who, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: blob}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := cl.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: reducer.External}, Reduction: "sum"}); err != nil {
			t.Fatal(err)
		}
		host := attachStepHost(t, ctx, conn, "m")
		if host.welcome != 1 {
			t.Fatalf("%s host welcomed at version %d, want 1", who, host.welcome)
		}
		if _, err := cl.PushGrad(ctx, "m", 1, gradFor(4, who, 1)); err != nil {
			t.Fatal(err)
		}
		return host, host.recvStep()
	}

	old, oldStep := life("old")
	if err := sc.Delete(ctx, "m"); err != nil { // the hub drops the registration and the host state
		t.Fatal(err)
	}
	if _, err := old.stream.Recv(); !errors.Is(grpcerr.FromStatus(err), errs.ErrAborted) {
		t.Fatalf("the old host's stream: %v; want ABORTED", err)
	}
	// The old host's step ends now: its checkpoint comes after the Delete.
	err = old.checkpoint(ctx, conn, "m", oldStep, "old")
	if !errors.Is(err, errs.ErrStale) || !strings.Contains(err.Error(), `"m"`) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("checkpoint of the deleted model's step: %v; want FAILED_PRECONDITION naming the deleted model", err)
	}
	if _, err := sc.Get(ctx, "m"+reducer.HostStateSuffix, 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the deleted model's host state after the refused checkpoint: %v; want NOT_FOUND", err)
	}

	// The model pushed again: its host checkpoints at version 2 and the
	// step publishes, with no trace of the old life.
	host, st := life("new")
	if oldStep.Grad.GetLife() == 0 || st.Grad.GetLife() == 0 || st.Grad.GetLife() == oldStep.Grad.GetLife() {
		t.Fatalf("steps name lives %d then %d; want two known, different lives", oldStep.Grad.GetLife(), st.Grad.GetLife())
	}
	// The old host, late, tries again on the new life's version: refused.
	if err := old.checkpoint(ctx, conn, "m", oldStep, "old"); !errors.Is(err, errs.ErrStale) {
		t.Fatalf("the old host's checkpoint once the model is pushed again: %v; want FAILED_PRECONDITION", err)
	}
	if err := host.checkpoint(ctx, conn, "m", st, "new"); err != nil {
		t.Fatalf("the new life's host checkpoints: %v", err)
	}
	weights, err := safetensors.Encode(gradFor(4, "weights", 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	host.reply(st, weights)
	if _, err := sc.WaitNewer(ctx, "m", 1); err != nil {
		t.Fatal(err)
	}
	state, err := sc.Get(ctx, "m"+reducer.HostStateSuffix, 0)
	if err != nil {
		t.Fatal(err)
	}
	if state.Version != 2 || state.Metadata["host.who"] != "new" {
		t.Fatalf("host state: version %d of %q; want version 2 of the new life's host", state.Version, state.Metadata["host.who"])
	}
}
