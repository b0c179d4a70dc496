package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
)

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += k
	return k, err
}

// ReadFrom receives a body straight into the blob: whole in one read or
// byte by byte, and a reader that ends early or fails is an error that
// sticks, as Write's are.
func TestAssemblerReadFrom(t *testing.T) {
	blob, err := safetensors.Encode(testDict(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]func() io.Reader{
		"whole":         func() io.Reader { return bytes.NewReader(blob) },
		"byte by byte":  func() io.Reader { return iotest.OneByteReader(bytes.NewReader(blob)) },
		"data with EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(blob)) },
	} {
		a, err := NewAssembler(uint64(len(blob)), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := a.ReadFrom(r()); err != nil || n != int64(len(blob)) {
			t.Fatalf("%s: ReadFrom = %d, %v", name, n, err)
		}
		f, got, err := a.Finish()
		if err != nil || !bytes.Equal(got, blob) || f.Tensors.Len() != 6 {
			t.Fatalf("%s: Finish: %v", name, err)
		}
	}

	t.Run("reads no further than the announced size", func(t *testing.T) {
		a, _ := NewAssembler(uint64(len(blob)), Limits{})
		src := &countingReader{r: bytes.NewReader(append(bytes.Clone(blob), "next request"...))}
		if _, err := a.ReadFrom(src); err != nil || src.n != len(blob) {
			t.Fatalf("read %d bytes (%v), want exactly %d", src.n, err, len(blob))
		}
	})
	t.Run("ends early", func(t *testing.T) {
		a, _ := NewAssembler(uint64(len(blob)), Limits{})
		_, err := a.ReadFrom(bytes.NewReader(blob[:len(blob)/2]))
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "ended after") {
			t.Fatalf("err = %v, want a short body", err)
		}
		if _, _, err2 := a.Finish(); err2 != err {
			t.Fatalf("Finish after a short body: %v", err2)
		}
	})
	t.Run("reader fails", func(t *testing.T) {
		boom := errors.New("connection reset")
		a, _ := NewAssembler(uint64(len(blob)), Limits{})
		_, err := a.ReadFrom(io.MultiReader(bytes.NewReader(blob[:100]), iotest.ErrReader(boom)))
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the reader's", err)
		}
		if _, _, err2 := a.Finish(); err2 != err {
			t.Fatalf("Finish after a failed read: %v", err2)
		}
	})
	t.Run("bad header length refused after 8 bytes", func(t *testing.T) {
		bad := binary.LittleEndian.AppendUint64(nil, 1<<30)
		bad = append(bad, make([]byte, 1<<20)...)
		a, _ := NewAssembler(uint64(len(bad)), Limits{})
		src := &countingReader{r: bytes.NewReader(bad)}
		_, err := a.ReadFrom(src)
		if !errors.Is(err, errs.ErrInvalid) || src.n != 8 {
			t.Fatalf("err = %v after %d bytes read; want the header limit after 8", err, src.n)
		}
	})
}
