package cref

import "testing"

func TestAddMatchesPlainLoop(t *testing.T) {
	if !Available {
		t.Skip("built without cgo: the C reference is not compiled in")
	}
	for _, n := range []int{0, 1, 7, 8, 9, 31, 33, 1000} {
		dst := make([]float32, n)
		x := make([]float32, n)
		want := make([]float32, n)
		for i := range n {
			dst[i] = float32(i) * 0.5
			x[i] = float32(n-i) * 0.25
			want[i] = dst[i] + x[i]
		}
		Add(dst, x)
		for i := range n {
			if dst[i] != want[i] {
				t.Fatalf("n=%d: dst[%d] = %v, want %v", n, i, dst[i], want[i])
			}
		}
	}
}
