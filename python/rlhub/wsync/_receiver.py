"""Applying versions to a module or a dict of tensors. Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt

from rlhub import errors
from rlhub._crc32c import copy_crc32c, crc32c
from rlhub.store import _new_life
from rlhub.store import channel as _channel
from rlhub.tensors import parse_header, unwritable
from rlhub.wsync._report import report
from rlhub.wsync._source import Source, WeightVersion

log = logging.getLogger("rlhub.wsync")

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
_NUMPY: Dict[str, "npt.DTypeLike"] = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": "<i2", "U16": "<u2", "F16": "<f2",
          "I32": "<i4", "U32": "<u4", "F32": "<f4", "C64": "<c8", "F64": "<f8", "I64": "<i8", "U64": "<u8"}


def _targets(target: Any) -> Dict[str, Any]:
    """The tensors to copy into: a module's parameters and buffers (as
    ``state_dict(keep_vars=True)`` names them) or a mapping of tensors."""
    if hasattr(target, "state_dict") and callable(target.state_dict):
        return dict(target.state_dict(keep_vars=True))
    if isinstance(target, Mapping):
        return dict(target)
    raise TypeError(f"cannot apply weights to a {type(target).__name__}: want a torch.nn.Module or a dict of tensors")


_MAX_PROBLEMS = 5


def _names(ns: List[str]) -> str:
    """Up to three tensor names, each cut to 64 characters, and how many
    more: error text never holds a header's names whole."""
    shown = ", ".join(repr(n[:64]) for n in ns[:3])
    return shown + (f" and {len(ns) - 3} more" if len(ns) > 3 else "")


def copy_into(target: Any, blob: Any, *, strict: bool = True, what: str = "weights",
              crc: Optional[int] = None) -> None:
    """Copies the safetensors ``blob`` into ``target``'s tensors in place.

    Every name, dtype and shape is checked before anything is copied, and
    that each tensor can be written whole (not on the meta device, dense,
    no elements sharing memory: ``tensors.unwritable``); a mismatch raises
    :class:`rlhub.InvalidArgument` listing each difference and leaves
    ``target`` unchanged. With ``strict=False`` names present on
    only one side are ignored (dtypes and shapes of shared names are still
    checked).

    ``crc``, when given, is the CRC-32C the whole blob must have (a
    leasing :class:`ShmSource`'s pending check): it is computed in the same
    pass as the copy, each piece checksummed right after it is copied. A
    mismatch raises :class:`rlhub.InvalidArgument` *after* the copy: the
    blob was damaged where it lies (a leased slot cannot be torn, so this
    is a faulty writer or memory), and ``target`` then holds those damaged
    bytes until a good version is applied.
    """
    import torch

    dsts = _targets(target)
    buf = memoryview(blob).cast("B")
    try:
        start, header, _ = parse_header(buf)
    except ValueError as err:
        raise errors.InvalidArgument(f"{what}: {err}") from None
    dtypes = _torch_dtypes()
    problems: List[str] = []
    if strict:
        missing = sorted(set(dsts) - set(header))
        extra = sorted(set(header) - set(dsts))
        if missing:
            problems.append(f"missing from {what}: {_names(missing)}")
        if extra:
            problems.append(f"not in the module: {_names(extra)}")
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
        why = unwritable(dst)
        if why is not None:
            problems.append(f"{name!r} in the module {why}")
        b, e = info["data_offsets"]
        plan.append((dst, dt, info["dtype"], start + b, e - b))
    if problems:
        # Bounded: the names and the count come from the version's header.
        more = f"; and {len(problems) - _MAX_PROBLEMS} more" if len(problems) > _MAX_PROBLEMS else ""
        raise errors.InvalidArgument(f"{what} do not fit: " + "; ".join(p[:300] for p in problems[:_MAX_PROBLEMS]) + more)
    writable = not memoryview(blob).readonly
    # With a crc the whole blob is checksummed in order: the header, each
    # tensor's bytes (copied and checksummed in one pass where numpy can
    # copy them), and whatever lies between or after them.
    run = None if crc is None else crc32c(buf[:start])
    at = start
    with torch.no_grad():
        for dst, dt, name, off, n in sorted(plan, key=lambda p: p[3]) if crc is not None else plan:
            if run is not None and off > at:
                run = crc32c(buf[at:off], run)  # bytes no tensor of the module takes
            at = max(at, off + n)
            if n == 0:
                continue
            raw = buf[off:off + n]
            npdt = _NUMPY.get(name)
            if npdt is not None and dst.device.type == "cpu" and dst.is_contiguous():
                # One single-threaded memcpy through a numpy view: torch's
                # intra-op threads only add overhead to a copy, and on a busy
                # machine they can make it 100x slower. The autograd version
                # counter is bumped as copy_ would.
                out = dst.detach().numpy().reshape(-1)
                if run is not None:
                    run = copy_crc32c(out.view(np.uint8), raw, run)
                else:
                    np.copyto(out, np.frombuffer(raw, dtype=npdt))
                torch.autograd.graph.increment_version(dst)
                continue
            if run is not None:
                run = crc32c(raw, run)
            # torch.frombuffer wants a writable buffer
            src = raw if writable else bytearray(raw)
            dst.copy_(torch.frombuffer(src, dtype=dt).view(dst.shape))
    if run is not None:
        if at < len(buf):
            run = crc32c(buf[at:], run)
        if run != crc:
            raise errors.InvalidArgument(
                f"{what}: CRC-32C {run:08x}, the writer stored {crc:08x}: the copy in the module is damaged "
                "(applying the next good version repairs it)")


