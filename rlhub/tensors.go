package rlhub

import (
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Tensors and versions, shared with the hub's own code.
type (
	// StateDict is an ordered set of named tensors.
	StateDict = tensor.StateDict
	// Tensor is one named tensor: dtype, shape and little-endian bytes.
	Tensor = tensor.Tensor
	// DType is a tensor's element type (safetensors names).
	DType = tensor.DType
	// Snapshot is one immutable version of a model as pulled; its Tensors
	// alias its Blob, and nobody may modify either.
	Snapshot = store.Snapshot
	// ModelInfo describes a stored model's newest version.
	ModelInfo = store.Info
)

// ExpectAny, as a push's expect, skips the compare-and-set check.
const ExpectAny = store.ExpectAny

// Conditions every call may return, for errors.Is.
var (
	ErrInvalid      = errs.ErrInvalid     // bad input: names, shapes, dtypes, sizes
	ErrNotFound     = errs.ErrNotFound    // no such model or version
	ErrStaleVersion = errs.ErrStale       // a push lost its compare-and-set
	ErrExists       = errs.ErrExists      // already there (a retried gradient that got through)
	ErrFull         = errs.ErrFull        // a bounded queue is full
	ErrUnavailable  = errs.ErrUnavailable // the hub (or a secondary) cannot be reached
)

// NewStateDict orders ts into a state dict; names must be unique and each
// tensor valid.
func NewStateDict(ts ...*Tensor) (*StateDict, error) { return tensor.NewStateDict(ts...) }

// FromFloat32s makes an F32 tensor over data (not copied); len(data) must
// be the product of shape.
func FromFloat32s(name string, shape []int64, data []float32) *Tensor {
	return tensor.FromFloat32s(name, shape, data)
}

// Encode returns sd's safetensors bytes (what the store keeps and Python's
// safetensors library reads).
func Encode(sd *StateDict, metadata map[string]string) ([]byte, error) {
	return safetensors.Encode(sd, metadata)
}
