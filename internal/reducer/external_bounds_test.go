package reducer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// hostAtFirstStep registers model m with the External optimizer, pushes
// one gradient and attaches a host: the env, the host (cancelled at the
// test's cleanup) and the step it was sent.
func hostAtFirstStep(t *testing.T, ctx context.Context) (*testEnv, *goHost, *rlhubv1.HostStep) {
	t.Helper()
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(3))
	e.register(ModelConfig{Optimizer: optim.Config{Kind: External}, Reduction: "sum"})
	if _, err := e.client("c", 1).PushGrad(ctx, "m", 1, gradFor(3, "c", 1)); err != nil {
		t.Fatal(err)
	}
	h, err := attachHost(t, e)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.cancel)
	st, _ := h.recvStep()
	return e, h, st
}

// externalFailure pushes one gradient to an external model, lets answer
// (the host's reply to the step) fail the step, and returns the model's
// failure as the primary keeps it and the error a later push gets over
// gRPC. Nothing may have been published.
func externalFailure(t *testing.T, answer func(h *goHost, st *rlhubv1.HostStep)) (failed error, pushErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, h, st := hostAtFirstStep(t, ctx)
	answer(h, st)
	testkit.Eventually(t, 20*time.Second, "the step to end", func() bool {
		return e.svc.Stats().Total.Dropped[reduce.ReasonPublish] == 1 || e.newest().Version != 1
	})
	if v := e.newest().Version; v != 1 {
		t.Fatalf("the host's answer was published as version %d; want the step to fail", v)
	}
	m, err := e.svc.Primary().model("m")
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	failed = m.failed
	m.mu.Unlock()
	if failed == nil {
		t.Fatal("the step failed, yet the model has no failure")
	}
	_, pushErr = e.client("d", 1).PushGrad(ctx, "m", 1, gradFor(3, "d", 1))
	if pushErr == nil {
		t.Fatal("a push to a failed model was taken")
	}
	if v := e.newest().Version; v != 1 {
		t.Fatalf("version %d published; want nothing past 1", v)
	}
	h.cancel()
	return failed, pushErr
}

// TestExternalHostErrorIsCutAtARune: a host's step error longer than the
// primary keeps was cut at byte 1024, splitting the 2-byte "é" that spans
// it: the model's failure (logged, and in every later push's error) held
// invalid UTF-8, which gRPC turned into U+FFFD. The cut is now rune-safe
// and says how long the host's text was.
func TestExternalHostErrorIsCutAtARune(t *testing.T) {
	text := strings.Repeat("a", 1023) + strings.Repeat("é", 600) // é covers bytes 1023-1024
	failed, pushErr := externalFailure(t, func(h *goHost, st *rlhubv1.HostStep) {
		if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
			StepId: st.StepId, Error: text}}}); err != nil {
			t.Fatal(err)
		}
	})
	msg := failed.Error()
	if !errors.Is(failed, errs.ErrAborted) || !strings.Contains(msg, "optimizer host failed the step") {
		t.Fatalf("model failure %q: want ErrAborted naming the host's failure", errs.QuoteMax(msg, 200))
	}
	if !utf8.ValidString(msg) {
		t.Errorf("the model's failure is not valid UTF-8: …%q", msg[len(msg)-40:])
	}
	if len(msg) > 1300 {
		t.Errorf("the model's failure is %d bytes: the host's %d-byte text was not cut", len(msg), len(text))
	}
	if strings.ContainsRune(pushErr.Error(), utf8.RuneError) {
		t.Errorf("a later push's error holds U+FFFD (a split character): …%q", tail(pushErr.Error(), 60))
	}
	if !strings.Contains(pushErr.Error(), "aaaa") {
		t.Errorf("a later push's error does not carry the host's text: %q", tail(pushErr.Error(), 200))
	}
}

// TestExternalHostLayoutErrorIsBounded: a host answers with weights whose
// fc.bias has the model's 4 elements in a shape of rank 50000 (~100 KB of
// header, within the result's size limit). The layout error printed the
// whole shape: the model's failure, logged and kept, was ~100 KB. It is
// now bounded; a tensor with a huge name is refused with a bounded error
// too. Nothing is published either way.
func TestExternalHostLayoutErrorIsBounded(t *testing.T) {
	const bound = 1 << 10
	weights := func(names ...string) *tensor.StateDict {
		t.Helper()
		ts := []*tensor.Tensor{tensor.NewF32("fc.weight", 3, 4)}
		if len(names) == 0 {
			shape := make([]int64, 50000)
			for i := range shape {
				shape[i] = 1
			}
			shape[0] = 4
			ts = append(ts, tensor.NewF32("fc.bias", shape...))
		}
		for _, n := range names {
			ts = append(ts, tensor.NewF32(n, 4))
		}
		sd, err := tensor.NewStateDict(ts...)
		if err != nil {
			t.Fatal(err)
		}
		return sd
	}
	for _, tc := range []struct {
		name string
		sd   *tensor.StateDict
	}{
		{"rank 50000", weights()},
		{"a 200 KB name", weights(strings.Repeat("n", 200<<10))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, err := safetensors.Encode(tc.sd, nil)
			if err != nil {
				t.Fatal(err)
			}
			failed, pushErr := externalFailure(t, func(h *goHost, st *rlhubv1.HostStep) {
				if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
					StepId: st.StepId, Params: &rlhubv1.BlobInfo{TotalBytes: uint64(len(blob))}}}}); err != nil {
					t.Fatal(err)
				}
				if err := wire.ChunksOf(blob, 32<<10, func(b []byte) error {
					return h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
				}); err != nil {
					t.Fatal(err)
				}
			})
			msg := failed.Error()
			if !errors.Is(failed, errs.ErrInvalid) || !strings.Contains(msg, "fc.bias") {
				t.Fatalf("model failure %s: want ErrInvalid naming fc.bias", errs.QuoteMax(msg, 300))
			}
			if len(msg) > bound {
				t.Errorf("the model's failure (logged, kept, in every later push's error) is %d bytes, want at most %d: %s",
					len(msg), bound, errs.QuoteMax(msg, 300))
			}
			if len(pushErr.Error()) > bound+200 {
				t.Errorf("a later push's error is %d bytes", len(pushErr.Error()))
			}
			t.Logf("failure: %s", msg)
		})
	}
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }
