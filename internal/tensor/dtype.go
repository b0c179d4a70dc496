// Package tensor defines rlhub's in-memory tensors: element types, shapes,
// and the ordered state dict that every service moves around.
//
// A Tensor is a name, a DType, a shape and little-endian bytes. Tensors do
// not own their bytes exclusively: a decoded state dict usually aliases the
// buffer it was decoded from (see package safetensors), so callers treat
// Data as read-only unless they created it.
package tensor

import (
	"fmt"
)

// DType is a tensor element type. The names are safetensors' names.
type DType uint8

// The supported element types. The numeric values are the rank that the
// reference safetensors implementation uses to order tensors in a file
// (largest first), so encoding is byte-identical to it.
const (
	Invalid DType = iota
	BOOL
	U8
	I8
	F8E5M2
	F8E4M3
	I16
	U16
	F16
	BF16
	I32
	U32
	F32
	C64
	F64
	I64
	U64
	numDTypes
)

var dtypeNames = [numDTypes]string{
	Invalid: "INVALID",
	BOOL:    "BOOL",
	U8:      "U8",
	I8:      "I8",
	F8E5M2:  "F8_E5M2",
	F8E4M3:  "F8_E4M3",
	I16:     "I16",
	U16:     "U16",
	F16:     "F16",
	BF16:    "BF16",
	I32:     "I32",
	U32:     "U32",
	F32:     "F32",
	C64:     "C64",
	F64:     "F64",
	I64:     "I64",
	U64:     "U64",
}

var dtypeSizes = [numDTypes]int{
	BOOL: 1, U8: 1, I8: 1, F8E5M2: 1, F8E4M3: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	C64: 8, F64: 8, I64: 8, U64: 8,
}

// String returns the safetensors name of d, e.g. "F32".
func (d DType) String() string {
	if d < numDTypes {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the size of one element in bytes; 0 for Invalid.
func (d DType) Size() int {
	if d < numDTypes {
		return dtypeSizes[d]
	}
	return 0
}

// Valid reports whether d is a supported element type.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	switch d {
	case F8E5M2, F8E4M3, F16, BF16, F32, F64:
		return true
	}
	return false
}

// ParseDType returns the DType with the given safetensors name.
func ParseDType(name string) (DType, error) {
	for d := BOOL; d < numDTypes; d++ {
		if dtypeNames[d] == name {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("tensor: unknown dtype %q", name)
}
