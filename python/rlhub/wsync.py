"""Weight sync for collectors: keep a ``torch.nn.Module`` at the newest version.

    import rlhub.wsync as ws

    src = ws.ShmSource(model="policy")                  # same host, via `rlhub relay`
    # src = ws.PushSource("127.0.0.1:7470", "policy", collector_id="actor-3")
    # src = ws.StoreSource("127.0.0.1:7470", "policy")
    with ws.Receiver(policy_net, src, collector_id="actor-3", hub="127.0.0.1:7470") as r:
        for episode in ...:
            r.poll()            # applies the newest version if newer; no-op otherwise
            ...                 # act with policy_net

Three sources, one interface (``get_if_newer`` / ``wait_newer``), the same as
the Go side's ``wsync.Source`` (docs/weight-sync.md):

* :class:`ShmSource` maps the shared-memory segment a Go ``ShmWriter`` (the
  relay) writes and follows docs/shm-layout.md exactly: it copies the newest
  whole slot to private memory, re-reads the slot's seqlock word and retries
  when the writer came back during the copy, then checks the CRC-32C. It
  never returns a torn version: either the newest whole one or, while that is
  being written, the previous whole one.
* :class:`PushSource` attaches to the hub's (or relay's) push fan-out as a
  collector and reports the version it runs on the same stream.
* :class:`StoreSource` pulls "only if newer" from the model store and
  watches it.

A :class:`Receiver` applies a version only if it is newer than the one the
module runs (so the same version twice is a no-op), checks every name, dtype
and shape first (:class:`rlhub.InvalidArgument`, nothing copied), copies into
the module's parameters and buffers in place under ``torch.no_grad()``, and
reports the version to the hub so lag shows in ``rlhub sync status``.
:mod:`rlhub.torchrl` puts it inside TorchRL collectors (a ``WeightSyncScheme``,
and ``RlhubWeightUpdater`` for the older API, still importable from here).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import mmap
import os
import platform
import queue
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Tuple

import grpc
import numpy as np

from rlhub import errors
from rlhub._crc32c import crc32c
from rlhub._proto.rlhub.v1 import sync_pb2, sync_pb2_grpc
from rlhub._transfer import Assembler, RawChunk, fast_decoder
from rlhub.store import StoreClient, channel as _channel
from rlhub.tensors import load_bytes, parse_header

log = logging.getLogger("rlhub.wsync")

__all__ = [
    "WeightVersion", "Source", "ShmSource", "PushSource", "StoreSource", "FailoverSource", "Dialer",
    "Receiver",
    "default_shm_path", "report", "status",
]


@dataclasses.dataclass
class WeightVersion:
    """One whole version of a model as a source delivered it.

    ``blob`` is its safetensors bytes. A :class:`ShmSource` reuses two private
    buffers, so its versions' blobs stay valid only until the second
    ``get_if_newer``/``wait_newer`` call after the one that returned them
    (copy, or apply with a :class:`Receiver`, to keep them longer); a leasing
    one's blob is a read-only view of the shared memory, whole until the
    source returns a newer version or closes. Other sources' blobs are the
    caller's.
    """

    model: str
    version: int
    epoch: int
    blob: Any
    via: str

    def tensors(self, framework: str = "numpy") -> Dict[str, Any]:
        """The state dict (numpy views over ``blob``, or torch tensors)."""
        return load_bytes(self.blob, framework=framework)


class Source(Protocol):
    """Where a receiver gets versions (the Go ``wsync.Source``)."""

    via: str

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest version if newer than ``than``, else None (never blocks)."""

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Blocks until a version newer than ``after`` exists (None on timeout)."""

    def close(self) -> None:
        """Releases the source. Safe to call twice."""


def default_shm_path(model: str) -> str:
    """The conventional segment of a model on this host (as ``rlhub relay``)."""
    return "/dev/shm/rlhub-" + model.replace("/", "_")


# --------------------------------------------------------------------------
# Shared memory (docs/shm-layout.md, layout version 1)

_MAGIC = b"RLHUBWS1"
_PAGE = 4096
_OFF_LAYOUT, _OFF_SLOTS, _OFF_CAP, _OFF_STRIDE, _OFF_PID = 8, 12, 16, 24, 32
_OFF_STATE, _OFF_NOTIFY, _OFF_PUBLISHED, _OFF_NAMELEN, _OFF_NAME = 40, 44, 48, 56, 64
_SLOT_SEQ, _SLOT_VERSION, _SLOT_EPOCH, _SLOT_LENGTH, _SLOT_CRC = 0, 8, 16, 24, 32
_STATE_CLOSED = 1
_COPY_CHUNK = 256 << 10
# The lease table ("Slot leases" in docs/shm-layout.md).
_OFF_LEASES, _OFF_LEASE_TABLE, _LEASE_ENTRY = 60, 512, 32
_LEASE_OWNER, _LEASE_SLOT, _LEASE_SEQ = 0, 8, 16


def _futex_fn() -> Optional[Callable[[int, int, float], None]]:
    """FUTEX_WAIT on a shared word through libc's syscall(), or None."""
    nr = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
    if sys.platform != "linux" or nr is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    syscall.restype = ctypes.c_long

    def wait(addr: int, val: int, timeout: float) -> None:
        ts = Timespec(int(timeout), int((timeout - int(timeout)) * 1e9))
        # FUTEX_WAIT (0), not FUTEX_PRIVATE: the word is shared between processes.
        syscall(ctypes.c_long(nr), ctypes.c_void_p(addr), ctypes.c_int(0), ctypes.c_uint32(val),
                ctypes.byref(ts), ctypes.c_void_p(0), ctypes.c_int(0))

    return wait


