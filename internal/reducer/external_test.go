package reducer

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
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// goHost is a test optimizer host over real gRPC: plain SGD with lr 0.5
// on the weights of the version it is welcomed at.
type goHost struct {
	t       *testing.T
	stream  grpc.BidiStreamingClient[rlhubv1.HostMessage, rlhubv1.PrimaryMessage]
	cancel  context.CancelFunc
	params  *tensor.StateDict
	welcome uint64
}

func attachHost(t *testing.T, e *testEnv) (*goHost, error) {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := rlhubv1.NewOptimizerHostClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Hello{Hello: &rlhubv1.HostHello{Model: e.model}}}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	h := &goHost{t: t, stream: s, cancel: cancel, welcome: m.GetWelcome().GetVersion()}
	snap, err := e.st.Get(context.Background(), e.model, h.welcome)
	if err != nil {
		t.Fatal(err)
	}
	h.params = snap.Tensors.Clone()
	return h, nil
}

// recvStep reads one step and its gradient.
func (h *goHost) recvStep() (*rlhubv1.HostStep, *tensor.StateDict) {
	h.t.Helper()
	m, err := h.stream.Recv()
	if err != nil {
		h.t.Fatalf("host: %v", err)
	}
	st := m.GetStep()
	if st == nil {
		h.t.Fatalf("host got %T, want a step", m.GetBody())
	}
	asm, err := wire.NewAssembler(st.Grad.TotalBytes, wire.Limits{})
	if err != nil {
		h.t.Fatal(err)
	}
	for asm.Received() < int(st.Grad.TotalBytes) {
		c, err := h.stream.Recv()
		if err != nil {
			h.t.Fatal(err)
		}
		if err := asm.Write(c.GetChunk().GetData()); err != nil {
			h.t.Fatal(err)
		}
	}
	f, _, err := asm.Finish()
	if err != nil {
		h.t.Fatal(err)
	}
	return st, f.Tensors
}

// reply steps params with SGD and sends them back.
func (h *goHost) reply(st *rlhubv1.HostStep, g *tensor.StateDict) {
	h.t.Helper()
	for _, p := range h.params.Tensors() {
		pf, _ := p.Float32s()
		gf, _ := g.Get(p.Name).Float32s()
		for i := range pf {
			pf[i] -= 0.5 * gf[i]
		}
	}
	blob, err := safetensors.Encode(h.params, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
		StepId: st.StepId, Params: &rlhubv1.BlobInfo{TotalBytes: uint64(len(blob))}}}}); err != nil {
		h.t.Fatal(err)
	}
	if err := wire.ChunksOf(blob, 1024, func(b []byte) error {
		return h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
	}); err != nil {
		h.t.Fatal(err)
	}
}

// TestExternalStepSurvivesAHostLostMidStep: the first host receives the
// step and vanishes without answering; the primary sends the same step to
// the next host, whose weights are published once, as version 2.
func TestExternalStepSurvivesAHostLostMidStep(t *testing.T) {
	init := testLayout(3)
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, init)
	e.register(ModelConfig{Optimizer: optim.Config{Kind: External}, Reduction: "sum"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := gradFor(3, "c", 1)
	if _, err := e.client("c", 3).PushGrad(ctx, "m", 1, g); err != nil {
		t.Fatal(err)
	}
	h1, err := attachHost(t, e)
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := h1.recvStep()
	if h1.welcome != 1 || st1.Version != 1 || st1.Steps != 0 {
		t.Fatalf("welcome %d, step at version %d after %d steps; want 1, 1, 0", h1.welcome, st1.Version, st1.Steps)
	}
	h1.cancel() // gone mid-step
	h2, err := attachHost(t, e)
	if err != nil {
		t.Fatal(err)
	}
	st2, g2 := h2.recvStep()
	if st2.Version != 1 || st2.StepId == st1.StepId {
		t.Fatalf("re-sent step: version %d id %d (first id %d)", st2.Version, st2.StepId, st1.StepId)
	}
	h2.reply(st2, g2)
	if _, err := e.st.WaitNewer(ctx, "m", 1); err != nil {
		t.Fatal(err)
	}
	snap := e.newest()
	if snap.Version != 2 {
		t.Fatalf("newest version %d, want 2", snap.Version)
	}
	for _, name := range []string{"fc.weight", "fc.bias"} {
		got, p0, gr := f32(t, snap.Tensors, name), f32(t, init, name), f32(t, g, name)
		for i := range got {
			if want := p0[i] - 0.5*gr[i]; got[i] != want {
				t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want)
			}
		}
	}
	stats := e.waitSettled()
	if stats.Total.Applied != 1 || stats.Total.Steps != 1 || stats.Total.DroppedTotal() != 0 {
		t.Fatalf("counters %+v: want one gradient applied in one step", stats.Total)
	}
	h2.cancel()
}

func TestExternalRegistrationAndAttachAreChecked(t *testing.T) {
	e := newTestEnv(t, Config{Secondaries: 1}, testLayout(2))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := e.svc.RegisterModel(ctx, ModelConfig{Model: "m", Optimizer: optim.Config{Kind: External, LR: 0.1}})
	if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "external") {
		t.Fatalf("external with an lr: %v, want ErrInvalid", err)
	}
	e.register(ModelConfig{Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}})
	if _, err := attachHost(t, e); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "not \"external\"") {
		t.Fatalf("host for an sgd model: %v, want ErrInvalid", err)
	}
}
