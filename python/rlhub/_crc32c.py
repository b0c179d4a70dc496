"""CRC-32C (Castagnoli, the iSCSI polynomial) of byte buffers.

``google-crc32c`` is a required dependency of rlhub (hardware CRC, 2–10
GB/s here). Without it (its C extension missing) the checks stay correct
but slow: a numpy implementation that runs many 4 KiB lanes side by side
(slicing-by-4 per lane, vectorized across lanes) and joins the lanes'
registers with a "feed B zero bytes" operator, measured at 25–82 MB/s on a
loaded 2-core machine; the first use warns once (``RuntimeWarning``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

import numpy as np

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


@functools.lru_cache(maxsize=None)
def _tables() -> np.ndarray:
    """T[k][i]: the register after byte i followed by k zero bytes (k < 4)."""
    t0 = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t0[i] = c
    t = [t0]
    for _ in range(3):
        prev = t[-1]
        t.append((prev >> np.uint32(8)) ^ t0[prev & np.uint32(0xFF)])
    return np.stack(t)


@functools.lru_cache(maxsize=None)
def _shift_tables(n: int) -> List[List[int]]:
    """Tables of the linear map "feed n zero bytes" on a register, one per
    register byte: shift(r) = S0[r&255] ^ S1[r>>8&255] ^ S2[r>>16&255] ^ S3[r>>24]."""
    t0 = _tables()[0]
    r = (np.arange(256, dtype=np.uint32)[None, :] << (np.arange(4, dtype=np.uint32)[:, None] * np.uint32(8))).ravel()
    for _ in range(n):
        r = t0[r & np.uint32(0xFF)] ^ (r >> np.uint32(8))
    return [r[k * 256:(k + 1) * 256].tolist() for k in range(4)]


def _serial(reg: int, data: memoryview) -> int:
    t0 = _tables()[0].tolist()
    for b in data.tobytes():
        reg = t0[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def crc32c_numpy(data: Any, crc: int = 0) -> int:
    """CRC-32C of ``data`` (any buffer) with numpy only; ``crc``, the CRC of
    bytes before it, extends that one."""
    mv = memoryview(data).cast("B")
    n = len(mv)
    lane = 4096 if n >= (1 << 20) else 256
    k = n // lane
    reg = crc ^ 0xFFFFFFFF
    if k >= 2:
        t = _tables()
        t0, t1, t2, t3 = t[0], t[1], t[2], t[3]
        words = np.frombuffer(mv, dtype="<u4", count=k * lane // 4).reshape(k, lane // 4)
        cols = np.ascontiguousarray(words.T)  # column j: word j of every lane
        r = np.zeros(k, np.uint32)
        r[0] = reg
        m8 = np.uint32(0xFF)
        s8, s16, s24 = np.uint32(8), np.uint32(16), np.uint32(24)
        for j in range(lane // 4):
            r ^= cols[j]
            r = t3[r & m8] ^ t2[(r >> s8) & m8] ^ t1[(r >> s16) & m8] ^ t0[r >> s24]
        s0, s1, s2, s3 = _shift_tables(lane)
        lanes = r.tolist()
        reg = lanes[0]
        for x in lanes[1:]:
            reg = s0[reg & 0xFF] ^ s1[(reg >> 8) & 0xFF] ^ s2[(reg >> 16) & 0xFF] ^ s3[reg >> 24] ^ x
        done = k * lane
    else:
        done = 0
    reg = _serial(reg, mv[done:])
    return reg ^ 0xFFFFFFFF


_CHUNK = 256 << 10
"""Bytes copied before their CRC is computed (copy_crc32c): small enough
that the CRC reads them from cache."""


def _u8(data: Any) -> np.ndarray:
    """``data`` as a flat uint8 array (a view, no copy)."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), np.uint8)


def _whole(extend: Callable[[int, Any], int], data: Any, crc: int = 0) -> int:
    """One call into a library that takes ``bytes`` or a numpy array
    (google-crc32c refuses memoryviews and bytearrays): the bytes are
    passed as a uint8 view, never copied."""
    if isinstance(data, bytes):
        return extend(crc, data)
    return extend(crc, _u8(data))


def _accelerated() -> Optional[Callable[[int, Any], int]]:
    try:
        import google_crc32c
    except ImportError:
        return None
    # Its pure-Python fallback is far slower than the numpy one here.
    if getattr(google_crc32c, "implementation", "c") != "c":
        return None
    return google_crc32c.extend  # type: ignore[no-any-return]


_EXTEND = _accelerated()
_FAST = None if _EXTEND is None else functools.partial(_whole, _EXTEND)
#: Name of the implementation ``crc32c`` uses.
IMPLEMENTATION = "numpy" if _FAST is None else "native"
_warned = False


def copy_crc32c(dst: Any, src: Any, crc: int = 0) -> int:
    """Copies ``src`` into ``dst`` (same length, writable) and returns the
    CRC-32C of the bytes (extending ``crc``, the CRC of bytes before
    them): one pass over memory, each 256 KiB piece checksummed right
    after it is copied, while it is in cache (Go's shm.copyCRC). Without
    the native library: the copy, then :func:`crc32c`."""
    d, s = _u8(dst), _u8(src)
    if len(d) != len(s):
        raise ValueError(f"copy_crc32c: {len(s)} bytes into {len(d)}")
    if _FAST is None or _EXTEND is None:
        d[:] = s
        return crc32c(d, crc)
    for off in range(0, len(s), _CHUNK):
        piece = d[off:off + _CHUNK]
        piece[:] = s[off:off + _CHUNK]
        crc = _EXTEND(crc, piece)
    return crc


def crc32c(data: Any, crc: int = 0) -> int:
    """CRC-32C of ``data`` (bytes, bytearray, memoryview, numpy buffer);
    ``crc``, the CRC of bytes before it, extends that one."""
    if _FAST is not None:
        return _FAST(data, crc)
    global _warned
    if not _warned:
        _warned = True
        import warnings

        warnings.warn("rlhub: google-crc32c (with its C extension) is not installed; CRC-32C checks run in "
                      "numpy at well under 100 MB/s. pip install google-crc32c", RuntimeWarning, stacklevel=2)
    return crc32c_numpy(data, crc)
