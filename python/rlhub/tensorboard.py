"""TensorBoard scalars for learners, without TensorFlow or torch.

``EventWriter`` writes the same event files as the hub's ``train ars
--tensorboard`` (Go package ``internal/tblog``): length-prefixed records
with a masked CRC-32C over a hand-encoded ``Event`` proto, in a file named
``events.out.tfevents.*`` that ``tensorboard --logdir DIR`` reads.

``HubScalars`` logs what the hub sees of a training run — gradients
pushed, applied, dropped and lost, optimizer steps, and each collector's
weight-sync lag — so a learner can put them beside its own losses::

    with rlhub.tensorboard.EventWriter("runs/ppo") as tb:
        hub_scalars = rlhub.tensorboard.HubScalars(hub_addr, tb, model="policy")
        for step in range(n):
            loss = train_step()
            tb.add_scalar("train/loss", loss, step)
            hub_scalars.log(step)

Contract: values are stored as float32 (TensorBoard's ``simple_value``);
tags are 1 to 256 bytes; events are flushed at least every ``flush_secs``
seconds (by a thread of the writer, also when no more events come, as
torch's ``SummaryWriter`` does) and on ``flush``/``close``. Not thread-safe:
one writer per thread.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
import weakref
from itertools import count
from typing import Any, Dict, Mapping, Optional

from rlhub._crc32c import crc32c

__all__ = ["EventWriter", "HubScalars", "FILE_VERSION"]

FILE_VERSION = "brain.Event:2"
_seq = count(1)


def _masked(b: bytes) -> int:
    c = crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _f32(v: float) -> bytes:
    """v as float32, as Go's float32(v): beyond float32's range, ±Inf."""
    try:
        return struct.pack("<f", v)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, v))


def _field_bytes(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _event(wall_time: float, step: Optional[int] = None, summary: Optional[bytes] = None,
           file_version: Optional[str] = None) -> bytes:
    ev = _varint(1 << 3 | 1) + struct.pack("<d", wall_time)
    if step is not None:
        ev += _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        ev += _field_bytes(3, file_version.encode())
    if summary is not None:
        ev += _field_bytes(5, summary)
    return ev


def _flush_every(f: Any, lock: threading.Lock, stop: threading.Event, secs: float) -> None:
    while not stop.wait(secs):
        with lock:
            if f.closed:
                return
            f.flush()


class EventWriter:
    """Appends scalar events to a new event file in ``logdir``."""

    def __init__(self, logdir: str, *, flush_secs: float = 2.0):
        os.makedirs(logdir, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname() or 'localhost'}.{os.getpid()}.{next(_seq)}.py"
        self.path = os.path.join(logdir, name)
        self._f = open(self.path, "xb")
        self._flush_secs = flush_secs
        self._last_flush = time.monotonic()
        self._record(_event(now, file_version=FILE_VERSION))
        self._f.flush()
        # Events written and then no more: the flusher writes them out
        # within flush_secs. It holds the file, not the writer, and stops
        # on close or when the writer is garbage.
        self._lock = threading.Lock()  # the file's buffer: the caller's writes, the flusher's flushes
        self._stop = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        if flush_secs > 0:
            self._flusher = threading.Thread(target=_flush_every, args=(self._f, self._lock, self._stop, flush_secs),
                                             name="rlhub-tensorboard-flush", daemon=True)
            self._flusher.start()
            weakref.finalize(self, self._stop.set)

    def _record(self, data: bytes) -> None:
        head = struct.pack("<Q", len(data))
        self._f.write(head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data)))

    def add_scalars(self, step: int, values: Mapping[str, float], wall_time: Optional[float] = None) -> None:
        """One event at ``step`` holding every tag's value (tags sorted)."""
        if self._f.closed:
            raise ValueError("EventWriter is closed")
        summary = b""
        for tag in sorted(values):
            t = tag.encode()
            if not 1 <= len(t) <= 256:
                raise ValueError(f"tag of {len(t)} bytes (want 1 to 256)")
            value = _field_bytes(1, t) + _varint(2 << 3 | 5) + _f32(float(values[tag]))
            summary += _field_bytes(1, value)
        with self._lock:
            self._record(_event(time.time() if wall_time is None else wall_time, int(step), summary))
        if time.monotonic() - self._last_flush >= self._flush_secs:
            self.flush()

    def add_scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        """One scalar (``torch.utils.tensorboard``'s argument order)."""
        self.add_scalars(step, {tag: value}, wall_time)

    def flush(self) -> None:
        with self._lock:
            self._f.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Stops the flusher; flushes, syncs and closes the file; safe to
        call twice."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class HubScalars:
    """Logs a hub's reducer counters and weight-sync lag to an EventWriter.

    Tags: ``reducer/gradients_pushed``, ``…_applied``, ``…_dropped`` (every
    reason but lost), ``…_lost``, ``reducer/steps``, ``reducer/queue_depth``;
    per model with collectors: ``sync/<model>/max_lag`` and
    ``sync/<model>/lag/<collector>`` for the ``max_collectors`` most-lagging
    collectors. ``model`` limits the lag tags to one model ("" = all).
    """

    def __init__(self, hub_addr: str, writer: EventWriter, *, model: str = "", max_collectors: int = 16,
                 timeout: float = 10.0):
        from rlhub.grads import GradClient

        self._grads = GradClient(hub_addr, timeout=timeout)
        self._hub = hub_addr
        self._writer = writer
        self._model = model
        self._max = max_collectors
        self._timeout = timeout

    def values(self) -> Dict[str, float]:
        """The scalars ``log`` would write now."""
        from rlhub import wsync

        st = self._grads.stats()
        t = st.total
        out = {
            "reducer/gradients_pushed": t.pushed,
            "reducer/gradients_applied": t.applied,
            "reducer/gradients_dropped": sum(n for r, n in t.dropped.items() if r != "lost"),
            "reducer/gradients_lost": t.dropped.get("lost", 0),
            "reducer/steps": t.steps,
            "reducer/queue_depth": t.queue_depth,
        }
        for m in wsync.status(self._hub, self._model, timeout=self._timeout):
            if not m.collectors:
                continue
            out[f"sync/{m.model}/max_lag"] = max(c.lag for c in m.collectors)
            worst = sorted(m.collectors, key=lambda c: (-c.lag, c.collector_id))[: self._max]
            for c in worst:
                out[f"sync/{m.model}/lag/{c.collector_id}"] = c.lag
        return {k: float(v) for k, v in out.items()}

    def log(self, step: int) -> Dict[str, float]:
        """Writes the current values at ``step`` and returns them."""
        v = self.values()
        self._writer.add_scalars(step, v)
        return v

    def close(self) -> None:
        self._grads.close()

    def __enter__(self) -> "HubScalars":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
