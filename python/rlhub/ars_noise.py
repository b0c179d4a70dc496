"""ARS noise: direction i of a run generated from (seed, i), no table.

A numpy implementation of the generator in docs/ars-noise.md, bit-identical
to the Go one (internal/ars/noise.go): Philox4x32-10 blocks mapped to
standard normals by Box-Muller, with ln, sin and cos evaluated by fixed
series using only exactly rounded float64 operations (+, -, *, /, sqrt), so
the bits do not depend on the platform's libm. testdata/ars_noise.json holds
the vectors both languages check.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "TAG_DIRECTION",
    "TAG_EPISODE",
    "TAG_INIT",
    "philox4x32",
    "normals",
    "direction",
    "episode_seed",
]

TAG_DIRECTION = 0
TAG_EPISODE = 1
TAG_INIT = 2

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)

_LN2 = 0.6931471805599453
_HALF_PI = 1.5707963267948966
_SQRT_HALF = 0.7071067811865476
_TWO32 = 4294967296.0
_LOG_TERMS = 12
_TRIG_TERMS = 12


def philox4x32(ctr: "npt.ArrayLike", key: Sequence[int]) -> np.ndarray:
    """Philox4x32-10 on arrays of counters.

    ctr: uint32-valued array of shape (..., 4); key: two uint32 words.
    Returns a uint64 array of shape (..., 4) holding the 32-bit outputs.
    """
    c = np.asarray(ctr, dtype=np.uint64) & _MASK32
    c0, c1, c2, c3 = (c[..., i].copy() for i in range(4))
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(10):
        if r > 0:
            k0 = (k0 + _W0) & 0xFFFFFFFF
            k1 = (k1 + _W1) & 0xFFFFFFFF
        p0 = _M0 * c0
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    out: np.ndarray = np.stack([c0, c1, c2, c3], axis=-1)
    return out


def _log_unit(u: np.ndarray) -> np.ndarray:
    m, e = np.frexp(u)
    small = m < _SQRT_HALF
    m = np.where(small, m * 2.0, m)
    e = np.where(small, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = np.full_like(s, 1.0 / float(2 * _LOG_TERMS - 1))
    for k in range(_LOG_TERMS - 2, -1, -1):
        p = p * s2 + 1.0 / float(2 * k + 1)
    out: np.ndarray = e * _LN2 + (2.0 * s) * p
    return out


def _sin_cos_quarter(phi: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    x2 = phi * phi
    s = np.ones_like(phi)
    c = np.ones_like(phi)
    for k in range(_TRIG_TERMS - 1, 0, -1):
        s = 1.0 - (x2 / float((2 * k) * (2 * k + 1))) * s
        c = 1.0 - (x2 / float((2 * k - 1) * (2 * k))) * c
    return phi * s, c


def _box_muller(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    u1 = (a.astype(np.float64) + 0.5) / _TWO32
    r = np.sqrt(-2.0 * _log_unit(u1))
    t = b.astype(np.float64) / _TWO32 * 4.0
    q = np.floor(t)
    phi = (t - q) * _HALF_PI
    s, c = _sin_cos_quarter(phi)
    qi = q.astype(np.int64)
    cs = np.select([qi == 0, qi == 1, qi == 2], [c, -s, -c], s)
    sn = np.select([qi == 0, qi == 1, qi == 2], [s, c, -s], -c)
    return r * cs, r * sn


def _key(seed: int) -> Tuple[int, int]:
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & 0xFFFFFFFF, seed >> 32


def normals(n: int, seed: int, tag: int, index: int) -> np.ndarray:
    """The first n standard normals of stream (seed, tag, index), float64."""
    index = int(index) & 0xFFFFFFFFFFFFFFFF
    blocks = (n + 3) // 4
    ctr = np.zeros((blocks, 4), dtype=np.uint64)
    ctr[:, 0] = np.arange(blocks, dtype=np.uint64)
    ctr[:, 1] = tag
    ctr[:, 2] = index & 0xFFFFFFFF
    ctr[:, 3] = index >> 32
    x = philox4x32(ctr, _key(seed))
    z0, z1 = _box_muller(x[:, 0], x[:, 1])
    z2, z3 = _box_muller(x[:, 2], x[:, 3])
    return np.stack([z0, z1, z2, z3], axis=-1).reshape(-1)[:n]


def direction(n: int, seed: int, index: int) -> np.ndarray:
    """Perturbation direction `index` (= iteration * N + d) of length n."""
    return normals(n, seed, TAG_DIRECTION, index)


def episode_seed(seed: int, index: int) -> tuple[int, int]:
    """The two uint64 words seeding an episode's environment RNG."""
    index = int(index) & 0xFFFFFFFFFFFFFFFF
    x = philox4x32([[0, TAG_EPISODE, index & 0xFFFFFFFF, index >> 32]], _key(seed))[0]
    return int(x[0]) | int(x[1]) << 32, int(x[2]) | int(x[3]) << 32
