package reducer

import (
	"errors"
	"io"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
)

// FuzzReceiveGradient feeds arbitrary bytes, in arbitrary chunks and with
// an arbitrary announced size, through the secondary's receive and check
// path: it must never panic, and must fail with an errs sentinel unless the
// bytes are a gradient of the model's exact layout.
func FuzzReceiveGradient(f *testing.F) {
	good, _ := safetensors.Encode(testLayout(2), nil)
	f.Add(good, uint64(len(good)), uint8(7))
	f.Add(good[:len(good)-1], uint64(len(good)), uint8(3))
	f.Add([]byte("\xff\xff\xff\xff\xff\xff\xff\x7f{}"), uint64(10), uint8(1))
	layout := testLayout(2)
	f.Fuzz(func(t *testing.T, data []byte, total uint64, step uint8) {
		if total > 1<<20 {
			total %= 1 << 20
		}
		k := int(step%64) + 1
		rest := data
		recv := func(write func([]byte) error) error {
			if len(rest) == 0 {
				return io.EOF
			}
			n := min(k, len(rest))
			b := rest[:n]
			rest = rest[n:]
			return write(b)
		}
		g, buf, err := receiveGradient(total, 1<<20, recv)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrFull) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		defer putBuf(buf)
		if _, err := reduce.CheckGradient(layout, g); err != nil && !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("check error %v wraps no sentinel", err)
		}
	})
}
