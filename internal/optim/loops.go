package optim

import "math"

// The element loops of SGD (with weight decay or momentum), Adam/AdamW and
// RMSprop. The plain Go loops here are the reference and the fallback; on
// amd64 built with GOEXPERIMENT=simd an AVX2 version of each (simd_amd64.go)
// computes the same operations in the same order, without fusing any
// multiply-add, so both give bit-identical results (loops_test.go checks
// it). Every rounding is pinned with an explicit float32 conversion: Go may
// otherwise fuse x*y + z (it does on arm64, and on amd64 with GOAMD64=v3),
// and the two paths would round differently.
//
// The flags and derived constants in the hyper-parameter structs (hasWD,
// lerpLo, b1w1, alphac1) are computed once by the caller: the SIMD loops must
// not do scalar float arithmetic or comparisons themselves, as the compiler
// may emit them as legacy SSE instructions, inside the loop even (it
// re-evaluates comparisons there), and each switch from dirty AVX state to
// SSE code costs ~150 ns on this project's VM (the first version, with
// `wd != 0` in the loop, ran 20× slower than the scalar code).
//
// Each loop writes every element of dst and may run with dst == p (the
// in-place Step): element j of p is read before dst[j] is written. The
// state buffers (b, m, v, sq, ga, mb) are updated in place.

// sgdHyper holds the per-step constants of the SGD loops.
type sgdHyper struct {
	wd, mom, damp, nlr float32 // nlr = −lr; damp = 1 − dampening
	hasWD              bool    // wd != 0
	momentum           bool    // b is the momentum buffer (mom > 0)
	fresh              bool    // b was just created: it takes the gradient
	nesterov           bool
}

// adamHyper holds the per-step constants of the Adam/AdamW loops.
type adamHyper struct {
	b1w, b1w1        float32 // lerp weight 1−β1, and 1 − that weight
	b2, b2c          float32 // β2; 1−β2
	nstep            float32 // −lr / (1 − β1^t)
	bc2Sqrt, eps, wd float32
	decay            float32 // AdamW: 1 − lr·wd
	decoupled        bool    // AdamW
	hasWD            bool    // wd != 0
	lerpLo           bool    // b1w < 0.5: lerp's first formula
}

// rmspropHyper holds the per-step constants of the RMSprop loops.
type rmspropHyper struct {
	alpha, alphac, wd, eps, mom, nlr float32
	alphac1                          float32 // 1 − alphac (lerp)
	centered, momentum               bool
	hasWD                            bool // wd != 0
	lerpLo                           bool // alphac < 0.5: lerp's first formula
}

// loops is one implementation of the element loops.
type loops struct {
	name    string
	sgd     func(dst, p, g, b []float32, h *sgdHyper)
	adam    func(dst, p, g, m, v []float32, h *adamHyper)
	rmsprop func(dst, p, g, sq, ga, mb []float32, h *rmspropHyper)
}

var genericLoops = loops{name: "generic", sgd: sgdGeneric, adam: adamGeneric, rmsprop: rmspropGeneric}

// activeLoops is set once at init (see simd_amd64.go) and only swapped by
// tests; loopPaths lists every implementation this build and CPU can run.
var (
	activeLoops = genericLoops
	loopPaths   = []loops{genericLoops}
)

// sgdGeneric is torch's _single_tensor_sgd for one tensor when weight decay
// or momentum is set (b is nil without momentum).
func sgdGeneric(dst, p, g, b []float32, h *sgdHyper) {
	dst, g = dst[:len(p)], g[:len(p)]
	if h.momentum {
		b = b[:len(p)]
	}
	for j := range p {
		pj, d := p[j], g[j]
		if h.hasWD {
			d += float32(h.wd * pj)
		}
		if h.momentum {
			if h.fresh {
				b[j] = d
			} else {
				b[j] = float32(h.mom*b[j]) + float32(h.damp*d)
			}
			if h.nesterov {
				d += float32(h.mom * b[j])
			} else {
				d = b[j]
			}
		}
		dst[j] = pj + float32(h.nlr*d)
	}
}

// adamGeneric is torch's _single_tensor_adam for one tensor (amsgrad off).
func adamGeneric(dst, p, g, m, v []float32, h *adamHyper) {
	dst, g, m, v = dst[:len(p)], g[:len(p)], m[:len(p)], v[:len(p)]
	for j := range p {
		d, pj := g[j], p[j]
		if h.decoupled {
			pj *= h.decay
		} else if h.hasWD {
			d += float32(h.wd * pj)
		}
		mj := lerp(m[j], d, h.b1w)
		vj := float32(v[j]*h.b2) + float32(float32(h.b2c*d)*d)
		m[j], v[j] = mj, vj
		den := sqrt32(vj)/h.bc2Sqrt + h.eps
		dst[j] = pj + float32(h.nstep*(mj/den))
	}
}

// rmspropGeneric is torch's _single_tensor_rmsprop for one tensor (ga is nil
// unless centered, mb nil without momentum).
func rmspropGeneric(dst, p, g, sq, ga, mb []float32, h *rmspropHyper) {
	dst, g, sq = dst[:len(p)], g[:len(p)], sq[:len(p)]
	if h.centered {
		ga = ga[:len(p)]
	}
	if h.momentum {
		mb = mb[:len(p)]
	}
	for j := range p {
		pj, d := p[j], g[j]
		if h.hasWD {
			d += float32(h.wd * pj)
		}
		s := float32(sq[j]*h.alpha) + float32(float32(h.alphac*d)*d)
		sq[j] = s
		var avg float32
		if h.centered {
			a := lerp(ga[j], d, h.alphac)
			ga[j] = a
			avg = sqrt32(s - float32(a*a))
		} else {
			avg = sqrt32(s)
		}
		avg += h.eps
		if h.momentum {
			u := float32(mb[j]*h.mom) + d/avg
			mb[j] = u
			dst[j] = pj + float32(h.nlr*u)
		} else {
			dst[j] = pj + float32(h.nlr*(d/avg))
		}
	}
}

// lerp is PyTorch's CPU lerp: it picks the formula by weight for accuracy.
func lerp(a, b, w float32) float32 {
	if w < 0.5 {
		return a + float32(w*(b-a))
	}
	return b - float32((b-a)*(1-w))
}

// sqrt32 is the correctly rounded float32 square root (the float64 root
// rounded once more is still correctly rounded), as VSQRTPS computes it.
func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
