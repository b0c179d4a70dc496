package reducer

import (
	"bytes"
	"testing"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// TestBlobBytes: the unzeroed blob has exactly n bytes, 8-byte aligned,
// starting with the header, for small (zeroed fallback) and large sizes.
func TestBlobBytes(t *testing.T) {
	hdr := []byte("0123456789abcdef header")
	for _, n := range []int{len(hdr), len(hdr) + 1, 4096, 64 << 10, 64<<10 + 3, 1 << 22, 1<<22 + 12345} {
		for range 3 { // reuse freed memory: the large path must not care
			b := blobBytes(n, hdr)
			if len(b) != n || cap(b) != n {
				t.Fatalf("n=%d: len %d cap %d", n, len(b), cap(b))
			}
			if !tensor.Aligned(b) {
				t.Fatalf("n=%d: blob is not 8-byte aligned", n)
			}
			if !bytes.Equal(b[:len(hdr)], hdr) {
				t.Fatalf("n=%d: header %q", n, b[:len(hdr)])
			}
			for i := range b[len(hdr):] { // writable end to end
				b[len(hdr)+i] = byte(i)
			}
		}
	}
}

// TestNewBlobIsTheEncoding: once every tensor view is written, the blob
// newBlob returned is byte for byte the safetensors encoding of those
// tensors, so no byte of it is left to chance.
func TestNewBlobIsTheEncoding(t *testing.T) {
	for _, n := range []int{3, 40_000} { // zeroed and unzeroed blobs
		model := testLayout(n)
		plan, err := safetensors.Plan(model, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := &pmodel{plan: plan}
		for range 3 {
			blob, dst := m.newBlob()
			for i, tn := range dst.Tensors() {
				for j := range tn.Data {
					tn.Data[j] = byte(i + 7*j)
				}
			}
			want, err := safetensors.Encode(dst, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(blob, want) {
				t.Fatalf("n=%d: blob differs from the encoding of its tensors", n)
			}
		}
	}
}
