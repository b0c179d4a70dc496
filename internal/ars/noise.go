package ars

import "math"

// Noise generation: direction i of a run is produced from (seed, i) alone by
// a counter-based generator, so no process ever holds a noise table and only
// indices cross the network. The algorithm is specified exactly in
// docs/ars-noise.md and implemented identically in Python
// (python/rlhub/ars_noise.py); testdata/ars_noise.json holds the shared
// vectors both test suites check.
//
// Every float64 operation below is a single IEEE-754 operation (+, −, ×, ÷,
// sqrt) in a fixed order; explicit float64(...) conversions stop the Go
// compiler from fusing a multiply and an add (the spec allows fusion, and
// arm64 does it), so the bits are the same on every platform and in numpy.

// Philox4x32-10 constants (Salmon, Moraes, Dror, Shaw: "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011; Random123).
const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// Philox4x32 returns the Philox4x32-10 block for counter ctr under key.
func Philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	c, k := ctr, key
	for r := 0; r < 10; r++ {
		if r > 0 {
			k[0] += philoxW0
			k[1] += philoxW1
		}
		p0 := uint64(philoxM0) * uint64(c[0])
		p1 := uint64(philoxM1) * uint64(c[2])
		hi0, lo0 := uint32(p0>>32), uint32(p0)
		hi1, lo1 := uint32(p1>>32), uint32(p1)
		c = [4]uint32{hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0}
	}
	return c
}

// Stream tags: the second counter word separates the uses of one seed.
const (
	// TagDirection: perturbation directions δ_i.
	TagDirection uint32 = 0
	// TagEpisode: environment seeds of training and evaluation episodes.
	TagEpisode uint32 = 1
	// TagInit: initial parameters of a randomly initialised policy (MLP).
	TagInit uint32 = 2
)

func seedKey(seed uint64) [2]uint32 { return [2]uint32{uint32(seed), uint32(seed >> 32)} }

// block returns the Philox output for (seed, tag, index, block number).
func block(seed uint64, tag uint32, index uint64, blk uint32) [4]uint32 {
	return Philox4x32([4]uint32{blk, tag, uint32(index), uint32(index >> 32)}, seedKey(seed))
}

const (
	ln2     = 0.6931471805599453 // nearest float64 to ln 2
	halfPi  = 1.5707963267948966 // nearest float64 to π/2
	sqrtHlf = 0.7071067811865476 // nearest float64 to √½
	two32   = 4294967296.0
	// logTerms and trigTerms fix the series lengths (part of the spec).
	logTerms  = 12
	trigTerms = 12
)

// logUnit returns ln(u) for u in (0, 1) using only exactly rounded
// operations: u = m·2^e with m in [√½, √2), ln m = 2·atanh(s),
// s = (m−1)/(m+1), atanh by its odd series with logTerms terms.
func logUnit(u float64) float64 {
	m, e := math.Frexp(u) // exact: m in [0.5, 1)
	if m < sqrtHlf {
		m *= 2 // exact
		e--
	}
	s := (m - 1) / (m + 1)
	s2 := float64(s * s)
	p := 1 / float64(2*logTerms-1)
	for k := logTerms - 2; k >= 0; k-- {
		p = float64(p*s2) + 1/float64(2*k+1)
	}
	return float64(float64(e)*ln2) + float64(float64(2*s)*p)
}

// sinCosQuarter returns sin φ and cos φ for φ in [0, π/2) by Taylor series
// with trigTerms terms each, evaluated by Horner's rule in φ².
func sinCosQuarter(phi float64) (sin, cos float64) {
	x2 := float64(phi * phi)
	// sin φ = φ·(1 − x²/(2·3)·(1 − x²/(4·5)·(1 − …)))
	s, c := 1.0, 1.0
	for k := trigTerms - 1; k >= 1; k-- {
		s = 1 - float64(float64(x2/float64((2*k)*(2*k+1)))*s)
		c = 1 - float64(float64(x2/float64((2*k-1)*(2*k)))*c)
	}
	return float64(phi * s), c
}

// boxMuller maps two uint32 words to two standard normals:
// u1 = (a + ½)/2³², u2 = b/2³², r = √(−2 ln u1), θ = 2π·u2 computed as
// quadrant q = ⌊4·u2⌋ plus φ = (4·u2 − q)·π/2.
func boxMuller(a, b uint32) (z0, z1 float64) {
	u1 := (float64(a) + 0.5) / two32 // exact
	r := math.Sqrt(-2 * logUnit(u1))
	t := float64(b) / two32 * 4 // exact
	q := math.Floor(t)
	phi := float64((t - q) * halfPi)
	s, c := sinCosQuarter(phi)
	var cs, sn float64
	switch int(q) {
	case 0:
		cs, sn = c, s
	case 1:
		cs, sn = -s, c
	case 2:
		cs, sn = -c, -s
	default:
		cs, sn = s, -c
	}
	return float64(r * cs), float64(r * sn)
}

// Normals fills dst with the standard normals of stream (seed, tag, index):
// element k comes from Philox block ⌊k/4⌋, position k mod 4, where each
// block (x0, x1, x2, x3) gives boxMuller(x0, x1) then boxMuller(x2, x3).
func Normals(dst []float64, seed uint64, tag uint32, index uint64) {
	for k := 0; k < len(dst); k += 4 {
		x := block(seed, tag, index, uint32(k/4))
		z0, z1 := boxMuller(x[0], x[1])
		z2, z3 := boxMuller(x[2], x[3])
		z := [4]float64{z0, z1, z2, z3}
		copy(dst[k:], z[:])
	}
}

// Direction fills dst with perturbation direction number index of a run
// with this seed: Normals(dst, seed, TagDirection, index). A run uses
// index = iteration·N + direction.
func Direction(dst []float64, seed uint64, index uint64) {
	Normals(dst, seed, TagDirection, index)
}

// EpisodeSeed returns the two words seeding the environment RNG
// (rand.NewPCG) of an episode: the first two words of Philox block 0 of
// stream (seed, TagEpisode, index) and the last two.
func EpisodeSeed(seed uint64, index uint64) (uint64, uint64) {
	x := block(seed, TagEpisode, index, 0)
	return uint64(x[0]) | uint64(x[1])<<32, uint64(x[2]) | uint64(x[3])<<32
}
