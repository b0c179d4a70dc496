package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// testDict has tensors around the chunk sizes the tests use: empty, tiny,
// exactly a chunk, one byte over, and several chunks.
func testDict(t testing.TB) *tensor.StateDict {
	t.Helper()
	mk := func(name string, dt tensor.DType, n int64) *tensor.Tensor {
		d := make([]byte, n*int64(dt.Size()))
		for i := range d {
			d[i] = byte(i*31 + len(name))
		}
		return &tensor.Tensor{Name: name, DType: dt, Shape: []int64{n}, Data: d}
	}
	sd, err := tensor.NewStateDict(
		mk("empty", tensor.F32, 0),
		mk("tiny", tensor.U8, 3),
		mk("chunk", tensor.F32, 16),     // 64 bytes
		mk("chunk+1", tensor.U8, 65),    // 65 bytes
		mk("big", tensor.F64, 1000),     // 8000 bytes
		mk("half", tensor.BF16, 50_001), // 100002 bytes
	)
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

// regions returns [start,end) address ranges of the header and each tensor.
func regions(l *safetensors.Layout) [][2]uintptr {
	var rs [][2]uintptr
	add := func(b []byte) {
		if len(b) > 0 {
			p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			rs = append(rs, [2]uintptr{p, p + uintptr(len(b))})
		}
	}
	add(l.Header)
	for _, t := range l.Order {
		add(t.Data)
	}
	return rs
}

func TestChunksNeverSpanAndConcatenateToEncode(t *testing.T) {
	sd := testDict(t)
	want, err := safetensors.Encode(sd, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := safetensors.Plan(sd, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	rs := regions(l)
	for _, size := range []int{1, 7, 64, 65, 4096, 0, -5} {
		limit := size
		if limit <= 0 {
			limit = DefaultChunkBytes
		}
		var got []byte
		chunks := 0
		err := Chunks(l, size, func(c []byte) error {
			chunks++
			if len(c) == 0 || len(c) > limit {
				return fmt.Errorf("chunk %d has %d bytes, limit %d", chunks, len(c), limit)
			}
			p := uintptr(unsafe.Pointer(unsafe.SliceData(c)))
			inside := false
			for _, r := range rs {
				if p >= r[0] && p+uintptr(len(c)) <= r[1] {
					inside = true
				}
			}
			if !inside {
				return fmt.Errorf("chunk %d (%d bytes) is not a slice of the header or of one tensor", chunks, len(c))
			}
			got = append(got, c...)
			return nil
		})
		if err != nil {
			t.Fatalf("chunk size %d: %v", size, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("chunk size %d: concatenation of %d chunks differs from Encode", size, chunks)
		}
		var again []byte
		if err := ChunksOf(want, size, func(c []byte) error {
			if len(c) == 0 || len(c) > limit {
				return fmt.Errorf("ChunksOf chunk of %d bytes", len(c))
			}
			again = append(again, c...)
			return nil
		}); err != nil || !bytes.Equal(again, want) {
			t.Fatalf("ChunksOf size %d: %v, equal=%v", size, err, bytes.Equal(again, want))
		}
	}
}

func TestChunksStopsOnYieldError(t *testing.T) {
	l, err := safetensors.Plan(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("receiver gone")
	calls := 0
	err = Chunks(l, 64, func([]byte) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("err = %v after %d calls, want the yield error after 3", err, calls)
	}
}

func TestChunksDoNotAllocate(t *testing.T) {
	l, err := safetensors.Plan(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	yield := func(c []byte) error { n += len(c); return nil }
	allocs := testing.AllocsPerRun(20, func() { _ = Chunks(l, 64, yield) })
	if allocs != 0 {
		t.Fatalf("Chunks allocates %v times per call; want 0", allocs)
	}
	blob := l.EncodeInto(make([]byte, l.Size))
	if a := testing.AllocsPerRun(20, func() { _ = ChunksOf(blob, 64, yield) }); a != 0 {
		t.Fatalf("ChunksOf allocates %v times per call", a)
	}
}

func assemble(t *testing.T, blob []byte, chunk int, lim Limits) (*safetensors.File, []byte, error) {
	t.Helper()
	a, err := NewAssembler(uint64(len(blob)), lim)
	if err != nil {
		return nil, nil, err
	}
	if err := ChunksOf(blob, chunk, a.Write); err != nil {
		return nil, nil, err
	}
	return a.Finish()
}

func TestAssemblerRoundTrip(t *testing.T) {
	blob, err := safetensors.Encode(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 3, 8, 9, 1000, 1 << 20} {
		f, got, err := assemble(t, blob, chunk, Limits{})
		if err != nil {
			t.Fatalf("chunk %d: %v", chunk, err)
		}
		if !bytes.Equal(got, blob) || f.Tensors.Len() != 6 {
			t.Fatalf("chunk %d: reassembled blob differs", chunk)
		}
		if uintptr(unsafe.Pointer(unsafe.SliceData(got)))%8 != 0 {
			t.Fatal("assembled buffer is not 8-byte aligned")
		}
		if _, err := f.Tensors.Get("chunk").Float32s(); err != nil {
			t.Fatalf("zero-copy float32 view of a received tensor: %v", err)
		}
	}
}

func TestAssemblerLimitsBeforeAllocating(t *testing.T) {
	// A sender announcing a blob over the limit is refused with ErrFull and
	// nothing near that size is allocated.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := NewAssembler(1<<40, Limits{MaxBytes: 1 << 30})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errs.ErrFull) {
		t.Fatalf("1 TiB announcement: err = %v, want ErrFull", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("refusing an oversize blob allocated %d bytes", d)
	}
	if _, err := NewAssembler(4<<30+1, Limits{}); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("over the default 4 GiB: err = %v, want ErrFull", err)
	}
	if _, err := NewAssembler(1<<20+1, Limits{MaxBytes: 1 << 20}); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("one byte over MaxBytes: err = %v, want ErrFull", err)
	}
	if _, err := NewAssembler(1<<20, Limits{MaxBytes: 1 << 20}); err != nil {
		t.Fatalf("exactly MaxBytes: %v", err)
	}
	if _, err := NewAssembler(9, Limits{}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("9-byte blob: err = %v, want ErrInvalid", err)
	}
}

func TestAssemblerRejects(t *testing.T) {
	blob, err := safetensors.Encode(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	prefix := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }

	t.Run("huge header length on the first 8 bytes", func(t *testing.T) {
		a, err := NewAssembler(1<<20, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		p := prefix(1 << 30)
		if err := a.Write(p[:3]); err != nil {
			t.Fatalf("3 bytes: %v", err)
		}
		err = a.Write(p[3:])
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "exceeds the limit of 16777216") {
			t.Fatalf("err = %v, want the header limit", err)
		}
		if a.Received() != 8 {
			t.Fatalf("received %d bytes", a.Received())
		}
		// Sticky: later chunks and Finish report the same failure.
		if err2 := a.Write(make([]byte, 10)); err2 != err {
			t.Fatalf("write after failure: %v", err2)
		}
		if _, _, err3 := a.Finish(); err3 != err {
			t.Fatalf("finish after failure: %v", err3)
		}
	})
	t.Run("header longer than the announced blob", func(t *testing.T) {
		a, _ := NewAssembler(100, Limits{})
		if err := a.Write(prefix(93)); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "exceeds the announced blob") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("header limit from Limits", func(t *testing.T) {
		a, _ := NewAssembler(uint64(len(blob)), Limits{MaxHeaderBytes: 64})
		if err := ChunksOf(blob, 1000, a.Write); !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("err = %v, want the 64-byte header limit", err)
		}
	})
	t.Run("overrun", func(t *testing.T) {
		a, _ := NewAssembler(uint64(len(blob)-1), Limits{})
		err := ChunksOf(blob, 4096, a.Write)
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "overrun") {
			t.Fatalf("err = %v, want overrun", err)
		}
		if a.Received() > len(blob)-1 {
			t.Fatalf("buffered %d bytes past the announced size", a.Received())
		}
	})
	t.Run("short stream", func(t *testing.T) {
		a, _ := NewAssembler(uint64(len(blob)+1), Limits{})
		if err := ChunksOf(blob, 4096, a.Write); err != nil {
			t.Fatal(err)
		}
		_, _, err := a.Finish()
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("stream ended after %d of %d", len(blob), len(blob)+1)) {
			t.Fatalf("err = %v, want short stream", err)
		}
	})
	t.Run("garbage that fits", func(t *testing.T) {
		bad := append(prefix(4), "{}xx"...)
		_, _, err := assemble(t, bad, 3, Limits{})
		if !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid from the decoder", err)
		}
	})
}
