package wire

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// NewAssemblerInto receives into the caller's buffer when it is big enough
// and 8-byte aligned (same memory, no allocation), allocates when it is
// not, and checks the limits before either.
func TestNewAssemblerIntoReusesTheBuffer(t *testing.T) {
	blob, err := safetensors.Encode(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := tensor.AlignedBytes(len(blob) + 100)
	for i := range buf {
		buf[i] = 0xee // old contents, overwritten
	}
	for _, tc := range []struct {
		name string
		buf  []byte
		same bool
	}{{"big enough", buf, true}, {"exact", buf[:len(blob):len(blob)], true}, {"too small", buf[: len(blob)-1 : len(blob)-1], false}, {"unaligned", buf[1:], false}, {"nil", nil, false}} {
		a, err := NewAssemblerInto(tc.buf, uint64(len(blob)), Limits{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for p := blob; len(p) > 0; p = p[min(1000, len(p)):] {
			if err := a.Write(p[:min(1000, len(p))]); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		f, got, err := a.Finish()
		if err != nil || !bytes.Equal(got, blob) || f.Tensors.Len() != 6 {
			t.Fatalf("%s: Finish = %v, equal %v", tc.name, err, bytes.Equal(got, blob))
		}
		if same := unsafe.SliceData(got) == unsafe.SliceData(tc.buf); same != tc.same {
			t.Errorf("%s: received into the given buffer = %v, want %v", tc.name, same, tc.same)
		}
	}
	if _, err := NewAssemblerInto(buf, uint64(len(buf))+1, Limits{MaxBytes: int64(len(buf))}); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("over MaxBytes with a buffer: err = %v, want ErrFull", err)
	}
	if _, err := NewAssemblerInto(buf, 9, Limits{}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("9-byte blob with a buffer: err = %v, want ErrInvalid", err)
	}
}
