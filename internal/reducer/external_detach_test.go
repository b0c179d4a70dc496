package reducer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestExternalDetachedHostIsNotSentTheStepAgain: a host answers a step id
// it was not asked, and the primary detaches it (InvalidArgument). The
// stepping goroutine then looked for a host before Attach had cleared the
// detached one, found it again, and sent it the step once more — on a
// stream whose handler was returning — spinning until Attach caught up.
// The detached host now gets no step: its stream ends with the error, and
// the step goes to the next host, once.
func TestExternalDetachedHostIsNotSentTheStepAgain(t *testing.T) {
	for i := range 10 {
		e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(3))
		e.register(ModelConfig{Optimizer: optim.Config{Kind: External}, Reduction: "sum"})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := e.client("c", 3).PushGrad(ctx, "m", 1, gradFor(3, "c", 1)); err != nil {
			t.Fatal(err)
		}
		h1, err := attachHost(t, e)
		if err != nil {
			t.Fatal(err)
		}
		st1, _ := h1.recvStep()
		if err := h1.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
			StepId: st1.StepId + 100, Error: "x"}}}); err != nil {
			t.Fatal(err)
		}
		sent := 0
		for {
			m, err := h1.stream.Recv()
			if err != nil {
				if !errors.Is(grpcerr.FromStatus(err), errs.ErrInvalid) {
					t.Fatalf("run %d: the detached host's stream ended with %v, want InvalidArgument", i, err)
				}
				break
			}
			if m.GetStep() != nil {
				sent++
			}
		}
		if sent != 0 {
			t.Errorf("run %d: the host detached for answering the wrong step was sent the step %d more times", i, sent)
		}
		h2, err := attachHost(t, e)
		if err != nil {
			t.Fatal(err)
		}
		st2, g2 := h2.recvStep()
		if st2.StepId != st1.StepId+1 {
			t.Errorf("run %d: the next host got step id %d, want %d (the step was sent %d times in between)", i, st2.StepId, st1.StepId+1, st2.StepId-st1.StepId-1)
		}
		h2.reply(st2, g2)
		testkit.Eventually(t, 20*time.Second, "version 2", func() bool { return e.newest().Version == 2 })
		if d := e.svc.Stats().Total.Dropped[reduce.ReasonPublish]; d != 0 {
			t.Fatalf("run %d: %d gradients dropped", i, d)
		}
		h1.cancel()
		h2.cancel()
		cancel()
	}
}

// TestHostOfADeletedModelIsDetached: an external model deleted while its
// host holds a step: the registration is dropped (Service.ModelDeleted, as
// the hub calls it after the store's Delete) without waiting for the step,
// the host's stream ends ABORTED naming the delete (a host stops on it),
// and a host attaching after is refused: the model is not registered.
func TestHostOfADeletedModelIsDetached(t *testing.T) {
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(3))
	e.register(ModelConfig{Optimizer: optim.Config{Kind: External}, Reduction: "sum"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.client("c", 3).PushGrad(ctx, "m", 1, gradFor(3, "c", 1)); err != nil {
		t.Fatal(err)
	}
	h, err := attachHost(t, e)
	if err != nil {
		t.Fatal(err)
	}
	h.recvStep() // held, never answered
	if err := e.st.(store.Deleter).Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	e.svc.ModelDeleted(ctx, "m")
	_, err = h.stream.Recv()
	if err = grpcerr.FromStatus(err); !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("the host of the deleted model: %v; want ABORTED naming the delete", err)
	}
	if _, err := attachHost(t, e); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a host attaching after the delete: %v; want NOT_FOUND", err)
	}
	if _, ok := e.svc.Stats().Models["m"]; ok {
		t.Fatalf("stats list the deleted model's registration: %+v", e.svc.Stats().Models)
	}
}
