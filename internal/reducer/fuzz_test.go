package reducer

import (
	"errors"
	"io"
	"math"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
)

// FuzzReceiveGradient feeds arbitrary bytes, in arbitrary chunks and with
// an arbitrary announced size, through the secondary's receive and check
// path: it must never panic, and must fail with an errs sentinel unless the
// bytes are a gradient of the model's exact layout; a gradient the receive
// scan calls clean has no NaN/Inf.
func FuzzReceiveGradient(f *testing.F) {
	good, _ := safetensors.Encode(testLayout(2), nil)
	f.Add(good, uint64(len(good)), uint8(7))
	f.Add(good[:len(good)-1], uint64(len(good)), uint8(3))
	f.Add([]byte("\xff\xff\xff\xff\xff\xff\xff\x7f{}"), uint64(10), uint8(1))
	nan := testLayout(2)
	w, _ := nan.Get("fc.weight").Float32s()
	w[5] = float32(math.NaN())
	bad, _ := safetensors.Encode(nan, nil)
	f.Add(bad, uint64(len(bad)), uint8(5))
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
		g, buf, clean, err := receiveGradient(total, 1<<20, true, chunks(recv))
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrFull) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		defer putBuf(buf)
		nonFinite, err := reduce.CheckGradient(layout, g)
		if err != nil && !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("check error %v wraps no sentinel", err)
		}
		if clean && nonFinite {
			t.Fatalf("receive scan called a gradient with NaN/Inf clean: %v", err)
		}
	})
}
