package safetensors

import (
	"fmt"
	"testing"

	"github.com/rlhub/rlhub/internal/tensor"
)

// Encode and decode at 1, 16 and 256 MiB next to a copy of the same bytes
// measured in the same run. Per size the sub-benchmarks run in order:
//
//	copy         copy(dst, blob) into a warm preallocated buffer: the baseline
//	copy-alloc   make + copy (what any allocating encoder must at least do)
//	encode-into  Plan + Layout.EncodeInto a warm preallocated buffer
//	encode-alloc Encode (Plan + a fresh aligned buffer)
//	decode       Decode: validate everything + zero-copy tensor views
//
// each reporting GB/s (blob bytes per second) and x_copy (its GB/s over the
// copy baseline's). The state dict is MLP-like: 8 layers of an [h,h] F32
// weight and an [h] bias (16 tensors); "tensors=256" repeats 1 MiB with 128
// layers, to show the header's share.
//
//	GOEXPERIMENT=simd go test -run '^$' -bench BenchmarkSafetensors ./internal/safetensors/

func mlpDict(size, layers int) *tensor.StateDict {
	h := int64(1)
	for int64(layers)*4*(h+1)*(h+1) <= int64(size) {
		h++
	}
	sd := &tensor.StateDict{}
	for i := range layers {
		w := tensor.NewF32(fmt.Sprintf("layers.%d.weight", i), h, h)
		for j := range w.Data {
			w.Data[j] = byte(j * 7)
		}
		if err := sd.Add(w); err != nil {
			panic(err)
		}
		if err := sd.Add(tensor.NewF32(fmt.Sprintf("layers.%d.bias", i), h)); err != nil {
			panic(err)
		}
	}
	return sd
}

func BenchmarkSafetensors(b *testing.B) {
	for _, sz := range []struct {
		name   string
		bytes  int
		layers int
	}{{"1MiB", 1 << 20, 8}, {"1MiB/tensors=256", 1 << 20, 128}, {"16MiB", 16 << 20, 8}, {"256MiB", 256 << 20, 8}} {
		sd := mlpDict(sz.bytes, sz.layers)
		blob, err := Encode(sd, map[string]string{"format": "pt"})
		if err != nil {
			b.Fatal(err)
		}
		dst := tensor.AlignedBytes(len(blob))
		copy(dst, blob) // fault the pages in before timing
		var copyGBps float64
		gbps := func(b *testing.B) float64 {
			return float64(len(blob)) * float64(b.N) / b.Elapsed().Seconds() / 1e9
		}
		run := func(name string, f func(b *testing.B)) {
			b.Run(fmt.Sprintf("size=%s/%s", sz.name, name), func(b *testing.B) {
				b.SetBytes(int64(len(blob)))
				b.ReportAllocs()
				for b.Loop() {
					f(b)
				}
				g := gbps(b)
				b.ReportMetric(g, "GB/s")
				if name == "copy" {
					copyGBps = g
				} else if copyGBps > 0 {
					b.ReportMetric(g/copyGBps, "x_copy")
				}
			})
		}
		run("copy", func(*testing.B) { copy(dst, blob) })
		run("copy-alloc", func(*testing.B) {
			d := tensor.AlignedBytes(len(blob))
			copy(d, blob)
		})
		run("encode-into", func(b *testing.B) {
			l, err := Plan(sd, map[string]string{"format": "pt"})
			if err != nil {
				b.Fatal(err)
			}
			l.EncodeInto(dst)
		})
		run("encode-alloc", func(b *testing.B) {
			if _, err := Encode(sd, map[string]string{"format": "pt"}); err != nil {
				b.Fatal(err)
			}
		})
		run("decode", func(b *testing.B) {
			f, err := Decode(blob)
			if err != nil || f.Tensors.Len() != 2*sz.layers {
				b.Fatal(err)
			}
		})
	}
}
