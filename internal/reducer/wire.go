package reducer

import (
	"errors"
	"fmt"
	"io"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// receiveGradient assembles one safetensors blob of exactly total bytes
// from recv (which returns io.EOF after the last chunk) and decodes it.
// The returned tensors alias a fresh buffer the caller owns.
func receiveGradient(total uint64, maxBytes int64, recv func() ([]byte, error)) (*tensor.StateDict, error) {
	a, err := wire.NewAssembler(total, wire.Limits{MaxBytes: maxBytes})
	if err != nil {
		return nil, err
	}
	for {
		b, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := a.Write(b); err != nil {
			return nil, err
		}
	}
	f, _, err := a.Finish()
	if err != nil {
		return nil, err
	}
	return f.Tensors, nil
}

// sendStateDict streams sd's safetensors encoding through send, one chunk
// per call, without copying tensor bytes.
func sendStateDict(l *safetensors.Layout, send func([]byte) error) error {
	return wire.Chunks(l, 0, send)
}

func idsToProto(ids []reduce.ID) []*rlhubv1.ReducerGradientID {
	out := make([]*rlhubv1.ReducerGradientID, len(ids))
	for i, id := range ids {
		out[i] = &rlhubv1.ReducerGradientID{ClientId: id.Client, Seq: id.Seq}
	}
	return out
}

func idsFromProto(ids []*rlhubv1.ReducerGradientID) []reduce.ID {
	out := make([]reduce.ID, len(ids))
	for i, id := range ids {
		out[i] = reduce.ID{Client: id.GetClientId(), Seq: id.GetSeq()}
	}
	return out
}

func layoutToProto(sd *tensor.StateDict) []*rlhubv1.ReducerTensorSpec {
	out := make([]*rlhubv1.ReducerTensorSpec, sd.Len())
	for i, t := range sd.Tensors() {
		out[i] = &rlhubv1.ReducerTensorSpec{Name: t.Name, Dtype: t.DType.String(), Shape: t.Shape}
	}
	return out
}

// layoutFromProto builds a layout state dict (zero-length data is not
// valid, so each tensor gets a shared zero buffer of its size: layouts are
// never read).
func layoutFromProto(specs []*rlhubv1.ReducerTensorSpec) (*tensor.StateDict, error) {
	sd := &tensor.StateDict{}
	for _, s := range specs {
		dt, err := tensor.ParseDType(s.GetDtype())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errs.ErrInvalid, err)
		}
		n, ok := tensor.ByteLen(dt, s.GetShape())
		if !ok || n > 1<<34 {
			return nil, fmt.Errorf("%w: tensor %q shape %v", errs.ErrInvalid, s.GetName(), s.GetShape())
		}
		if err := sd.Add(&tensor.Tensor{Name: s.GetName(), DType: dt, Shape: s.GetShape(), Data: tensor.AlignedBytes(int(n))}); err != nil {
			return nil, fmt.Errorf("%w: %v", errs.ErrInvalid, err)
		}
	}
	return sd, nil
}
