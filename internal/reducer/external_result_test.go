package reducer

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// sendWeights answers st with sd's blob, its BlobInfo claiming version.
func sendWeights(t *testing.T, h *goHost, st *rlhubv1.HostStep, sd *tensor.StateDict, version uint64) {
	t.Helper()
	sendWeightsOf(t, h, st, sd, "", version)
}

// sendWeightsOf is sendWeights with the BlobInfo naming model too.
func sendWeightsOf(t *testing.T, h *goHost, st *rlhubv1.HostStep, sd *tensor.StateDict, model string, version uint64) {
	t.Helper()
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
		StepId: st.StepId, Params: &rlhubv1.BlobInfo{Model: model, Version: version, TotalBytes: uint64(len(blob))}}}}); err != nil {
		t.Fatal(err)
	}
	if err := wire.ChunksOf(blob, 1024, func(b []byte) error {
		return h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestExternalResultOfAnotherVersionIsRefused: a host answers the step
// from version 1 with well-formed weights that its BlobInfo says are of
// version 7 (a host that stepped other weights than the ones the step is
// for). They were published as version 2. The step now fails
// (InvalidArgument, naming both versions) and nothing is published; a
// result that leaves the version unset (0), as the other tests' host
// does, is still taken.
func TestExternalResultOfAnotherVersionIsRefused(t *testing.T) {
	failed, _ := externalFailure(t, func(h *goHost, st *rlhubv1.HostStep) {
		sendWeights(t, h, st, h.params, st.Version+6)
	})
	if msg := failed.Error(); !errors.Is(failed, errs.ErrInvalid) || !strings.Contains(msg, "version 7") || !strings.Contains(msg, "version 2") {
		t.Fatalf("model failure %q: want ErrInvalid naming version 7 and version 2", msg)
	}
}

// TestExternalResultForAnotherModelIsRefused: a host answers the step of
// model "m" with well-formed weights (right names, shapes, version) that
// its BlobInfo says are of another model (a host whose model name was
// not checked, or stepping two models on one connection's state). They
// were published as m's version 2. The step now fails (InvalidArgument,
// naming both models, the host's bounded) and nothing is published; a
// result that leaves the model unset, as the other tests' host does, is
// still taken, and the right name (as the Python host sends) too
// (TestExternalStepResultNamingItsModelIsPublished).
func TestExternalResultForAnotherModelIsRefused(t *testing.T) {
	long := "other" + strings.Repeat("x", 4096)
	failed, _ := externalFailure(t, func(h *goHost, st *rlhubv1.HostStep) {
		sendWeightsOf(t, h, st, h.params, long, st.Version+1)
	})
	msg := failed.Error()
	if !errors.Is(failed, errs.ErrInvalid) || !strings.Contains(msg, `"otherxx`) || !strings.Contains(msg, `"m"`) {
		t.Fatalf("model failure %q: want ErrInvalid naming the host's model and m", msg)
	}
	if len(msg) > 1024 {
		t.Fatalf("model failure is %d bytes: it echoes the host's %d-byte model name", len(msg), len(long))
	}
}

// TestExternalStepResultNamingItsModelIsPublished: a result whose
// BlobInfo names the step's model and version is published.
func TestExternalStepResultNamingItsModelIsPublished(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, h, st := hostAtFirstStep(t, ctx)
	sendWeightsOf(t, h, st, h.params, "m", st.Version+1)
	testkit.Eventually(t, 20*time.Second, "version 2 published", func() bool { return e.newest().Version == 2 })
}

// TestExternalBadWeightsAreCalledWeights: a host's weights that do not fit
// the model, or hold a NaN, fail the step; the failure (logged, and in
// every later push's error) called them a gradient ("gradient tensor
// \"fc.bias\" holds NaN"), sending whoever reads it to the learners. It
// now says weights.
func TestExternalBadWeightsAreCalledWeights(t *testing.T) {
	nan := func(h *goHost) *tensor.StateDict {
		sd := h.params.Clone()
		f, _ := sd.Get("fc.bias").Float32s()
		f[1] = float32(math.NaN())
		return sd
	}
	short := func(*goHost) *tensor.StateDict {
		sd, err := tensor.NewStateDict(tensor.NewF32("fc.weight", 3, 4))
		if err != nil {
			t.Fatal(err)
		}
		return sd
	}
	for _, tc := range []struct {
		name    string
		weights func(*goHost) *tensor.StateDict
		want    string
	}{
		{"NaN", nan, `weights tensor "fc.bias" holds NaN at element 1`},
		{"missing tensor", short, "weights do not match the model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed, pushErr := externalFailure(t, func(h *goHost, st *rlhubv1.HostStep) {
				sendWeights(t, h, st, tc.weights(h), 0)
			})
			for _, err := range []error{failed, pushErr} {
				if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "gradient") {
					t.Errorf("%q: want %q, and no mention of a gradient", msg, tc.want)
				}
			}
		})
	}
}

// TestHostOfAStoppedModelIsToldAndNotTakenBack: a step that fails (here:
// the host's weights hold a NaN) stops the model. Its host stayed
// attached, waiting for a step that would never come, and a host that
// attached after was welcomed the same way: the Python host, told
// nothing, waited for ever. The host's stream now ends Aborted naming the
// model's failure (a host does not re-attach on Aborted), and a host
// attaching later is refused the same way.
func TestHostOfAStoppedModelIsToldAndNotTakenBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, h, st := hostAtFirstStep(t, ctx)
	bad := h.params.Clone()
	f, _ := bad.Get("fc.bias").Float32s()
	f[0] = float32(math.NaN())
	sendWeights(t, h, st, bad, 0)
	told := make(chan error, 1)
	go func() {
		_, err := h.stream.Recv()
		told <- grpcerr.FromStatus(err)
	}()
	var got error
	select {
	case got = <-told:
	case <-ctx.Done():
		t.Fatal("the host of a model that stopped taking gradients was never told")
	}
	for i, err := range []error{got, func() error { _, err := attachHost(t, e); return err }()} {
		if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "stopped taking gradients") || !strings.Contains(err.Error(), "NaN") {
			t.Errorf("host %d: %v; want Aborted naming the model's failure", i+1, err)
		}
	}
	if v := e.newest().Version; v != 1 {
		t.Fatalf("version %d published; want nothing past 1", v)
	}
}