_FUTEX_WAIT = _futex_fn()


def _fence_fn() -> Optional[Callable[[], None]]:
    """A full memory barrier on this thread, or None where there is none.

    A lease is a Dekker handshake with the writer: store the lease, then
    load the slot's seq, with a full fence between (docs/shm-layout.md). An
    x86-64 store may pass a later load, and CPython has no fence of its
    own; ``membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`` issues one on the
    calling thread (the kernel's smp_mb() at entry and exit) for about half
    a microsecond. It needs the process registered once, which this does.
    """
    nr = {"x86_64": 324, "aarch64": 283, "arm64": 283}.get(platform.machine())
    if sys.platform != "linux" or nr is None:
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    register, expedited = 1 << 4, 1 << 3  # MEMBARRIER_CMD_(REGISTER_)PRIVATE_EXPEDITED
    if syscall(ctypes.c_long(nr), ctypes.c_int(register), ctypes.c_uint(0), ctypes.c_int(0)) != 0:
        return None

    def fence() -> None:
        if syscall(ctypes.c_long(nr), ctypes.c_int(expedited), ctypes.c_uint(0), ctypes.c_int(0)) != 0:
            raise OSError(ctypes.get_errno(), "membarrier failed")

    return fence


_FENCE: Optional[Callable[[], None]] = None
_FENCE_TRIED = False


def _fence() -> Optional[Callable[[], None]]:
    global _FENCE, _FENCE_TRIED
    if not _FENCE_TRIED:
        _FENCE, _FENCE_TRIED = _fence_fn(), True
    return _FENCE


_lease_counter = 0
_lease_lock = threading.Lock()


def _lease_token() -> int:
    """pid << 32 | a per-process counter, as the Go reader's owner tokens."""
    global _lease_counter
    with _lease_lock:
        _lease_counter = (_lease_counter + 1) & 0xFFFFFFFF
        return (os.getpid() & 0xFFFFFFFF) << 32 | _lease_counter