class Receiver:
    """Keeps ``target`` (a ``torch.nn.Module`` or a dict of tensors) at the
    newest version a :class:`Source` offers.

    A version is applied only if it is newer than :attr:`version` (so the
    same version twice is a no-op; but see lives below) and only whole: names, dtypes and shapes
    are checked first (:class:`rlhub.InvalidArgument`, nothing copied). After
    each apply the version is reported to the hub: on the push stream for a
    :class:`PushSource`, with the ``Report`` RPC to ``hub`` otherwise (a
    failed report is logged and retried with the next apply; it never undoes
    an apply). Use from one thread.

    It follows the model's lives (``follow_lives``, the default;
    docs/weight-sync.md, "Lives"): a version of another life than
    :attr:`life` (the running version's, both known) is applied though it
    is not newer — the model was deleted and pushed again (a training run
    restarted under its name), and a collector never wants to keep acting
    on the deleted model's weights. :meth:`poll` and :meth:`wait` ask a
    source that follows lives (``follows_lives``) for such a version with
    :attr:`life`. ``life`` is the life of ``version`` (0: unknown). A hub
    restart or a cluster failover keeps the lives (a hub with ``--data``).
    ``follow_lives=False``: only newer versions are applied.
    """

    def __init__(self, target: Any, source: Source, *, collector_id: Optional[str] = None,
                 model: Optional[str] = None, hub: Any = None, version: int = 0, strict: bool = True,
                 follow_lives: bool = True, life: int = 0):
        self.target = target
        self.source = source
        self.model = model or getattr(source, "model", None) or ""
        self.collector_id = collector_id or getattr(source, "collector_id", None) or \
            f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.strict = strict
        self.version = version
        self.follow_lives = follow_lives
        self.life = life
        """The running version's life (``WeightVersion.life``; 0: unknown)."""
        self.last_report_error: Optional[errors.RlhubError] = None
        self._hub = _channel(hub) if isinstance(hub, str) else hub
        self._own_hub = isinstance(hub, str)

    def apply(self, wv: Optional[WeightVersion]) -> bool:
        """Applies ``wv`` if newer (or, following lives, of another life
        than :attr:`life`); returns whether it was applied.

        A version from a leasing :class:`ShmSource` (the default) is copied
        straight from its slot into the module, its CRC-32C checked in the
        same pass, and the slot is released right after (applied or not:
        the module holds its own copy either way)."""
        try:
            if wv is None or (wv.version <= self.version
                               and not (self.follow_lives and _new_life(wv.life, self.life))):
                return False
            copy_into(self.target, wv.blob, strict=self.strict, what=f"model {wv.model!r} v{wv.version}", crc=wv.crc)
        finally:
            release = getattr(self.source, "release", None)
            if wv is not None and release is not None:
                release()
        self.version = wv.version
        self.life = wv.life
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

    def get(self, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """The source's newest version if this receiver would apply it
        (newer, or following lives of another life), waiting up to
        ``timeout`` seconds for one when given (else not blocking); None
        when there is none. :meth:`apply` it."""
        return self._get(bool(timeout), timeout)

    def _get(self, wait: bool, timeout: Optional[float]) -> Optional[WeightVersion]:
        """``get``; with ``wait``, the source's ``wait_newer(timeout)``
        (None: for as long as it takes)."""
        if self.follow_lives and getattr(self.source, "follows_lives", False):
            src: Any = self.source  # takes life= (Source's doc)
            got: Optional[WeightVersion] = src.wait_newer(self.version, timeout, life=self.life) if wait else \
                src.get_if_newer(self.version, life=self.life)
            return got
        if wait:
            return self.source.wait_newer(self.version, timeout)
        return self.source.get_if_newer(self.version)

    def poll(self) -> bool:
        """Applies the newest version if it is newer (never blocks long)."""
        return self.apply(self._get(False, None))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to ``timeout`` for a newer version and applies it."""
        return self.apply(self._get(True, timeout))

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
