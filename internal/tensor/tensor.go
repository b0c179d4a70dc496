package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"unsafe"
)

// Tensor is a named n-dimensional array stored as little-endian bytes.
//
// Data may alias a larger buffer (for example a decoded safetensors blob or a
// shared-memory segment); whoever built the Tensor documents who may write it.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// NumElements returns the product of the dimensions (1 for a scalar).
// ok is false when a dimension is negative or the product overflows int64.
func NumElements(shape []int64) (n int64, ok bool) {
	n = 1
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// ByteLen returns the number of bytes a tensor of this dtype and shape takes.
// ok is false on overflow, a negative dimension or an invalid dtype.
func ByteLen(dt DType, shape []int64) (n int64, ok bool) {
	if !dt.Valid() {
		return 0, false
	}
	elems, ok := NumElements(shape)
	if !ok {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(elems), uint64(dt.Size()))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// Validate checks that the tensor is self-consistent: a valid dtype,
// non-negative dimensions, and len(Data) equal to shape × dtype size.
func (t *Tensor) Validate() error {
	if !t.DType.Valid() {
		return fmt.Errorf("tensor %q: invalid dtype %v", t.Name, t.DType)
	}
	want, ok := ByteLen(t.DType, t.Shape)
	if !ok {
		return fmt.Errorf("tensor %q: shape %v is negative or overflows", t.Name, t.Shape)
	}
	if int64(len(t.Data)) != want {
		return fmt.Errorf("tensor %q: %d bytes of data, shape %v × %v needs %d", t.Name, len(t.Data), t.Shape, t.DType, want)
	}
	return nil
}

// NumElements returns the number of elements of t.
func (t *Tensor) NumElements() int64 {
	n, _ := NumElements(t.Shape)
	return n
}

// SameLayout reports whether u has t's dtype and shape.
func (t *Tensor) SameLayout(u *Tensor) bool {
	if t.DType != u.DType || len(t.Shape) != len(u.Shape) {
		return false
	}
	for i := range t.Shape {
		if t.Shape[i] != u.Shape[i] {
			return false
		}
	}
	return true
}

// ErrNotF32 is returned by Float32s for a tensor of another dtype.
var ErrNotF32 = errors.New("tensor: not F32")

// ErrUnaligned is returned by Float32s when Data is not 4-byte aligned, so it
// cannot be viewed as []float32 without a copy.
var ErrUnaligned = errors.New("tensor: data not aligned for a zero-copy view")

// Float32s returns a zero-copy []float32 view of an F32 tensor's data. Writes
// through the view change t.Data. Little-endian hosts only (rlhub targets
// amd64 and arm64).
func (t *Tensor) Float32s() ([]float32, error) {
	if t.DType != F32 {
		return nil, fmt.Errorf("%w: tensor %q is %v", ErrNotF32, t.Name, t.DType)
	}
	return BytesAsFloat32s(t.Data)
}

// BytesAsFloat32s views b as []float32 without copying. len(b) must be a
// multiple of 4 and b must be 4-byte aligned.
func BytesAsFloat32s(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("tensor: %d bytes is not a whole number of float32s", len(b))
	}
	if len(b) == 0 {
		return []float32{}, nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil, ErrUnaligned
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), nil
}

// Float32sAsBytes views f as its little-endian bytes without copying.
func Float32sAsBytes(f []float32) []byte {
	if len(f) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// FromFloat32s builds an F32 tensor whose Data aliases f.
func FromFloat32s(name string, shape []int64, f []float32) *Tensor {
	return &Tensor{Name: name, DType: F32, Shape: shape, Data: Float32sAsBytes(f)}
}

// NewF32 allocates a zeroed F32 tensor with the given shape. It panics on a
// negative or overflowing shape: that is a bug in the caller.
func NewF32(name string, shape ...int64) *Tensor {
	n, ok := NumElements(shape)
	if !ok {
		panic(fmt.Sprintf("tensor.NewF32: bad shape %v", shape))
	}
	return FromFloat32s(name, append([]int64(nil), shape...), make([]float32, n))
}

// Clone returns a deep copy of t with its own Data (8-byte aligned).
func (t *Tensor) Clone() *Tensor {
	c := &Tensor{Name: t.Name, DType: t.DType, Shape: append([]int64(nil), t.Shape...)}
	c.Data = AlignedBytes(len(t.Data))
	copy(c.Data, t.Data)
	return c
}

// Aligned reports whether b starts 8-byte aligned (as AlignedBytes makes
// it), so that any dtype can be viewed in place.
func Aligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0
}

// AlignedBytes allocates n zeroed bytes whose start is 8-byte aligned, so any
// dtype can be viewed in place.
func AlignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)[:n:n]
}
