"""Applying versions to a module or a dict of tensors. Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from rlhub import errors
from rlhub.store import channel as _channel
from rlhub.tensors import parse_header
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
