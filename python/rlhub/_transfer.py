"""Chunked safetensors transfer over gRPC streams (see proto/rlhub/v1/tensor.proto).

A blob is sent as a header message followed by Chunk messages of at most
``chunk_bytes`` each; received chunks are copied once into one buffer of the
announced size.
"""

from __future__ import annotations

from typing import Iterable, Iterator

DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 4 << 30


def iter_chunks(blob: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Yields consecutive pieces of ``blob`` of at most ``chunk_bytes``."""
    mv = memoryview(blob)
    for off in range(0, len(mv), chunk_bytes):
        yield mv[off:off + chunk_bytes].tobytes()


class Assembler:
    """Collects the chunks of one blob of an announced size."""

    def __init__(self, total_bytes: int, max_bytes: int = DEFAULT_MAX_BYTES):
        if total_bytes > max_bytes:
            raise ValueError(f"announced blob of {total_bytes} bytes exceeds the limit of {max_bytes}")
        self._buf = bytearray(total_bytes)
        self._n = 0

    def write(self, data: bytes) -> None:
        end = self._n + len(data)
        if end > len(self._buf):
            raise ValueError(f"chunks overrun the announced {len(self._buf)} bytes")
        self._buf[self._n:end] = data
        self._n = end

    def finish(self) -> bytearray:
        """Returns the whole blob; the caller owns it."""
        if self._n != len(self._buf):
            raise ValueError(f"stream ended after {self._n} of {len(self._buf)} announced bytes")
        return self._buf


def assemble(total_bytes: int, chunks: Iterable[bytes]) -> bytearray:
    a = Assembler(total_bytes)
    for c in chunks:
        a.write(c)
    return a.finish()
