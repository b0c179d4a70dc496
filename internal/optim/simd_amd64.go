//go:build goexperiment.simd && amd64

package optim

import "simd/archsimd"

// The AVX2 loops: 8 lanes at a time, then the plain loop for the tail (< 8
// elements) after clearing the upper AVX state. Each mirrors its generic
// loop operation for operation with separate multiplies and adds (no FMA),
// the correctly rounded VSQRTPS and VDIVPS, so results are bit-identical.
// Branches on the per-step flags stay inside the loop: they are predicted
// perfectly, and the loops are bound by memory and the divider.

func init() {
	if archsimd.X86.AVX2() {
		activeLoops = avx2Loops
		loopPaths = append(loopPaths, avx2Loops)
	}
}

var avx2Loops = loops{name: "avx2", sgd: sgdAVX2, adam: adamAVX2, rmsprop: rmspropAVX2}

func bcast(x float32) archsimd.Float32x8 { return archsimd.BroadcastFloat32x8(x) }

// lerp8 is lerp on 8 lanes; w is the same in every lane, so the formula is
// chosen once per step by the caller (lo: w < 0.5) and w1 is 1 − w.
func lerp8(a, b, w, w1 archsimd.Float32x8, lo bool) archsimd.Float32x8 {
	if lo {
		return a.Add(w.Mul(b.Sub(a)))
	}
	return b.Sub(b.Sub(a).Mul(w1))
}

func sgdAVX2(dst, p, g, b []float32, h *sgdHyper) {
	n := len(p)
	dst, g = dst[:n], g[:n]
	if h.momentum {
		b = b[:n]
	}
	wd, mom, damp, nlr := bcast(h.wd), bcast(h.mom), bcast(h.damp), bcast(h.nlr)
	i := 0
	for ; i+8 <= n; i += 8 {
		pj := archsimd.LoadFloat32x8Slice(p[i:])
		d := archsimd.LoadFloat32x8Slice(g[i:])
		if h.hasWD {
			d = d.Add(wd.Mul(pj))
		}
		if h.momentum {
			var bj archsimd.Float32x8
			if h.fresh {
				bj = d
			} else {
				bj = mom.Mul(archsimd.LoadFloat32x8Slice(b[i:])).Add(damp.Mul(d))
			}
			bj.StoreSlice(b[i:])
			if h.nesterov {
				d = d.Add(mom.Mul(bj))
			} else {
				d = bj
			}
		}
		pj.Add(nlr.Mul(d)).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		if h.momentum {
			b = b[i:]
		}
		sgdGeneric(dst[i:], p[i:], g[i:], b, h)
	}
}

func adamAVX2(dst, p, g, m, v []float32, h *adamHyper) {
	n := len(p)
	dst, g, m, v = dst[:n], g[:n], m[:n], v[:n]
	w, w1 := bcast(h.b1w), bcast(h.b1w1)
	b2, b2c, nstep := bcast(h.b2), bcast(h.b2c), bcast(h.nstep)
	bc2Sqrt, eps, wd, decay := bcast(h.bc2Sqrt), bcast(h.eps), bcast(h.wd), bcast(h.decay)
	i := 0
	for ; i+8 <= n; i += 8 {
		d := archsimd.LoadFloat32x8Slice(g[i:])
		pj := archsimd.LoadFloat32x8Slice(p[i:])
		if h.decoupled {
			pj = pj.Mul(decay)
		} else if h.hasWD {
			d = d.Add(wd.Mul(pj))
		}
		mj := lerp8(archsimd.LoadFloat32x8Slice(m[i:]), d, w, w1, h.lerpLo)
		vj := archsimd.LoadFloat32x8Slice(v[i:]).Mul(b2).Add(b2c.Mul(d).Mul(d))
		mj.StoreSlice(m[i:])
		vj.StoreSlice(v[i:])
		den := vj.Sqrt().Div(bc2Sqrt).Add(eps)
		pj.Add(nstep.Mul(mj.Div(den))).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		adamGeneric(dst[i:], p[i:], g[i:], m[i:], v[i:], h)
	}
}

func rmspropAVX2(dst, p, g, sq, ga, mb []float32, h *rmspropHyper) {
	n := len(p)
	dst, g, sq = dst[:n], g[:n], sq[:n]
	if h.centered {
		ga = ga[:n]
	}
	if h.momentum {
		mb = mb[:n]
	}
	alpha, alphac, wd, eps := bcast(h.alpha), bcast(h.alphac), bcast(h.wd), bcast(h.eps)
	mom, nlr := bcast(h.mom), bcast(h.nlr)
	w1 := bcast(h.alphac1)
	i := 0
	for ; i+8 <= n; i += 8 {
		pj := archsimd.LoadFloat32x8Slice(p[i:])
		d := archsimd.LoadFloat32x8Slice(g[i:])
		if h.hasWD {
			d = d.Add(wd.Mul(pj))
		}
		s := archsimd.LoadFloat32x8Slice(sq[i:]).Mul(alpha).Add(alphac.Mul(d).Mul(d))
		s.StoreSlice(sq[i:])
		var avg archsimd.Float32x8
		if h.centered {
			a := lerp8(archsimd.LoadFloat32x8Slice(ga[i:]), d, alphac, w1, h.lerpLo)
			a.StoreSlice(ga[i:])
			avg = s.Sub(a.Mul(a)).Sqrt()
		} else {
			avg = s.Sqrt()
		}
		avg = avg.Add(eps)
		if h.momentum {
			u := archsimd.LoadFloat32x8Slice(mb[i:]).Mul(mom).Add(d.Div(avg))
			u.StoreSlice(mb[i:])
			pj.Add(nlr.Mul(u)).StoreSlice(dst[i:])
		} else {
			pj.Add(nlr.Mul(d.Div(avg))).StoreSlice(dst[i:])
		}
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		if h.centered {
			ga = ga[i:]
		}
		if h.momentum {
			mb = mb[i:]
		}
		rmspropGeneric(dst[i:], p[i:], g[i:], sq[i:], ga, mb, h)
	}
}
