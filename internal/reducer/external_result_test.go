package reducer

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// sendWeights answers st with sd's blob, its BlobInfo claiming version.
func sendWeights(t *testing.T, h *goHost, st *rlhubv1.HostStep, sd *tensor.StateDict, version uint64) {
	t.Helper()
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.stream.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Result{Result: &rlhubv1.HostResult{
		StepId: st.StepId, Params: &rlhubv1.BlobInfo{Version: version, TotalBytes: uint64(len(blob))}}}}); err != nil {
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
