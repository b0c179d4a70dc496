"""The shared-memory reader (docs/shm-layout.md, layout version 1). Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform
import stat
import struct
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, Optional

import numpy as np

from rlhub import errors
from rlhub._crc32c import copy_crc32c
from rlhub.tensors import parse_header
from rlhub.wsync._source import WeightVersion, default_shm_path

log = logging.getLogger("rlhub.wsync")

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
# Liveness ("Liveness" in docs/shm-layout.md): how a reader judges the
# writer, and lease owners, alive. 0: by pid (older writers); 1: the writer
# holds an OFD write lock on byte _OFF_LIVENESS of the file while it lives.
_OFF_LIVENESS, _LIVENESS_PID, _LIVENESS_LOCK = 320, 0, 1
# The life of every version in the segment (docs/shm-layout.md, "Lives"):
# a u64 the writer sets before the segment appears (0 from older writers:
# unknown). A writer of another life (the model deleted and pushed again)
# makes a new segment, which this source reopens.
_OFF_LIFE = 328
# An owner token with this bit holds its entry's OFD lock (on the entry's
# first byte): the lock, not the pid, says whether it lives.
_LEASE_LOCKED = 1 << 31


def _flock_format() -> Optional[str]:
    """The layout of ``struct flock`` where it is known (64-bit Linux on
    x86-64 and arm64: l_type, l_whence, 4 bytes of padding, l_start, l_len,
    l_pid, 4 bytes of padding), else None: no OFD locks from here."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64", "arm64"):
        return None
    return "=hh4xqqi4x"


_FLOCK = _flock_format()


def _ofd(fd: int, cmd_name: str, default_cmd: int, typ: int, off: int) -> int:
    """fcntl(fd, F_OFD_*, struct flock) on the one byte at ``off``; returns
    the l_type the kernel hands back. Open file description locks belong to
    the open file, not to the process (unlike fcntl.lockf and F_SETLK, which
    a process loses when it closes any descriptor of the file), so they work
    across pid namespaces, and the kernel drops them when the last
    descriptor of the open file closes, as when the process dies."""
    import fcntl

    assert _FLOCK is not None
    cmd: int = getattr(fcntl, cmd_name, default_cmd)
    out = fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, typ, os.SEEK_SET, off, 1, 0))
    typ_out: int = struct.unpack(_FLOCK, out)[0]
    return typ_out


def _ofd_lock(fd: int, off: int) -> bool:
    """Takes an OFD write lock on byte ``off`` without waiting; False when
    another open file description holds one. ``fd`` must be writable."""
    import fcntl

    try:
        _ofd(fd, "F_OFD_SETLK", 37, fcntl.F_WRLCK, off)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _ofd_unlock(fd: int, off: int) -> None:
    import fcntl

    _ofd(fd, "F_OFD_SETLK", 37, fcntl.F_UNLCK, off)


def _ofd_locked(fd: int, off: int) -> bool:
    """Whether an open file description other than ``fd``'s holds a lock
    on byte ``off`` (``fd`` may be read-only)."""
    import fcntl

    return _ofd(fd, "F_OFD_GETLK", 36, fcntl.F_WRLCK, off) != fcntl.F_UNLCK


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


def _lease_token(locked: bool) -> int:
    """pid << 32 | a per-process counter, as the Go reader's owner tokens,
    with _LEASE_LOCKED when the owner holds the entry's OFD lock."""
    global _lease_counter
    with _lease_lock:
        _lease_counter = (_lease_counter + 1) & (_LEASE_LOCKED - 1)
        n = _lease_counter
    return (os.getpid() & 0xFFFFFFFF) << 32 | n | (_LEASE_LOCKED if locked else 0)


