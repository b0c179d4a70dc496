package optim

import "math"

// Adagrad, Adamax, NAdam and RAdam: torch.optim's single-tensor CPU
// implementations (foreach off, maximize off), element by element in
// float32 as torch computes them; Python-float scalars (learning rates,
// bias corrections) are computed in float64 and rounded once to float32
// where torch hands them to a float32 kernel. Plain loops: these are not
// the reducer's hot defaults, so they have no SIMD version.

// truncate bounds a string echoed in an error.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// adagrad is torch.optim.Adagrad's _single_tensor_adagrad (dense).
func (o *Optimizer) adagrad(i int, dst, p, g []float32, lr float64, step int64) {
	c := &o.cfg
	sum, fresh := o.buf(slotSum, i, len(p))
	if fresh && c.InitialAccumulatorValue != 0 {
		for j := range sum {
			sum[j] = float32(c.InitialAccumulatorValue)
		}
	}
	dst, g, sum = dst[:len(p)], g[:len(p)], sum[:len(p)]
	wd, eps := float32(c.WeightDecay), float32(c.Eps)
	nclr := float32(-(lr / (1 + float64(step-1)*c.LRDecay)))
	for j := range p {
		pj, d := p[j], g[j]
		if wd != 0 {
			d += float32(wd * pj)
		}
		s := sum[j] + float32(d*d)
		sum[j] = s
		std := sqrt32(s) + eps
		dst[j] = pj + float32(nclr*d)/std
	}
}

// adamax is torch.optim.Adamax's _single_tensor_adamax.
func (o *Optimizer) adamax(i int, dst, p, g []float32, lr float64, step int64) {
	c := &o.cfg
	m, _ := o.buf(slotExpAvg, i, len(p))
	u, _ := o.buf(slotExpInf, i, len(p))
	dst, g, m, u = dst[:len(p)], g[:len(p)], m[:len(p)], u[:len(p)]
	wd, eps, b2, b1w := float32(c.WeightDecay), float32(c.Eps), float32(c.Beta2), float32(1-c.Beta1)
	nclr := float32(-(lr / (1 - math.Pow(c.Beta1, float64(step)))))
	for j := range p {
		pj, d := p[j], g[j]
		if wd != 0 {
			d += float32(wd * pj)
		}
		mj := lerp(m[j], d, b1w)
		uj := max(float32(u[j]*b2), float32(math.Abs(float64(d)))+eps)
		m[j], u[j] = mj, uj
		dst[j] = pj + float32(nclr*mj)/uj
	}
}

// nadamMu is NAdam's momentum coefficient μ_t (a Python float).
func nadamMu(c *Config, t int64) float64 {
	return c.Beta1 * (1.0 - 0.5*math.Pow(0.96, float64(t)*c.MomentumDecay))
}

// nadamMuProduct is NAdam's mu_product after t steps: torch keeps it in a
// float32 scalar tensor, multiplied by each μ (rounded to float32) in
// float32. It is a function of t alone, so it needs no checkpoint.
var nadamMuProduct = func(c *Config, t int64) float32 { // a variable: tests count the replays
	prod := float32(1)
	for s := int64(1); s <= t; s++ {
		prod *= float32(nadamMu(c, s))
	}
	return prod
}

// nadam is torch.optim.NAdam's _single_tensor_nadam.
func (o *Optimizer) nadam(i int, dst, p, g []float32, lr float64, step int64) {
	c := &o.cfg
	m, _ := o.buf(slotExpAvg, i, len(p))
	v, _ := o.buf(slotExpAvgSq, i, len(p))
	dst, g, m, v = dst[:len(p)], g[:len(p)], m[:len(p)], v[:len(p)]
	bc2 := float32(1 - math.Pow(c.Beta2, float64(step)))
	mu, muNext := nadamMu(c, step), nadamMu(c, step+1)
	if o.muStep != step {
		if o.muStep != 0 && o.muStep == step-1 {
			o.muProd *= float32(nadamMu(c, step))
		} else {
			o.muProd = nadamMuProduct(c, step)
		}
		o.muStep = step
	}
	muProd := float64(o.muProd)
	muProdNext := muProd * muNext
	c1 := float32(-lr * (1.0 - mu) / (1.0 - muProd))
	c2 := float32((-lr * muNext) / (1.0 - muProdNext))
	wd, eps, b2, b2c, b1w := float32(c.WeightDecay), float32(c.Eps), float32(c.Beta2), float32(1-c.Beta2), float32(1-c.Beta1)
	decay := float32(1 - lr*c.WeightDecay)
	for j := range p {
		pj, d := p[j], g[j]
		if wd != 0 {
			if c.DecoupledWeightDecay {
				pj *= decay
			} else {
				d += float32(wd * pj)
			}
		}
		mj := lerp(m[j], d, b1w)
		vj := float32(v[j]*b2) + float32(float32(b2c*d)*d)
		m[j], v[j] = mj, vj
		den := sqrt32(vj/bc2) + eps
		pj += float32(c1*d) / den
		dst[j] = pj + float32(c2*mj)/den
	}
}

// radam is torch.optim.RAdam's _single_tensor_radam.
func (o *Optimizer) radam(i int, dst, p, g []float32, lr float64, step int64) {
	c := &o.cfg
	m, _ := o.buf(slotExpAvg, i, len(p))
	v, _ := o.buf(slotExpAvgSq, i, len(p))
	dst, g, m, v = dst[:len(p)], g[:len(p)], m[:len(p)], v[:len(p)]
	t := float64(step)
	bc1 := 1 - math.Pow(c.Beta1, t)
	bc2 := 1 - math.Pow(c.Beta2, t)
	rhoInf := 2/(1-c.Beta2) - 1
	rhoT := rhoInf - 2*t*math.Pow(c.Beta2, t)/bc2
	rectified := rhoT > 5.0
	rect := float32(math.Sqrt((rhoT - 4) * (rhoT - 2) * rhoInf / ((rhoInf - 4) * (rhoInf - 2) * rhoT)))
	wd, eps, b2, b2c, b1w := float32(c.WeightDecay), float32(c.Eps), float32(c.Beta2), float32(1-c.Beta2), float32(1-c.Beta1)
	decay := float32(1 - lr*c.WeightDecay)
	bc1f, bc2Sqrt, lr32 := float32(bc1), float32(math.Sqrt(bc2)), float32(lr)
	for j := range p {
		pj, d := p[j], g[j]
		if wd != 0 {
			if c.DecoupledWeightDecay {
				pj *= decay
			} else {
				d += float32(wd * pj)
			}
		}
		mj := lerp(m[j], d, b1w)
		vj := float32(v[j]*b2) + float32(float32(b2c*d)*d)
		m[j], v[j] = mj, vj
		u := float32(mj/bc1f) * lr32
		if rectified {
			u = float32(float32(u*(bc2Sqrt/(sqrt32(vj)+eps))) * rect)
		}
		dst[j] = pj - u
	}
}
