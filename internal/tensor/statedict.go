package tensor

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
)

// StateDict is an ordered set of uniquely named tensors, the unit that the
// model store versions and the reducer reduces.
//
// The zero value is an empty state dict ready to use. A StateDict is not safe
// for concurrent mutation; concurrent reads are fine.
type StateDict struct {
	tensors []*Tensor
	// index maps names to positions once there are more than smallDict
	// tensors; smaller dicts are searched linearly, which is faster than
	// building and hashing into a map (decoding a small model is dominated
	// by per-tensor costs).
	index map[string]int
}

// NewStateDict builds a state dict from tensors in the given order. It
// returns an error on a duplicate name or an inconsistent tensor.
func NewStateDict(ts ...*Tensor) (*StateDict, error) {
	sd := &StateDict{}
	for _, t := range ts {
		if err := sd.Add(t); err != nil {
			return nil, err
		}
	}
	return sd, nil
}

// MakeStateDict returns an empty state dict with room for n tensors, so
// that adding them does not grow its slice or index.
func MakeStateDict(n int) *StateDict {
	sd := &StateDict{tensors: make([]*Tensor, 0, n)}
	if n > smallDict {
		sd.index = make(map[string]int, n)
	}
	return sd
}

// NewStateDictUnchecked builds a state dict that takes ts (in that order)
// as its own slice, without checking the tensors: the caller guarantees
// that every tensor is valid and that names are non-empty and unique.
// Decoders that have already checked all that use it to avoid checking
// twice; everyone else uses NewStateDict or Add.
func NewStateDictUnchecked(ts []*Tensor) *StateDict {
	sd := &StateDict{tensors: ts}
	if len(ts) > smallDict {
		sd.index = make(map[string]int, len(ts))
		for i, t := range ts {
			sd.index[t.Name] = i
		}
	}
	return sd
}

// Add appends t. It fails on an empty or duplicate name or an invalid tensor.
func (sd *StateDict) Add(t *Tensor) error {
	if t.Name == "" {
		return fmt.Errorf("tensor: empty tensor name")
	}
	if sd.indexOf(t.Name) >= 0 {
		return fmt.Errorf("tensor: duplicate tensor name %q", t.Name)
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if sd.index == nil && len(sd.tensors) >= smallDict {
		sd.index = make(map[string]int, 2*len(sd.tensors))
		for i, u := range sd.tensors {
			sd.index[u.Name] = i
		}
	}
	if sd.index != nil {
		sd.index[t.Name] = len(sd.tensors)
	}
	sd.tensors = append(sd.tensors, t)
	return nil
}

// Len returns the number of tensors.
func (sd *StateDict) Len() int { return len(sd.tensors) }

// At returns the i-th tensor in order.
func (sd *StateDict) At(i int) *Tensor { return sd.tensors[i] }

// Get returns the tensor named name, or nil.
func (sd *StateDict) Get(name string) *Tensor {
	if i := sd.indexOf(name); i >= 0 {
		return sd.tensors[i]
	}
	return nil
}

// Tensors returns the tensors in order. The slice is the state dict's own;
// callers must not modify it.
func (sd *StateDict) Tensors() []*Tensor { return sd.tensors }

// Names returns the tensor names in order.
func (sd *StateDict) Names() []string {
	names := make([]string, len(sd.tensors))
	for i, t := range sd.tensors {
		names[i] = t.Name
	}
	return names
}

// ByteSize returns the total number of data bytes.
func (sd *StateDict) ByteSize() int64 {
	var n int64
	for _, t := range sd.tensors {
		n += int64(len(t.Data))
	}
	return n
}

// Clone returns a deep copy with freshly allocated, aligned data.
func (sd *StateDict) Clone() *StateDict {
	c := &StateDict{tensors: make([]*Tensor, len(sd.tensors))}
	if sd.index != nil {
		c.index = make(map[string]int, len(sd.tensors))
	}
	for i, t := range sd.tensors {
		c.tensors[i] = t.Clone()
		if c.index != nil {
			c.index[t.Name] = i
		}
	}
	return c
}

// CheckLayout returns an error naming the first difference between sd and
// want in tensor names, dtypes or shapes (order is not compared).
func (sd *StateDict) CheckLayout(want *StateDict) error {
	if sd.Len() != want.Len() {
		return fmt.Errorf("tensor: %d tensors, model has %d", sd.Len(), want.Len())
	}
	for _, w := range want.tensors {
		g := sd.Get(w.Name)
		if g == nil {
			return fmt.Errorf("tensor: missing tensor %q", w.Name)
		}
		if !g.SameLayout(w) {
			// The shapes are clipped: a peer's tensor of rank 100000
			// would otherwise make this text (logged, kept as a model's
			// failure, sent back in errors) as large as its header.
			return fmt.Errorf("tensor %q: got %s, model has %s", w.Name, layoutText(g), layoutText(w))
		}
	}
	return nil
}

// maxLayoutText bounds the dtype and shape an error prints of one tensor.
const maxLayoutText = 160

// layoutText is t's dtype and shape as %v%v prints them, cut at
// maxLayoutText bytes (then saying the rank).
func layoutText(t *Tensor) string {
	s := fmt.Sprintf("%v%v", t.DType, t.Shape)
	if len(s) <= maxLayoutText {
		return s
	}
	return errs.Clip(s, maxLayoutText) + fmt.Sprintf("…(rank %d)", len(t.Shape))
}

// smallDict is the size up to which a state dict has no name index.
const smallDict = 32

// indexOf returns the position of the tensor named name, or -1.
func (sd *StateDict) indexOf(name string) int {
	if sd.index != nil {
		if i, ok := sd.index[name]; ok {
			return i
		}
		return -1
	}
	for i, t := range sd.tensors {
		if t.Name == name {
			return i
		}
	}
	return -1
}