def _owner_gone(owner: int) -> bool:
    """Whether an older reader's entry (a token without _LEASE_LOCKED) is
    owned by a process that has exited. A pid of another pid namespace
    means nothing here: such readers lock their entries instead."""
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

    By default it **leases** each version's slot (docs/shm-layout.md, "Slot
    leases"): a version's ``blob`` is a read-only view of the shared memory
    (no copy), and the writer leaves the slot alone until this source
    returns a newer version, :meth:`release` is called, or it closes. A
    :class:`Receiver` copies the view straight into the module's tensors,
    checking the CRC-32C in the same pass (``WeightVersion.crc``), and
    releases the slot at once: one copy from the segment to the module.
    Leasing needs a segment with a free lease entry (a relay started with
    2 + n slots: a relay's automatic size holds up to 8), write access to the file, and ``membarrier(2)``
    (Linux); without them the source copies, as ``leasing`` reports and
    ``copy_reason`` explains (also logged once). Closing a leasing source
    releases its lease: views still held afterwards may then change under
    you.

    ``lease=False`` makes a copying reader: each version is copied into one
    of two private buffers (CRC checked in that pass) and a Receiver copies
    it again into the module. Each copy is a memcpy of the model, so this
    path costs about twice the default's memory traffic per collector: it
    is memory-bandwidth bound (docs/weight-sync.md, "Shared memory").

    Not thread-safe: one reader thread per ``ShmSource``. ``stats`` counts
    ``reads`` (whole versions returned) and ``retries`` (copies restarted
    because the writer overwrote the slot meanwhile: torn reads caught).

    Args:
        path: the segment file; default ``/dev/shm/rlhub-<model>``.
        model: the model name (checked against the segment header when given).
        verify: check each version's CRC-32C (the default here; Go's reader
            checks it on x86-64 only with ``shm.ReaderConfig.Verify``). Without
            ``google-crc32c`` installed the check runs in numpy at tens to a few
            hundred MB/s; ``verify=False`` relies on the seqlock alone.
        max_retries: consecutive torn copies before giving up with
            :class:`rlhub.Aborted`.
        tick: longest sleep of ``wait_newer`` between liveness checks.
        lease: read versions in place under a lease (the default, see
            above); False copies them.
    """

    via = "shm"
    follows_lives = True
    """A :class:`Receiver` passes the life it runs (docs/shm-layout.md,
    "Lives"): a segment of another life is read from its first version."""

    def __init__(self, path: Optional[str] = None, model: Optional[str] = None, *, verify: bool = True,
                 max_retries: int = 1000, tick: float = 0.05, lease: bool = True):
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
        self.stats = {"reads": 0, "retries": 0, "in_place": 0, "released": 0}
        self.copy_reason = ""  # why this source copies instead of leasing ("" while it leases)
        self._bufs: List[bytearray] = [bytearray(), bytearray()]
        self._which = 0
        self._map = None
        self._lease = lease
        self._entry = -1  # the lease entry this source owns; -1 when it copies
        self._token = 0  # the owner token it stored there
        self._hmap: Optional[mmap.mmap] = None  # writable mapping of the header page (leasing only)
        self._hq: Any = None  # its aligned 8-byte words
        # The segment's open file, kept until close: the writer's liveness
        # lock is probed through it, and a leasing source holds its entry's
        # OFD lock on it. _fd_closer closes it (at close, or if the source
        # is collected unclosed).
        self._fd = -1
        self._fd_closer: Optional[weakref.finalize] = None  # type: ignore[type-arg]
        self._liveness = _LIVENESS_PID
        self._open()
        if model is not None and model != self.model:
            name = self.model
            self.close()
            raise errors.InvalidArgument(f"shm segment {path} holds model {name!r}, not {model!r}")

    def _open(self) -> None:
        writable = self._lease and _fence() is not None
        if not self._lease:
            self.copy_reason = "copying reader (lease=False)"
        elif not writable:
            self.copy_reason = "no membarrier(2) on this system, so a lease cannot be fenced"
        fd = -1
        try:
            if writable:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
                except PermissionError:
                    writable = False
                    self.copy_reason = f"{self.path} is not writable by this process, so its lease table cannot be written"
            if fd < 0:
                # O_NONBLOCK: a FIFO at the path would hold open(2), with no
                # deadline, until a writer came; refused below.
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise errors.NotFound(f"shm segment {self.path} does not exist") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise errors.InvalidArgument(f"shm segment {self.path} is not a regular file")
            if st.st_size < _PAGE or st.st_size % 8:
                raise errors.InvalidArgument(f"shm segment {self.path} has {st.st_size} bytes")
            m = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            try:
                self._open_checked(m, st, fd if writable else -1)
            except BaseException:
                m.close()
                raise
        except BaseException:
            os.close(fd)  # and with it any lock taken on it
            raise
        self._fd, self._fd_closer = fd, weakref.finalize(self, os.close, fd)

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
            liveness = d[_OFF_LIVENESS // 4]
            if liveness not in (_LIVENESS_PID, _LIVENESS_LOCK):
                raise errors.InvalidArgument(f"shm segment {self.path}: liveness scheme {liveness}, this reader "
                                             f"knows {_LIVENESS_PID} (pid) and {_LIVENESS_LOCK} (OFD lock)")
        except BaseException:
            for v in (q, d, mv):
                if v is not None:
                    v.release()
            raise
        self._map, self._mv, self._q, self._d = m, mv, q, d
        self.model, self.slots, self.capacity, self.stride = name, slots, cap, stride
        self._pid = q[_OFF_PID // 8]
        self._liveness = liveness
        self.life = q[_OFF_LIFE // 8]  # the life of the segment's versions (0: unknown)
        self._ino = st.st_ino  # of the file mapped, to notice a replaced segment
        self._notify_addr = np.frombuffer(m, dtype=np.uint8, count=1, offset=_OFF_NOTIFY).ctypes.data
        self.leases = leases
        if rw_fd >= 0 and leases > 0:
            try:
                self._claim(rw_fd)
            except OSError as e:  # no lease after all: copy
                self.copy_reason = f"cannot claim a lease entry ({e})"
            else:
                if self._entry < 0:
                    self.copy_reason = f"every one of the {leases} lease entries of {self.path} is held by a live reader"
        elif rw_fd >= 0:
            self.copy_reason = (f"{self.path} has no lease table ({slots} slots; a writer leaves slots - 2 entries, "
                                "so 3 or more slots lease)")
        if self._entry >= 0:
            self.copy_reason = ""
        elif self._lease:
            log.warning("rlhub: shm segment %s: copying versions instead of leasing them: %s", self.path,
                        self.copy_reason)

    def _claim(self, fd: int) -> None:
        """Takes a free lease entry, or one whose owner is gone, under the
        exclusive flock every claimer takes (docs/shm-layout.md). Whether an
        owner lives is decided by the entry's OFD lock ("Liveness"): this
        source takes a write lock on the entry's first byte through ``fd``
        without waiting, which succeeds only if no live reader holds it,
        and keeps it while it owns the entry. An owner whose token lacks
        _LEASE_LOCKED is an older reader, which holds no lock: it goes by
        its pid. Only the header page is mapped writable."""
        import fcntl

        hmap = mmap.mmap(fd, _PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        hq = np.frombuffer(hmap, dtype=np.uint64)  # aligned 8-byte loads and stores
        locking = _FLOCK is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for e in range(self.leases):
                off = _OFF_LEASE_TABLE + e * _LEASE_ENTRY
                locked = False
                if locking:
                    try:
                        locked = _ofd_lock(fd, off)
                    except OSError as err:
                        if err.errno != errno.EINVAL:
                            continue  # not lockable: leave it
                        locking = False  # a kernel without OFD locks: owners go by their pids
                    else:
                        if not locked:
                            continue  # held by a live reader
                base = off // 8
                owner = int(hq[base + _LEASE_OWNER // 8])
                if owner != 0 and (not locked or not owner & _LEASE_LOCKED) and not _owner_gone(owner):
                    if locked:
                        _ofd_unlock(fd, off)
                    continue
                token = _lease_token(locked)
                hq[base + _LEASE_OWNER // 8] = token
                hq[base + _LEASE_SLOT // 8] = 0  # a dead owner's slot is released only now
                hq[base + _LEASE_SEQ // 8] = 0
                self._entry, self._token, self._hmap, self._hq = e, token, hmap, hq
                return
        finally:
            # Explicitly: the source keeps the file open (and the mapping
            # would keep the open file, and the lock, alive after it closes).
            fcntl.flock(fd, fcntl.LOCK_UN)
        del hq
        hmap.close()

    @property
    def leasing(self) -> bool:
        """Whether this source holds a lease entry (reads in place)."""
        return self._entry >= 0

    def _lease_word(self, field: int) -> int:
        return (_OFF_LEASE_TABLE + self._entry * _LEASE_ENTRY + field) // 8

    def release(self) -> None:
        """Gives back the slot this source holds leased, so the writer may
        use it again: the version it returned last must no longer be read
        (its view may change). The source keeps its lease entry and leases
        again on its next read. A :class:`Receiver` calls this right after
        copying a version into the module. A copying source does nothing."""
        if self._map is None or self._entry < 0:
            return
        hq = self._hq
        if hq[self._lease_word(_LEASE_SLOT)] == 0:
            return
        hq[self._lease_word(_LEASE_SLOT)] = 0
        hq[self._lease_word(_LEASE_SEQ)] = 0
        self.stats["released"] += 1

    def _drop_entry(self) -> None:
        """Gives up the lease entry's OFD lock (the entry's words are the
        caller's business); the source copies from then on."""
        if self._entry >= 0 and self._token & _LEASE_LOCKED:
            try:
                _ofd_unlock(self._fd, _OFF_LEASE_TABLE + self._entry * _LEASE_ENTRY)
            except OSError:
                pass  # closing the file drops it too
        self._entry = -1

    def _release(self) -> None:
        if self._map is None:
            return
        if self._entry >= 0:
            # Drop the lease first, then free the entry, then its lock: a
            # reader claiming it finds no slot named.
            hq = self._hq
            hq[self._lease_word(_LEASE_SLOT)] = 0
            hq[self._lease_word(_LEASE_SEQ)] = 0
            hq[self._lease_word(_LEASE_OWNER)] = 0
            del hq
            self._drop_entry()
        self._hq = None
        if self._hmap is not None:
            self._hmap.close()
            self._hmap = None
        for v in (self._q, self._d, self._mv):
            v.release()
        try:
            self._map.close()
        except BufferError:
            pass  # leased versions still viewed by the caller: unmapped when the last goes
        self._map = None
        if self._fd_closer is not None:
            self._fd_closer()  # closes the file (once)
            self._fd_closer = None
        self._fd = -1

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
        """Whether the segment is open and its writer lives: holds its
        liveness lock (a writer that records it, in any pid namespace), or,
        for an older writer's segment, whose process exists."""
        if self._map is None or self._d[_OFF_STATE // 4] == _STATE_CLOSED:
            return False
        if self._liveness == _LIVENESS_LOCK and _FLOCK is not None:
            try:
                return _ofd_locked(self._fd, _OFF_LIVENESS)
            except OSError:
                pass  # cannot probe: the pid decides
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
            src = self._mv[off + _PAGE:off + _PAGE + length]
            if self.verify:  # the private copy and its CRC in one pass
                got = copy_crc32c(out, src)
            else:
                out[:] = src  # the private copy (one memcpy)
            if q[base] != best_seq:
                self.stats["retries"] += 1  # the writer came back to this slot: torn, retry
                out.release()
                continue
            if self.verify:
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
        A version whose header does not parse raises and leaves the current
        lease where it was. Its CRC-32C is not checked here: the version
        carries it (``WeightVersion.crc``) for the pass that copies it into
        a module, or :meth:`WeightVersion.verify`, so the slot is read once."""
        q = self._q
        off = _PAGE + best * self.stride
        base = off // 8
        view = self._mv[off + _PAGE:off + _PAGE + length]
        try:
            parse_header(view)
            bad = None
        except ValueError as e:
            bad = e
        if q[base] != s:
            view.release()
            return None  # the writer was rewriting it: whatever we read is void
        if bad is not None:
            view.release()
            raise errors.InvalidArgument(f"shm segment {self.path} version {version}: {bad}") from None
        if self._hq[self._lease_word(_LEASE_OWNER)] != self._token:
            # Another reader took the entry over (an older one, which goes
            # by pids, judged this process gone: another pid namespace). Its
            # lease is not ours to write: copy from now on.
            view.release()
            self.copy_reason = f"lease entry {self._entry} of {self.path} was taken over by another reader"
            log.warning("rlhub: shm segment %s: %s; copying versions from now on", self.path, self.copy_reason)
            self._drop_entry()
            return None
        self._hq[self._lease_word(_LEASE_SLOT)] = best + 1  # releases the previous version's slot
        self._hq[self._lease_word(_LEASE_SEQ)] = s
        fence = _FENCE
        assert fence is not None  # a source leases only when there is a fence (__init__)
        fence()
        if q[base] != s:
            view.release()
            return None
        self.stats["reads"] += 1
        self.stats["in_place"] += 1
        return WeightVersion(self.model, version, epoch, view, self.via, crc if self.verify else None)

    def get_if_newer(self, than: int, life: int = 0) -> Optional[WeightVersion]:
        """The newest whole version if newer than ``than``; None if there is
        none. Raises :class:`rlhub.Unavailable` when the writer closed the
        segment or died and nothing newer is left; a segment replaced by a
        new one at the same path (a relay that outgrew it, or one that
        started a new life) is reopened.

        ``life``, the life of version ``than`` (0: unknown), follows lives
        (docs/weight-sync.md, "Lives"): when the segment is of another known
        life (``self.life``; the model deleted and pushed again) its newest
        is returned though not newer."""
        self._check_open()
        wv = self._read(self._after(than, life))
        if wv is not None:
            return self._named(wv)
        if not self.writer_alive():
            if self._reopen():
                wv = self._read(self._after(than, life))
                return None if wv is None else self._named(wv)
            raise errors.Unavailable(f"the writer of {self.path} is gone")
        return None

    def _after(self, than: int, life: int) -> int:
        """``than``, or 0 when the segment is of another life than ``life``
        (both known): its versions start afresh."""
        return 0 if life and self.life and life != self.life else than

    def _named(self, wv: WeightVersion) -> WeightVersion:
        """``wv`` with the segment's life."""
        wv.life = self.life
        return wv

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
            name = self.model
            self._release()  # never hand out another model's versions: closed from now on
            self.model = model
            raise errors.InvalidArgument(f"shm segment {self.path} now holds model {name!r}, not {model!r}; "
                                         "source closed")
        return self.writer_alive()

    def wait_newer(self, after: int, timeout: Optional[float] = None, life: int = 0) -> Optional[WeightVersion]:
        """Blocks (on the segment's futex word where possible) until a version
        newer than ``after`` is published (or, with ``life``, one of another
        life is there: see :meth:`get_if_newer`); None when ``timeout``
        passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_open()
            n = self._d[_OFF_NOTIFY // 4]
            wv = self.get_if_newer(after, life)
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
