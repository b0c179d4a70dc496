package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// FuzzAssembler feeds an announced size and arbitrary bytes, cut into
// chunks at fuzzer-chosen sizes, to an Assembler with small limits. It must
// never panic or buffer past the announcement, must fail only with
// ErrInvalid or ErrFull, and when it succeeds the blob is exactly the bytes
// fed and decodes.
func FuzzAssembler(f *testing.F) {
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 3, 2), tensor.NewF32("b", 2))
	good, _ := safetensors.Encode(sd, map[string]string{"v": "1"})
	f.Add(uint64(len(good)), good, []byte{5, 64, 1})
	f.Add(uint64(len(good)+3), good, []byte{200})
	f.Add(uint64(len(good)-1), good, []byte{8})
	f.Add(uint64(1<<40), good, []byte{1})
	f.Add(uint64(20), binary.LittleEndian.AppendUint64(nil, 1<<62), []byte{2})
	f.Fuzz(func(t *testing.T, total uint64, data, cuts []byte) {
		lim := Limits{MaxBytes: 1 << 16, MaxHeaderBytes: 4096}
		a, err := NewAssembler(total, lim)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrFull) {
				t.Fatalf("NewAssembler: %v", err)
			}
			return
		}
		fed := 0
		for i := 0; fed < len(data); i++ {
			n := 1
			if len(cuts) > 0 {
				n = int(cuts[i%len(cuts)]) + 1
			}
			n = min(n, len(data)-fed)
			werr := a.Write(data[fed : fed+n])
			if a.Received() > int(total) {
				t.Fatalf("buffered %d bytes of %d announced", a.Received(), total)
			}
			if werr != nil {
				if !errors.Is(werr, errs.ErrInvalid) {
					t.Fatalf("Write: %v", werr)
				}
				return
			}
			fed += n
		}
		f, blob, err := a.Finish()
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("Finish: %v", err)
			}
			return
		}
		if !bytes.Equal(blob, data) || uint64(len(blob)) != total || f == nil {
			t.Fatal("assembled blob differs from the bytes fed")
		}
	})
}
