"""Push fan-out on the data plane: :class:`DataPlaneSource`.

A collector attached to the hub long-polls the hub's data-plane watch
(``rlhub.v1.WeightSync/Watch``, docs/wire.md): each answer is the newest
version, written by the hub with ``writev`` straight from the store's
memory and received here with ``recv_into`` into a buffer the source
reuses. The hub learns the version the collector runs from every poll.
Against a hub without the method it attaches to the gRPC push stream
(:class:`rlhub.wsync.PushSource`) instead.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Dict, List, Optional, Union

import grpc
import numpy as np

from rlhub import _bulk, errors
from rlhub._proto.rlhub.v1 import store_pb2, sync_pb2
from rlhub.tensors import parse_header
from rlhub.wsync._push import PushSource
from rlhub.wsync._source import WeightVersion

WATCH_METHOD = "rlhub.v1.WeightSync/Watch"
"""The hub's data-plane watch (header ``SyncHello``)."""

WAIT_MS = 5000
"""The longest wait the hub grants one poll (its ``DataPlaneWait``)."""

_SLACK = 10.0  # seconds added to a poll's wait for its socket deadline
_BUFFERS = 3  # the last two versions taken stay whole while a third is received


class DataPlaneSource:
    """A collector following a hub over the data plane (the Go
    ``wsync.DataPlaneClient``).

    ``wait_newer`` long-polls; each version is received with ``recv_into``
    into one of three buffers the source reuses, and returned only once the
    hub's final status was OK and its header parsed: a connection that
    breaks mid-version raises :class:`rlhub.Unavailable` and returns
    nothing. A version's ``blob`` stays valid until two newer versions have
    been taken from the source (a :class:`rlhub.wsync.Receiver` copies each
    into its module, so that is enough); copy it to keep it longer.

    The hub records the version in every poll as the collector's report
    (via ``push-dp``), so :meth:`running` only matters on the fallback
    stream. ``stats``: ``polls``, ``versions``, ``skipped`` (version numbers
    the hub reported skipped because newer ones landed meanwhile) and
    ``fallback`` (1 once on the push stream). Use from one thread.
    """

    via = "push-dp"

    def __init__(self, addr: str, model: str, *, collector_id: Optional[str] = None, start: int = 0,
                 max_bytes: int = 4 << 30, fallback: bool = True,
                 bulk_client: Optional[_bulk.Client] = None):
        if not model or not addr:
            raise ValueError("DataPlaneSource needs an address and a model")
        self.addr = addr
        self.model = model
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._start = start
        self._max_bytes = max_bytes
        self._allow_fallback = fallback
        self._own_bulk = bulk_client is None
        self._bulk = bulk_client or _bulk.Client()
        self._bufs: List[Optional[np.ndarray]] = [None] * _BUFFERS
        self._taken = [-1, -1]  # indices of the last two versions taken, newest last
        self._fallback: Optional[PushSource] = None  # once the hub lacked the method
        self._closed = False
        self.stats: Dict[str, int] = {"polls": 0, "versions": 0, "skipped": 0, "fallback": 0}

    @property
    def transport(self) -> str:
        """``"dataplane"``, or ``"grpc"`` once on the push stream."""
        return "grpc" if self._fallback is not None else "dataplane"

    def _free(self) -> int:
        return next(i for i in range(_BUFFERS) if i not in self._taken)

    def _poll(self, after: int, wait_ms: int) -> Union[WeightVersion, None, str]:
        """One poll: a WeightVersion newer than ``after``, None ("not
        modified"), or the string "fallback" when the hub lacks the method."""
        if self._closed:
            raise errors.Unavailable("data-plane source is closed")
        hello = sync_pb2.SyncHello(collector_id=self.collector_id, model=self.model, version=after,
                                   wait_ms=wait_ms).SerializeToString()
        h = store_pb2.StorePullHeader()
        idx = self._free()

        def alloc(hb: bytes, n: int) -> Any:
            h.ParseFromString(hb)
            if h.not_modified:
                if n:
                    raise errors.InvalidArgument(f"a not-modified answer with {n} body bytes")
                return bytearray(0)
            b = h.blob
            if b.model != self.model:
                raise errors.InvalidArgument(f"hub sent model {b.model[:100]!r} for {self.model!r}")
            if n != b.total_bytes:
                raise errors.InvalidArgument(f"hub sent {n} bytes for a {b.total_bytes}-byte version")
            if n > self._max_bytes:
                raise errors.QueueFull(f"version of {n} bytes exceeds max_bytes {self._max_bytes}")
            if b.version <= after:
                raise errors.InvalidArgument(f"hub sent version {b.version} after {after}")
            buf = self._bufs[idx]
            if buf is None or buf.nbytes < n:
                self._bufs[idx] = None  # the model grew: let the old one go first
                # np.empty: no zero-filling pass before recv_into overwrites it.
                buf = self._bufs[idx] = np.empty(n, np.uint8)
            return buf

        self.stats["polls"] += 1
        try:
            hb, buf = self._bulk.fetch(self.addr, WATCH_METHOD, hello, alloc, wait_ms / 1000 + _SLACK)
        except _bulk.NotSupported:
            return "fallback"
        except errors.RlhubError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                return "fallback"
            raise
        if hb is None:
            raise errors.RlhubError(f"bulk: {WATCH_METHOD} answered without a data frame")
        if h.not_modified:
            return None
        n = h.blob.total_bytes
        blob = memoryview(buf).cast("B")[:n]
        try:
            parse_header(blob)
        except ValueError as e:
            raise errors.InvalidArgument(f"version {h.blob.version} from {self.addr}: {e}") from None
        self._taken = [self._taken[1], idx]
        self.stats["versions"] += 1
        self.stats["skipped"] += h.skipped
        return WeightVersion(h.blob.model, h.blob.version, h.blob.epoch, blob, self.via)

    def _use_fallback(self, after: int) -> PushSource:
        if not self._allow_fallback:
            raise errors.Unavailable(f"{self.addr} serves no data-plane watch (fallback off)")
        self._fallback = PushSource(self.addr, self.model, collector_id=self.collector_id, start=after,
                                    max_bytes=self._max_bytes)
        self.stats["fallback"] = 1
        return self._fallback

    def get_if_newer(self, than: int) -> Any:
        """The newest version if newer than ``than`` (a 1 ms poll), else None."""
        if self._fallback is not None:
            return self._fallback.get_if_newer(than)
        got = self._poll(than, 1)
        if isinstance(got, str):
            return self._use_fallback(than).get_if_newer(than)
        return got

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Any:
        """Long-polls until a version newer than ``after`` arrives (None
        when ``timeout`` seconds pass first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._fallback is not None:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                return self._fallback.wait_newer(after, left)
            wait_ms = WAIT_MS
            if deadline is not None:
                wait_ms = int(min(max(deadline - time.monotonic(), 0.001), WAIT_MS / 1000) * 1000) or 1
            got = self._poll(after, wait_ms)
            if isinstance(got, str):
                self._use_fallback(after)
                continue
            if got is not None:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def running(self, version: int) -> None:
        """On the data plane the next poll reports ``version``; on the
        fallback stream it is sent."""
        if self._fallback is not None:
            self._fallback.running(version)

    def close(self) -> None:
        """Closes the connections (and the fallback stream). Safe to call twice."""
        self._closed = True
        if self._fallback is not None:
            self._fallback.close()
        if self._own_bulk:
            self._bulk.close()

    def __enter__(self) -> "DataPlaneSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
