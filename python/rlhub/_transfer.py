"""Chunked safetensors transfer over gRPC streams (see proto/rlhub/v1/tensor.proto).

A blob is sent as a header message followed by Chunk messages of at most
``chunk_bytes`` each; received chunks are copied once into one buffer of the
announced size.

Every streamed message that carries chunks (StorePushRequest,
StorePullResponse, SyncServerMessage) has the chunk as field 2 and its bytes
as field 1 of Chunk. :func:`chunk_messages` and :func:`fast_decoder` encode
and decode exactly those messages by hand, as the Go side's blob codecs do:
sending costs one copy per chunk (into the message bytes gRPC sends) instead
of three through protobuf objects, and a received chunk is a memoryview into
gRPC's message bytes, copied once into the assembler. Anything else goes
through the generated protobuf classes; the bytes on the wire are the same.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np

DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 4 << 30


def iter_chunks(blob: Union[bytes, bytearray, memoryview], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Yields consecutive pieces of ``blob`` of at most ``chunk_bytes``."""
    mv = memoryview(blob)
    for off in range(0, len(mv), chunk_bytes):
        yield mv[off:off + chunk_bytes].tobytes()


def iter_part_chunks(head: bytes, bufs: Sequence[memoryview], chunk_bytes: int) -> Iterator[bytes]:
    """Yields the concatenation of ``head`` and ``bufs`` as bytes of exactly
    ``chunk_bytes`` (the last one shorter): the same pieces as
    ``iter_chunks`` of the joined blob, each copied once."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes {chunk_bytes} must be positive")
    pending: List[memoryview] = []
    room = chunk_bytes
    for b in (memoryview(head), *bufs):
        while b.nbytes:
            take = b[:room]
            pending.append(take)
            room -= take.nbytes
            b = b[take.nbytes:]
            if room == 0:
                yield b"".join(pending)
                pending, room = [], chunk_bytes
    if pending:
        yield b"".join(pending)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Tags: field 2 length-delimited (the message's chunk), field 1
# length-delimited (Chunk.data).
_TAG_CHUNK, _TAG_DATA = 0x12, 0x0A


def chunk_message(data: Any) -> bytes:
    """The encoding of ``{chunk: {data: data}}`` (one copy of ``data``)."""
    n = len(data)
    if n == 0:
        return bytes((_TAG_CHUNK, 0))  # proto3 leaves out empty bytes
    inner = _varint(n)
    prefix = bytes((_TAG_CHUNK,)) + _varint(1 + len(inner) + n) + bytes((_TAG_DATA,)) + inner
    return b"".join((prefix, data))


def chunk_messages(blob: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Encoded chunk messages covering ``blob`` in order."""
    mv = memoryview(blob).cast("B")
    for off in range(0, len(mv), chunk_bytes):
        yield chunk_message(mv[off:off + chunk_bytes])


class RawChunk:
    """A received chunk: ``data`` is a memoryview into the message bytes."""

    __slots__ = ("data",)

    def __init__(self, data: memoryview):
        self.data = data


def _read_varint(b: bytes, pos: int) -> "tuple[int, int]":
    n = shift = 0
    while pos < len(b) and shift < 64:
        c = b[pos]
        pos += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, pos
        shift += 7
    return -1, pos


def parse_chunk(b: bytes) -> Optional[RawChunk]:
    """The chunk of an encoded message that is exactly ``{chunk: {data}}``,
    or None when ``b`` is anything else (decode it with protobuf)."""
    if len(b) < 2 or b[0] != _TAG_CHUNK:
        return None
    inner, pos = _read_varint(b, 1)
    if inner != len(b) - pos:
        return None
    if inner == 0:
        return RawChunk(memoryview(b""))
    if b[pos] != _TAG_DATA:
        return None
    n, p2 = _read_varint(b, pos + 1)
    if n != len(b) - p2:
        return None
    return RawChunk(memoryview(b)[p2:])


def fast_decoder(message_cls: Any) -> Callable[[bytes], Any]:
    """A gRPC response deserializer: :class:`RawChunk` for chunk messages,
    ``message_cls`` objects for the rest."""

    def decode(b: bytes) -> Any:
        c = parse_chunk(b)
        return c if c is not None else message_cls.FromString(b)

    return decode


class Assembler:
    """Collects the chunks of one blob of an announced size."""

    def __init__(self, total_bytes: int, max_bytes: int = DEFAULT_MAX_BYTES):
        if total_bytes > max_bytes:
            raise ValueError(f"announced blob of {total_bytes} bytes exceeds the limit of {max_bytes}")
        # np.empty, not bytearray(n): a bytearray is zero-filled first, one
        # more pass over fresh pages that costs as much as receiving them.
        self._buf = np.empty(total_bytes, np.uint8).data
        self._n = 0

    def write(self, data: Any) -> None:
        end = self._n + len(data)
        if end > len(self._buf):
            raise ValueError(f"chunks overrun the announced {len(self._buf)} bytes")
        self._buf[self._n:end] = data
        self._n = end

    def finish(self) -> memoryview:
        """Returns the whole blob, a writable bytes-like memoryview the caller
        owns (``bytes(blob)`` copies it, ``numpy.frombuffer`` and
        ``torch.frombuffer`` view it)."""
        if self._n != len(self._buf):
            raise ValueError(f"stream ended after {self._n} of {len(self._buf)} announced bytes")
        return self._buf


def assemble(total_bytes: int, chunks: Iterable[bytes]) -> memoryview:
    a = Assembler(total_bytes)
    for c in chunks:
        a.write(c)
    return a.finish()