def _owner_gone(owner: int) -> bool:
    pid = owner >> 32
    if pid == os.getpid():
        return False
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class ShmSource:
    """Reads whole versions from a shared-memory segment written by Go.

    By default it copies every version out of its slot. With ``lease=True``
    it **leases** the slot instead (docs/shm-layout.md, "Slot leases"): a
    version's ``blob`` is a read-only view of the shared memory, and its
    numpy tensors are read-only views too (no copy); the writer leaves the
    slot alone until this source returns a newer version or closes, so the
    views stay whole until then. Leasing needs a segment with a free lease
    entry (a relay started with ``--shm-slots 2+n``), write access to the
    file, and ``membarrier(2)`` (Linux); without them the source copies,
    as ``leasing`` reports. Closing a leasing source releases its lease:
    views still held afterwards may then change under you.

    Not thread-safe: one reader thread per ``ShmSource``. ``stats`` counts
    ``reads`` (whole versions returned) and ``retries`` (copies restarted
    because the writer overwrote the slot meanwhile: torn reads caught).

    Args:
        path: the segment file; default ``/dev/shm/rlhub-<model>``.
        model: the model name (checked against the segment header when given).
        verify: check each version's CRC-32C (the default here; Go's reader
            checks it on x86-64 only with ``ShmReaderConfig.Verify``). Without
            ``google-crc32c`` installed the check runs in numpy at tens to a few
            hundred MB/s; ``verify=False`` relies on the seqlock alone.
        max_retries: consecutive torn copies before giving up with
            :class:`rlhub.Aborted`.
        tick: longest sleep of ``wait_newer`` between liveness checks.
        lease: read versions in place under a lease (see above).
    """

    via = "shm"

    def __init__(self, path: Optional[str] = None, model: Optional[str] = None, *, verify: bool = True,
                 max_retries: int = 1000, tick: float = 0.05, lease: bool = False):
        if path is None:
            if not model:
                raise ValueError("ShmSource needs a path or a model")
            path = default_shm_path(model)
        if sys.byteorder != "little":
            raise errors.InvalidArgument("the shm layout is little-endian; this host is not")
        self.path = path
        self.verify = verify
        self.max_retries = max_retries
        self.tick = tick
        self.stats = {"reads": 0, "retries": 0, "in_place": 0}
        self._bufs: List[bytearray] = [bytearray(), bytearray()]
        self._which = 0
        self._map = None
        self._lease = lease
        self._entry = -1  # the lease entry this source owns; -1 when it copies
        self._hmap = None  # writable mapping of the header page (leasing only)
        self._open()
        if model is not None and model != self.model:
            name = self.model
            self.close()
            raise errors.InvalidArgument(f"shm segment {path} holds model {name!r}, not {model!r}")

    def _open(self) -> None:
        writable = self._lease and _fence() is not None
        fd = -1
        try:
            if writable:
                try:
                    fd = os.open(self.path, os.O_RDWR)
                except PermissionError:
                    writable = False
            if fd < 0:
                fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise errors.NotFound(f"shm segment {self.path} does not exist") from None
        try:
            st = os.fstat(fd)
            if st.st_size < _PAGE or st.st_size % 8:
                raise errors.InvalidArgument(f"shm segment {self.path} has {st.st_size} bytes")
            m = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            try:
                self._open_checked(m, st, fd if writable else -1)
            except BaseException:
                m.close()
                raise
        finally:
            os.close(fd)

    def _open_checked(self, m: mmap.mmap, st: os.stat_result, rw_fd: int) -> None:
        mv = memoryview(m)
        q = d = None
        try:
            if mv[0:8] != _MAGIC:
                raise errors.InvalidArgument(f"shm segment {self.path}: magic {bytes(mv[0:8])!r}, want {_MAGIC!r}")
            # Native-order, aligned views: every item access is one aligned
            # load, so an 8-byte field is read whole (atomic on x86-64/arm64).
            q, d = mv.cast("Q"), mv.cast("I")
            layout, slots = d[_OFF_LAYOUT // 4], d[_OFF_SLOTS // 4]
            cap, stride, name_len = q[_OFF_CAP // 8], q[_OFF_STRIDE // 8], d[_OFF_NAMELEN // 4]
            if layout != 1:
                raise errors.InvalidArgument(f"shm segment {self.path}: layout version {layout}, this reader knows 1")
            if not 2 <= slots <= 64 or cap == 0 or cap % _PAGE or stride != _PAGE + cap or name_len > 256:
                raise errors.InvalidArgument(
                    f"shm segment {self.path}: bad geometry (slots {slots}, capacity {cap}, stride {stride})")
            if _PAGE + slots * stride != len(mv):
                raise errors.InvalidArgument(
                    f"shm segment {self.path} is {len(mv)} bytes, its header describes {_PAGE + slots * stride}")
            name = bytes(mv[_OFF_NAME:_OFF_NAME + name_len]).decode("utf-8", "replace")
            leases = d[_OFF_LEASES // 4]
            if leases > slots - 2 or _OFF_LEASE_TABLE + leases * _LEASE_ENTRY > _PAGE:
                raise errors.InvalidArgument(
                    f"shm segment {self.path}: lease table of {leases} entries for {slots} slots (at most {slots - 2})")
        except BaseException:
            for v in (q, d, mv):
                if v is not None:
                    v.release()
            raise
        self._map, self._mv, self._q, self._d = m, mv, q, d
        self.model, self.slots, self.capacity, self.stride = name, slots, cap, stride
        self._pid = q[_OFF_PID // 8]
        self._ino = st.st_ino  # of the file mapped, to notice a replaced segment
        self._notify_addr = np.frombuffer(m, dtype=np.uint8, count=1, offset=_OFF_NOTIFY).ctypes.data
        self.leases = leases
        if rw_fd >= 0 and leases > 0:
            try:
                self._claim(rw_fd)
            except OSError as e:  # no lease after all: copy
                log.warning("shm segment %s: cannot lease (%s); copying", self.path, e)

    def _claim(self, fd: int) -> None:
        """Takes a free lease entry, or one whose owner process is gone,
        under the exclusive flock every claimer takes (docs/shm-layout.md).
        Only the header page is mapped writable."""
        import fcntl

        hmap = mmap.mmap(fd, _PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        hq = np.frombuffer(hmap, dtype=np.uint64)  # aligned 8-byte loads and stores
        token = _lease_token()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for e in range(self.leases):
                base = (_OFF_LEASE_TABLE + e * _LEASE_ENTRY) // 8
                owner = int(hq[base + _LEASE_OWNER // 8])
                if owner != 0 and not _owner_gone(owner):
                    continue
                hq[base + _LEASE_OWNER // 8] = token
                hq[base + _LEASE_SLOT // 8] = 0  # a dead owner's slot is released only now
                hq[base + _LEASE_SEQ // 8] = 0
                self._entry, self._hmap, self._hq = e, hmap, hq
                return
        finally:
            # Explicitly: the mapping keeps the open file, and the lock,
            # alive after the descriptor closes.
            fcntl.flock(fd, fcntl.LOCK_UN)
        del hq
        hmap.close()

    @property
    def leasing(self) -> bool:
        """Whether this source holds a lease entry (reads in place)."""
        return self._entry >= 0

    def _lease_word(self, field: int) -> int:
        return (_OFF_LEASE_TABLE + self._entry * _LEASE_ENTRY + field) // 8

    def _release(self) -> None:
        if self._map is None:
            return
        if self._entry >= 0:
            hq = self._hq
            hq[self._lease_word(_LEASE_SLOT)] = 0
            hq[self._lease_word(_LEASE_SEQ)] = 0
            hq[self._lease_word(_LEASE_OWNER)] = 0
            self._entry, self._hq = -1, None
            del hq
            self._hmap.close()
            self._hmap = None
        for v in (self._q, self._d, self._mv):
            v.release()
        try:
            self._map.close()
        except BufferError:
            pass  # leased versions still viewed by the caller: unmapped when the last goes
        self._map = None

    def close(self) -> None:
        """Unmaps the segment. Safe to call twice."""
        self._release()

    def __enter__(self) -> "ShmSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def published(self) -> int:
        """The newest complete version in the segment (0: none)."""
        self._check_open()
        return self._q[_OFF_PUBLISHED // 8]

    def _check_open(self) -> None:
        if self._map is None:
            raise errors.Unavailable(f"shm source {self.path} is closed")

    def writer_alive(self) -> bool:
        """Whether the segment is open and its writer process exists."""
        if self._map is None or self._d[_OFF_STATE // 4] == _STATE_CLOSED:
            return False
        if self._pid <= 0:
            return True
        try:
            os.kill(self._pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _buffer(self, n: int) -> bytearray:
        b = self._bufs[self._which]
        if len(b) < n:
            b = bytearray(n)
            self._bufs[self._which] = b
        return b

    def _read(self, than: int) -> Optional[WeightVersion]:
        """The seqlock read of docs/shm-layout.md ("Reader")."""
        q, d = self._q, self._d
        for attempt in range(self.max_retries + 1):
            # Pick the stable slot with the newest version: seq even and
            # non-zero, version read between two equal reads of seq.
            best, best_seq, best_ver = -1, 0, than
            for i in range(self.slots):
                base = (_PAGE + i * self.stride) // 8
                s = q[base]
                if s == 0 or s & 1:
                    continue
                v = q[base + 1]
                if q[base] != s:
                    continue
                if v > best_ver:
                    best, best_seq, best_ver = i, s, v
            if best < 0:
                return None
            off = _PAGE + best * self.stride
            base = off // 8
            epoch, length, crc = q[base + 2], q[base + 3], d[(off + _SLOT_CRC) // 4]
            if length > self.capacity:
                if q[base] != best_seq:
                    self.stats["retries"] += 1
                    continue
                raise errors.InvalidArgument(
                    f"shm segment {self.path} slot {best} claims {length} bytes, capacity {self.capacity}")
            if self._entry >= 0:
                wv = self._lease_read(best, best_seq, best_ver, epoch, length, crc)
                if wv is None:
                    self.stats["retries"] += 1
                    continue
                return wv
            buf = self._buffer(length)
            out = memoryview(buf)[:length]
            out[:] = self._mv[off + _PAGE:off + _PAGE + length]  # the private copy (one memcpy)
            if q[base] != best_seq:
                self.stats["retries"] += 1  # the writer came back to this slot: torn, retry
                out.release()
                continue
            if self.verify:
                got = crc32c(out)
                if got != crc:
                    out.release()
                    raise errors.InvalidArgument(
                        f"shm segment {self.path} version {best_ver}: CRC-32C {got:08x}, header says {crc:08x}")
            try:
                parse_header(out)
            except ValueError as e:
                out.release()
                raise errors.InvalidArgument(f"shm segment {self.path} version {best_ver}: {e}") from None
            self._which ^= 1
            self.stats["reads"] += 1
            return WeightVersion(self.model, best_ver, epoch, out, self.via)
        raise errors.Aborted(f"{self.max_retries + 1} reads of {self.path} in a row raced the writer")

    def _lease_read(self, best: int, s: int, version: int, epoch: int, length: int,
                    crc: int) -> Optional[WeightVersion]:
        """Validates the version in slot ``best`` in place under the seqlock,
        then leases it (Dekker with the writer: store the lease, fence, load
        seq). None when the writer got there first: the caller picks again.
        A bad version raises and leaves the current lease where it was."""
        q = self._q
        off = _PAGE + best * self.stride
        base = off // 8
        view = self._mv[off + _PAGE:off + _PAGE + length]
        try:
            got = crc32c(view) if self.verify else crc
            parse_header(view)
            bad = None
        except ValueError as e:
            bad = e
        if q[base] != s:
            view.release()
            return None  # the writer was rewriting it: whatever we read is void
        if got != crc:
            view.release()
            raise errors.InvalidArgument(
                f"shm segment {self.path} version {version}: CRC-32C {got:08x}, header says {crc:08x}")
        if bad is not None:
            view.release()
            raise errors.InvalidArgument(f"shm segment {self.path} version {version}: {bad}") from None
        self._hq[self._lease_word(_LEASE_SLOT)] = best + 1  # releases the previous version's slot
        self._hq[self._lease_word(_LEASE_SEQ)] = s
        _FENCE()
        if q[base] != s:
            view.release()
            return None
        self.stats["reads"] += 1
        self.stats["in_place"] += 1
        return WeightVersion(self.model, version, epoch, view, self.via)

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest whole version if newer than ``than``; None if there is
        none. Raises :class:`rlhub.Unavailable` when the writer closed the
        segment or died and nothing newer is left; a segment replaced by a
        new one at the same path (a relay that outgrew it) is reopened."""
        self._check_open()
        wv = self._read(than)
        if wv is not None:
            return wv
        if not self.writer_alive():
            if self._reopen():
                return self._read(than)
            raise errors.Unavailable(f"the writer of {self.path} is gone")
        return None

    def _reopen(self) -> bool:
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            return False
        if ino == self._ino:
            return False
        model = self.model
        self._release()
        self._open()
        if self.model != model:
            raise errors.InvalidArgument(f"shm segment {self.path} now holds model {self.model!r}, not {model!r}")
        return self.writer_alive()

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Blocks (on the segment's futex word where possible) until a version
        newer than ``after`` is published; None when ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_open()
            n = self._d[_OFF_NOTIFY // 4]
            wv = self.get_if_newer(after)
            if wv is not None:
                return wv
            tick = self.tick
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                tick = min(tick, left)
            if _FUTEX_WAIT is not None:
                _FUTEX_WAIT(self._notify_addr, n, tick)
            else:
                time.sleep(min(tick, 0.001))


# --------------------------------------------------------------------------
# Push fan-out (WeightSync.Attach)

class PushSource:
    """A collector attached to the hub's (or a relay's) push stream.

    A background thread assembles each version the server sends and keeps
    the newest (a slow reader skips versions, as the server does).
    :meth:`running` reports the version the collector runs on the same
    stream; a :class:`Receiver` calls it after each apply. The source does
    not reconnect: once the stream has ended and the newest version has been
    taken, the source raises :class:`rlhub.Unavailable`.
    """

    via = "push"

    def __init__(self, addr: Optional[str], model: str, *, collector_id: Optional[str] = None,
                 start: int = 0, chunk_bytes: int = 0, channel_: Optional[grpc.Channel] = None,
                 max_bytes: int = 4 << 30):
        if not model:
            raise ValueError("PushSource needs a model")
        self.model = model
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._own = channel_ is None
        self._channel = channel_ or _channel(addr)
        self._max_bytes = max_bytes
        self._out: "queue.Queue[Optional[sync_pb2.SyncClientMessage]]" = queue.Queue()
        self._out.put(sync_pb2.SyncClientMessage(hello=sync_pb2.SyncHello(
            collector_id=self.collector_id, model=model, version=start, chunk_bytes=chunk_bytes)))
        self._cond = threading.Condition()
        self._newest: Optional[WeightVersion] = None  # guarded by _cond
        self._ended: Optional[errors.RlhubError] = None  # guarded by _cond
        attach = self._channel.stream_stream(  # chunks decoded without protobuf copies
            "/rlhub.v1.WeightSync/Attach", request_serializer=sync_pb2.SyncClientMessage.SerializeToString,
            response_deserializer=fast_decoder(sync_pb2.SyncServerMessage))
        self._call = attach(self._requests())
        self._thread = threading.Thread(target=self._receive, name=f"rlhub-push-{model}", daemon=True)
        self._thread.start()

    def _requests(self) -> Iterator[sync_pb2.SyncClientMessage]:
        while True:
            m = self._out.get()
            if m is None:
                return
            yield m

    def _receive(self) -> None:
        err: errors.RlhubError
        try:
            it = iter(self._call)
            for msg in it:
                if isinstance(msg, RawChunk) or not msg.HasField("info"):
                    raise errors.InvalidArgument("push stream: chunk without a version info")
                info = msg.info
                if info.model != self.model:
                    raise errors.InvalidArgument(f"push stream sent model {info.model!r} on the stream of {self.model!r}")
                asm = Assembler(info.total_bytes, self._max_bytes)
                got = 0
                while got < info.total_bytes:
                    c = next(it, None)
                    if c is not None and not isinstance(c, RawChunk):
                        c = c.chunk if c.HasField("chunk") else None
                    if c is None:
                        raise errors.InvalidArgument(
                            f"push stream: version {info.version} ended after {got} of {info.total_bytes} bytes")
                    asm.write(c.data)
                    got += len(c.data)
                blob = asm.finish()
                try:
                    parse_header(memoryview(blob))
                except ValueError as e:
                    raise errors.InvalidArgument(f"push stream version {info.version}: {e}") from None
                wv = WeightVersion(info.model, info.version, info.epoch, blob, self.via)
                with self._cond:
                    if self._newest is None or wv.version > self._newest.version:
                        self._newest = wv
                    self._cond.notify_all()
            err = errors.Unavailable(f"push stream of {self.model!r} ended")
        except grpc.RpcError as e:
            err = errors.from_rpc_error(e)
            if isinstance(err, errors.RlhubError) and e.code() == grpc.StatusCode.CANCELLED:
                err = errors.Unavailable(f"push stream of {self.model!r} closed")
        except errors.RlhubError as e:
            err = e
            self._call.cancel()
        except ValueError as e:  # the Assembler's limits
            err = errors.InvalidArgument(f"push stream: {e}")
            self._call.cancel()
        with self._cond:
            self._ended = err
            self._cond.notify_all()

    def _take(self, than: int) -> Optional[WeightVersion]:
        # Called with _cond held.
        if self._newest is not None and self._newest.version > than:
            return self._newest
        if self._ended is not None:
            raise type(self._ended)(f"{self._ended.message}", self._ended.code)
        return None

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest received version if newer than ``than``, else None."""
        with self._cond:
            return self._take(than)

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Blocks until a version newer than ``after`` has arrived."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                wv = self._take(after)
                if wv is not None:
                    return wv
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def running(self, version: int) -> None:
        """Reports on the stream that the collector now runs ``version``."""
        self._out.put(sync_pb2.SyncClientMessage(running=sync_pb2.SyncRunning(version=version)))

    def close(self) -> None:
        """Ends the stream and waits for the receive thread. Safe to call twice."""
        self._out.put(None)
        self._call.cancel()
        self._thread.join()
        if self._own:
            self._channel.close()
            self._own = False

    def __enter__(self) -> "PushSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------
# Store pull / watch

class StoreSource:
    """Pulls "only if newer" from the model store (``Pull`` with
    ``if_newer_than``) and waits with ``Watch``."""

    via = "pull"

    def __init__(self, store: Any, model: str):
        """``store`` is a hub address or a :class:`rlhub.StoreClient`."""
        self._own = isinstance(store, str)
        self.store: StoreClient = StoreClient(store) if self._own else store
        self.model = model

    def _wv(self, v: Any) -> Optional[WeightVersion]:
        if v is None:
            return None
        return WeightVersion(v.name, v.version, v.epoch, v.blob, self.via)

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest version if newer than ``than`` ("not modified": None).
        A model that does not exist yet counts as nothing newer."""
        try:
            return self._wv(self.store.pull(self.model, if_newer_than=than))
        except errors.NotFound:
            return None

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Watches the model until a version newer than ``after`` lands."""
        try:
            for v in self.store.watch(self.model, after=after, timeout=timeout):
                if v.version > after:
                    return self._wv(v)
        except errors.DeadlineExceeded:
            return None
        return None

    def close(self) -> None:
        """Closes the store client if this source opened it."""
        if self._own:
            self.store.close()
            self._own = False


# --------------------------------------------------------------------------
# Failover (the Go wsync.Failover, plus a way back)

Dialer = Tuple[str, Callable[[], "Source"]]
"""A named way to open a source, e.g. ``("relay-shm", lambda: ShmSource(path))``."""


class FailoverSource:
    """A :class:`Source` over dialers in order of preference: a relay's
    shared memory, the relay's stream, the upstream hub.

    It uses the first dialer whose source works. When that source fails
    (:class:`rlhub.RlhubError` from it: the relay's stream ended, its writer
    is gone) it lets go of it and dials again, most preferred first, so a
    collector of a dead relay continues from the upstream at the version it
    runs. Unlike the Go ``Failover`` it also goes **back**: while it is on a
    less preferred source it probes the more preferred ones at most every
    ``probe_every`` seconds (from inside ``get_if_newer``/``wait_newer``,
    each probe waiting up to ``probe_timeout`` for a first version) and
    switches to one that serves a version at least as new as the one the
    collector runs, e.g. a relay that has been restarted.

    A failed source is closed only after a newer version has been taken
    from its successor (its last blob may be a leased view the caller still
    uses). ``current`` names the source in use, ``switches`` counts changes.
    :meth:`running` reports the version the collector runs: on the current
    source's stream if it has one, else with the ``Report`` RPC to ``hub``.
    Use from one thread, as a :class:`Receiver` does.
    """

    def __init__(self, dialers: List[Dialer], *, model: str, collector_id: Optional[str] = None,
                 hub: Any = None, probe_every: float = 1.0, probe_timeout: float = 0.5,
                 backoff: float = 0.1):
        if not dialers:
            raise ValueError("FailoverSource needs at least one dialer")
        self.dialers = list(dialers)
        self.model = model
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.probe_every, self.probe_timeout, self.backoff = probe_every, probe_timeout, backoff
        self._hub = _channel(hub) if isinstance(hub, str) else hub
        self._own_hub = isinstance(hub, str)
        self._cur: Optional[Source] = None
        self._idx = -1
        self._retired: List[Source] = []
        self._pending: Optional[WeightVersion] = None  # a probe's first version, served next
        self._next_probe = 0.0
        self._have = 0  # newest version handed out
        self._served = False  # the source in use has returned a version
        self._unserved: List[int] = []  # dialers whose sources failed before serving: tried last
        self.current: Optional[str] = None
        self.switches = 0
        self._closed = False

    @property
    def via(self) -> str:
        return getattr(self._cur, "via", "failover")

    def _dial(self, idx: int) -> Optional[Source]:
        name, dial = self.dialers[idx]
        try:
            return dial()
        except (errors.RlhubError, OSError, grpc.RpcError) as e:
            log.info("rlhub: %s: cannot use %s (%s)", self.model, name, e)
            return None

    def _use(self, idx: int, src: Source) -> None:
        if self._cur is not None:
            self._retired.append(self._cur)
        self._cur, self._idx, self.current = src, idx, self.dialers[idx][0]
        self._served = False
        self.switches += 1
        self._next_probe = time.monotonic() + self.probe_every
        log.info("rlhub: %s now from %s", self.model, self.current)

    def _drop_current(self, why: Exception) -> None:
        log.warning("rlhub: %s: %s failed (%s); failing over", self.model, self.current, why)
        if self._cur is not None:
            self._retired.append(self._cur)
        # A source that failed before serving anything (a dead relay's
        # leftover segment) must not keep the collector from the others.
        if self._served:
            self._unserved.clear()
        elif self._idx not in self._unserved:
            self._unserved.append(self._idx)
        self._cur, self._idx, self.current = None, -1, None

    def _ensure(self) -> bool:
        if self._closed:
            raise errors.Unavailable("failover source is closed")
        if self._cur is not None:
            return True
        order = [i for i in range(len(self.dialers)) if i not in self._unserved] + self._unserved
        for i in order:
            src = self._dial(i)
            if src is not None:
                self._use(i, src)
                return True
        return False

    def _probe(self, than: int) -> None:
        """Goes back to a more preferred source that serves a version at
        least as new as ``than``."""
        if self._idx <= 0 or time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + self.probe_every
        for i in range(self._idx):
            src = self._dial(i)
            if src is None:
                continue
            try:
                alive = getattr(src, "writer_alive", None)
                wv = src.wait_newer(0, self.probe_timeout) if alive is None or alive() else None
            except errors.RlhubError:
                wv = None
            if wv is None or wv.version < than:
                src.close()
                continue
            self._use(i, src)
            self._pending = wv
            return

    def _took(self, wv: Optional[WeightVersion]) -> Optional[WeightVersion]:
        if wv is not None:
            self._served = True
            self._unserved.clear()
        if wv is not None and wv.version > self._have:
            self._have = wv.version
            for old in self._retired:  # a newer version is out: the old blobs are not needed
                old.close()
            self._retired.clear()
        return wv

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest version if newer than ``than`` from the source in use
        (failing over, or going back, first when needed); None when nothing
        newer. Raises :class:`rlhub.Unavailable` when no dialer works."""
        for _ in range(2 * len(self.dialers) + 1):
            if not self._ensure():
                raise errors.Unavailable(f"no source of model {self.model!r} works")
            self._probe(than)
            if self._pending is not None:
                wv, self._pending = self._pending, None
                if wv.version > than:
                    return self._took(wv)
            try:
                return self._took(self._cur.get_if_newer(than))  # type: ignore[union-attr]
            except errors.RlhubError as e:
                self._drop_current(e)
        raise errors.Unavailable(f"every source of model {self.model!r} failed")

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Waits for a version newer than ``after``, failing over as needed;
        None when ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                wv = self.get_if_newer(after)
                if wv is not None:
                    return wv
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # Wait on the source in use, but wake up to probe preferred ones.
                step = left if left is not None else self.probe_every
                if self._idx > 0:
                    step = min(step, max(self._next_probe - time.monotonic(), 0.01))
                return_wv = self._cur.wait_newer(after, step)  # type: ignore[union-attr]
                if return_wv is not None:
                    return self._took(return_wv)
            except errors.RlhubError as e:
                if self._cur is not None:
                    self._drop_current(e)
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                time.sleep(self.backoff if left is None else min(self.backoff, left))

    def running(self, version: int) -> None:
        """Reports the version the collector runs (see the class doc)."""
        fn = getattr(self._cur, "running", None)
        if fn is not None:
            fn(version)
        elif self._hub is not None:
            report(self._hub, self.collector_id, self.model, version, self.via)

    def close(self) -> None:
        """Closes every source it opened and its hub channel. Safe twice."""
        self._closed = True
        for s in self._retired + ([self._cur] if self._cur is not None else []):
            s.close()
        self._retired.clear()
        self._cur = None
        if self._own_hub and self._hub is not None:
            self._hub.close()
            self._own_hub = False

    def __enter__(self) -> "FailoverSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------
# Reports and status

def report(hub: Any, collector_id: str, model: str, version: int, via: str, timeout: float = 10.0) -> None:
    """Reports the version a collector runs with the ``Report`` RPC.

    ``hub`` is an address or a ``grpc.Channel``."""
    ch = _channel(hub) if isinstance(hub, str) else hub
    try:
        sync_pb2_grpc.WeightSyncStub(ch).Report(sync_pb2.SyncReportRequest(reports=[sync_pb2.CollectorReport(
            collector_id=collector_id, model=model, version=version, via=via)]), timeout=timeout)
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None
    finally:
        if isinstance(hub, str):
            ch.close()


def status(hub: Any, model: str = "", timeout: float = 10.0) -> List[sync_pb2.ModelSyncStatus]:
    """The hub's lag picture (``WeightSync.Status``) for ``model`` ("" = all)."""
    ch = _channel(hub) if isinstance(hub, str) else hub
    try:
        resp = sync_pb2_grpc.WeightSyncStub(ch).Status(sync_pb2.SyncStatusRequest(model=model), timeout=timeout)
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None
    finally:
        if isinstance(hub, str):
            ch.close()
    return list(resp.models)


# --------------------------------------------------------------------------
# Applying versions to a module

def _torch_dtypes() -> Dict[str, Any]:
    import torch

    out = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
           "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
           "F64": torch.float64, "I64": torch.int64}
    for attr, name in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                       ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"), ("complex64", "C64")):
        if hasattr(torch, attr):
            out[name] = getattr(torch, attr)
    return out


# safetensors dtypes numpy can copy (all but BF16 and the F8s).
_NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": "<i2", "U16": "<u2", "F16": "<f2",
          "I32": "<i4", "U32": "<u4", "F32": "<f4", "C64": "<c8", "F64": "<f8", "I64": "<i8", "U64": "<u8"}


def _targets(target: Any) -> Dict[str, Any]:
    """The tensors to copy into: a module's parameters and buffers (as
    ``state_dict(keep_vars=True)`` names them) or a mapping of tensors."""
    if hasattr(target, "state_dict") and callable(target.state_dict):
        return dict(target.state_dict(keep_vars=True))
    if isinstance(target, Mapping):
        return dict(target)
    raise TypeError(f"cannot apply weights to a {type(target).__name__}: want a torch.nn.Module or a dict of tensors")


def copy_into(target: Any, blob: Any, *, strict: bool = True, what: str = "weights") -> None:
    """Copies the safetensors ``blob`` into ``target``'s tensors in place.

    Every name, dtype and shape is checked before anything is copied; a
    mismatch raises :class:`rlhub.InvalidArgument` listing each difference
    and leaves ``target`` unchanged. With ``strict=False`` names present on
    only one side are ignored (dtypes and shapes of shared names are still
    checked).
    """
    import torch

    dsts = _targets(target)
    buf = memoryview(blob).cast("B")
    try:
        start, header, _ = parse_header(buf)
    except ValueError as e:
        raise errors.InvalidArgument(f"{what}: {e}") from None
    dtypes = _torch_dtypes()
    problems: List[str] = []
    if strict:
        missing = sorted(set(dsts) - set(header))
        extra = sorted(set(header) - set(dsts))
        if missing:
            problems.append(f"missing from {what}: {', '.join(missing)}")
        if extra:
            problems.append(f"not in the module: {', '.join(extra)}")
    plan: List[Tuple[Any, Any, str, int, int]] = []
    for name, info in header.items():
        dst = dsts.get(name)
        if dst is None:
            continue
        dt, shape = dtypes.get(info["dtype"]), tuple(info["shape"])
        if dt is None:
            problems.append(f"{name!r}: dtype {info['dtype']} is not supported by this torch")
            continue
        if tuple(dst.shape) != shape:
            problems.append(f"{name!r}: shape {list(shape)} in {what}, {list(dst.shape)} in the module")
        if dst.dtype != dt:
            problems.append(f"{name!r}: dtype {dt} in {what}, {dst.dtype} in the module")
        b, e = info["data_offsets"]
        plan.append((dst, dt, info["dtype"], start + b, e - b))
    if problems:
        raise errors.InvalidArgument(f"{what} do not fit: " + "; ".join(problems))
    writable = not memoryview(blob).readonly
    with torch.no_grad():
        for dst, dt, name, off, n in plan:
            if n == 0:
                continue
            raw = buf[off:off + n]
            npdt = _NUMPY.get(name)
            if npdt is not None and dst.device.type == "cpu" and dst.is_contiguous():
                # One single-threaded memcpy through a numpy view: torch's
                # intra-op threads only add overhead to a copy, and on a busy
                # machine they can make it 100x slower. The autograd version
                # counter is bumped as copy_ would.
                np.copyto(dst.detach().numpy().reshape(-1), np.frombuffer(raw, dtype=npdt))
                torch.autograd.graph.increment_version(dst)
                continue
            if not writable:  # torch.frombuffer wants a writable buffer
                raw = bytearray(raw)
            dst.copy_(torch.frombuffer(raw, dtype=dt).view(dst.shape))


class Receiver:
    """Keeps ``target`` (a ``torch.nn.Module`` or a dict of tensors) at the
    newest version a :class:`Source` offers.

    A version is applied only if it is newer than :attr:`version` (so the
    same version twice is a no-op) and only whole: names, dtypes and shapes
    are checked first (:class:`rlhub.InvalidArgument`, nothing copied). After
    each apply the version is reported to the hub: on the push stream for a
    :class:`PushSource`, with the ``Report`` RPC to ``hub`` otherwise (a
    failed report is logged and retried with the next apply; it never undoes
    an apply). Use from one thread.
    """

    def __init__(self, target: Any, source: Source, *, collector_id: Optional[str] = None,
                 model: Optional[str] = None, hub: Any = None, version: int = 0, strict: bool = True):
        self.target = target
        self.source = source
        self.model = model or getattr(source, "model", None) or ""
        self.collector_id = collector_id or getattr(source, "collector_id", None) or \
            f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.strict = strict
        self.version = version
        self.last_report_error: Optional[errors.RlhubError] = None
        self._hub = _channel(hub) if isinstance(hub, str) else hub
        self._own_hub = isinstance(hub, str)

    def apply(self, wv: Optional[WeightVersion]) -> bool:
        """Applies ``wv`` if newer; returns whether it was applied."""
        if wv is None or wv.version <= self.version:
            return False
        copy_into(self.target, wv.blob, strict=self.strict, what=f"model {wv.model!r} v{wv.version}")
        self.version = wv.version
        self._report(wv.via)
        return True

    def _report(self, via: str) -> None:
        running = getattr(self.source, "running", None)
        try:
            if running is not None:
                running(self.version)
            elif self._hub is not None:
                report(self._hub, self.collector_id, self.model, self.version, via)
            self.last_report_error = None
        except errors.RlhubError as e:
            self.last_report_error = e
            log.warning("rlhub: reporting %s v%d for %s failed: %s", self.model, self.version, self.collector_id, e)

    def poll(self) -> bool:
        """Applies the newest version if it is newer (never blocks long)."""
        return self.apply(self.source.get_if_newer(self.version))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to ``timeout`` for a newer version and applies it."""
        return self.apply(self.source.wait_newer(self.version, timeout))

    def run(self, stop: threading.Event, tick: float = 0.5) -> None:
        """Applies each newest version until ``stop`` is set."""
        while not stop.is_set():
            self.wait(tick)

    def close(self) -> None:
        """Closes the source and the hub channel this receiver opened."""
        self.source.close()
        if self._own_hub and self._hub is not None:
            self._hub.close()
            self._own_hub = False

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------
# TorchRL: RlhubWeightUpdater lives in rlhub.torchrl (it subclasses torchrl's
# WeightUpdaterBase, so it needs torchrl); the old import path still works.

def __getattr__(name: str) -> Any:
    if name == "RlhubWeightUpdater":
        from rlhub.torchrl import RlhubWeightUpdater

        return RlhubWeightUpdater
    raise AttributeError(f"module 'rlhub.wsync' has no attribute {name!r}")
