package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/tensor"
)

// The vectors under testdata/vectors were written by the Python safetensors
// library (scripts/gen_safetensors_vectors.py). Go must read each one to the
// values the script recorded and write it back byte for byte.

type vectorFile struct {
	Metadata map[string]string `json:"metadata"`
	Tensors  []struct {
		Name   string            `json:"name"`
		DType  string            `json:"dtype"`
		Shape  []int64           `json:"shape"`
		Values []json.RawMessage `json:"values"`
	} `json:"tensors"`
}

// hashOrderedMetadata names vectors whose metadata the Python library writes
// in HashMap order (several keys): Go writes sorted keys, so only decoding
// and a semantic round trip are checked.
var hashOrderedMetadata = map[string]bool{"metadata_multi": true}

func loadVectors(t testing.TB) map[string][]byte {
	paths, err := filepath.Glob("testdata/vectors/*.safetensors")
	if err != nil || len(paths) < 8 {
		t.Fatalf("want ≥ 8 test vectors, found %d (%v); run scripts/gen_safetensors_vectors.py", len(paths), err)
	}
	out := make(map[string][]byte)
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".safetensors")] = b
	}
	return out
}

func TestPythonVectors(t *testing.T) {
	for name, blob := range loadVectors(t) {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata/vectors", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var want vectorFile
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			if err := dec.Decode(&want); err != nil {
				t.Fatal(err)
			}
			// Decode from an aligned copy, as a receiver would.
			buf := tensor.AlignedBytes(len(blob))
			copy(buf, blob)
			f, err := Decode(buf)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if len(f.Metadata) != len(want.Metadata) {
				t.Errorf("metadata = %q, want %q", f.Metadata, want.Metadata)
			}
			for k, v := range want.Metadata {
				if f.Metadata[k] != v {
					t.Errorf("metadata[%q] = %q, want %q", k, f.Metadata[k], v)
				}
			}
			if f.Tensors.Len() != len(want.Tensors) {
				t.Fatalf("%d tensors, want %d", f.Tensors.Len(), len(want.Tensors))
			}
			for i, wt := range want.Tensors {
				got := f.Tensors.At(i)
				if got.Name != wt.Name || got.DType.String() != wt.DType || !equalShape(got.Shape, wt.Shape) {
					t.Fatalf("tensor %d = %q %v %v, want %q %s %v", i, got.Name, got.DType, got.Shape, wt.Name, wt.DType, wt.Shape)
				}
				if int64(len(wt.Values)) != got.NumElements() {
					t.Fatalf("%q: %d values recorded, %d elements decoded", wt.Name, len(wt.Values), got.NumElements())
				}
				for j, wv := range wt.Values {
					if err := checkElement(got, j, string(wv)); err != "" {
						t.Fatalf("%q[%d]: %s", wt.Name, j, err)
					}
				}
			}
			again, err := Encode(f.Tensors, f.Metadata)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if hashOrderedMetadata[name] {
				g, err := Decode(again)
				if err != nil {
					t.Fatalf("decoding Go's encoding: %v", err)
				}
				if len(g.Metadata) != len(f.Metadata) || !bytes.Equal(again[len(again)-int(f.Tensors.ByteSize()):], blob[len(blob)-int(f.Tensors.ByteSize()):]) {
					t.Fatal("Go's re-encoding does not decode to the same metadata and data")
				}
				return
			}
			if !bytes.Equal(again, blob) {
				t.Fatalf("re-encoding differs from the Python bytes\n got %q\nwant %q", head(again), head(blob))
			}
		})
	}
}

func head(b []byte) []byte {
	if len(b) < 8 {
		return b
	}
	n := min(int(binary.LittleEndian.Uint64(b)), len(b)-8)
	return b[:8+n]
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkElement compares element j of t with the recorded value and returns
// a description of the difference, or "".
func checkElement(t *tensor.Tensor, j int, want string) string {
	sz := t.DType.Size()
	b := t.Data[j*sz : (j+1)*sz]
	var u uint64
	for k := sz - 1; k >= 0; k-- {
		u = u<<8 | uint64(b[k])
	}
	var got string
	switch t.DType {
	case tensor.F32:
		return cmpFloat(float64(math.Float32frombits(uint32(u))), want)
	case tensor.F64:
		return cmpFloat(math.Float64frombits(u), want)
	case tensor.F16:
		return cmpFloat(float64(kernels.F16ToFloat32(uint16(u))), want)
	case tensor.BF16:
		return cmpFloat(float64(kernels.BF16ToFloat32(uint16(u))), want)
	case tensor.BOOL:
		switch u {
		case 0:
			got = "false"
		case 1:
			got = "true"
		default:
			got = "bool byte " + strconv.FormatUint(u, 10)
		}
	case tensor.I8, tensor.I16, tensor.I32, tensor.I64:
		shift := 64 - 8*sz
		got = strconv.FormatInt(int64(u<<shift)>>shift, 10)
	case tensor.U8, tensor.U16, tensor.U32, tensor.U64:
		got = strconv.FormatUint(u, 10)
	default:
		return "no value check for " + t.DType.String()
	}
	if got != want {
		return "got " + got + ", want " + want
	}
	return ""
}

func cmpFloat(got float64, want string) string {
	switch want {
	case `"nan"`:
		if math.IsNaN(got) {
			return ""
		}
	case `"inf"`:
		if math.IsInf(got, 1) {
			return ""
		}
	case `"-inf"`:
		if math.IsInf(got, -1) {
			return ""
		}
	default:
		w, err := strconv.ParseFloat(want, 64)
		if err == nil && w == got {
			return ""
		}
	}
	return "got " + strconv.FormatFloat(got, 'g', -1, 64) + ", want " + want
}
