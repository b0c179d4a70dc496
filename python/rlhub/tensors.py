"""State dicts to and from safetensors bytes, with no pickle anywhere.

The encoding is byte-identical to the Go side's and to the ``safetensors``
library's (tensors sorted by dtype rank, largest first, then by name; compact
JSON header padded with spaces to a multiple of 8), so a blob made here and
pulled by Go, or the reverse, compares equal byte for byte.

Values may be numpy arrays or torch tensors (torch is imported only when a
torch tensor is seen or ``framework="torch"`` is asked for).
"""

from __future__ import annotations

import json
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:  # torch is optional at run time: imported where used
    import torch

# safetensors dtype name -> (rank in the reference ordering, numpy dtype or None)
_DTYPES: Dict[str, Tuple[int, Optional[np.dtype]]] = {
    "BOOL": (0, np.dtype(np.bool_)),
    "U8": (4, np.dtype("<u1")),
    "I8": (5, np.dtype("<i1")),
    "F8_E5M2": (6, None),
    "F8_E4M3": (7, None),
    "I16": (9, np.dtype("<i2")),
    "U16": (10, np.dtype("<u2")),
    "F16": (11, np.dtype("<f2")),
    "BF16": (12, None),
    "I32": (13, np.dtype("<i4")),
    "U32": (14, np.dtype("<u4")),
    "F32": (15, np.dtype("<f4")),
    "C64": (16, np.dtype("<c8")),
    "F64": (17, np.dtype("<f8")),
    "I64": (18, np.dtype("<i8")),
    "U64": (19, np.dtype("<u8")),
}
_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
          "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8,
          "I64": 8, "U64": 8}
_NP_TO_NAME = {v[1]: k for k, v in _DTYPES.items() if v[1] is not None}

MAX_HEADER_BYTES = 100_000_000


_TORCH_NAMES: Optional[Dict[Any, str]] = None

_Entry = Tuple[str, str, Tuple[int, ...], memoryview]
"""(tensor name, dtype name, shape, little-endian bytes)."""


def _torch_dtype_name(t: Any, name: str = "") -> str:
    global _TORCH_NAMES
    names = _TORCH_NAMES
    if names is None:
        import torch

        names = {
            torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
            torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
            torch.float32: "F32", torch.float64: "F64", torch.int64: "I64",
        }
        for attr, name in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                           ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"),
                           ("complex64", "C64")):
            if hasattr(torch, attr):
                names[getattr(torch, attr)] = name
        _TORCH_NAMES = names
    found = names.get(t.dtype)
    if found is None:
        raise TypeError(f"tensor {_quote(name)}: unsupported torch dtype {t.dtype}" if name
                        else f"unsupported torch dtype {t.dtype}")
    return found


def _as_entry(name: str, value: Any) -> Tuple[str, Tuple[int, ...], memoryview]:
    """Returns (dtype name, shape, little-endian bytes) without copying when possible."""
    if type(value).__module__.startswith("torch"):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = _resolved(t).contiguous()
        dt = _torch_dtype_name(t, name)
        raw = t.view(-1).view(__import__("torch").uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        return dt, tuple(t.shape), raw.data.cast("B")
    a = np.asarray(value)
    key = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    if a.dtype.byteorder == ">":
        a = a.astype(key)
    name_dt = _NP_TO_NAME.get(np.dtype(key))
    if name_dt is None:
        raise TypeError(f"tensor {_quote(name)}: unsupported numpy dtype {a.dtype}")
    shape = tuple(int(d) for d in a.shape)  # before ascontiguousarray, which makes 0-d arrays 1-d
    a = np.ascontiguousarray(a)
    return name_dt, shape, a.reshape(-1).view(np.uint8).data


def _resolved(t: Any) -> Any:
    """``t`` with its values in memory: a conjugate view (``x.conj()`` of a
    complex tensor) or a tensor with the negative bit set (``.imag`` of
    one) keeps the unconjugated, unnegated values in memory and applies the
    bit when read, so its bytes are those of a resolved copy. Other
    tensors are returned as they are."""
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def save_parts(state_dict: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> Tuple[bytes, List[memoryview]]:
    """The safetensors encoding of ``state_dict`` as pieces: the header
    (length prefix, JSON, padding) and each tensor's bytes in file order
    (dtype rank, largest first, then name), a memoryview of the tensor's own
    CPU memory where it is contiguous (no copy). The views are only valid
    while the tensors are unchanged. ``save_bytes`` joins them; the gradient
    client sends them as they are (one ``sendmsg``)."""
    entries: List[_Entry] = []
    for name, value in state_dict.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"bad tensor name {_quote(name)}")
        dt, shape, raw = _as_entry(name, value)
        entries.append((name, dt, shape, raw))
    entries.sort(key=lambda e: (-_DTYPES[e[1]][0], e[0]))
    key = (tuple((e[0], e[1], e[2]) for e in entries),
           tuple(sorted((k, str(v)) for k, v in metadata.items())) if metadata else ())
    head = _HEADERS.get(key)
    if head is None:
        head = _encode_header(entries, metadata)
        with _HEADERS_MU:
            if len(_HEADERS) >= _MAX_HEADERS:
                _HEADERS.clear()
            _HEADERS[key] = head
    return head, [e[3] for e in entries]


# Encoded headers by (names, dtypes, shapes, metadata): a learner pushing
# gradients of one model encodes its header once, not on every push.
_HEADERS: Dict[Any, bytes] = {}
_HEADERS_MU = threading.Lock()
_MAX_HEADERS = 64


def _encode_header(entries: Sequence[_Entry], metadata: Optional[Mapping[str, str]]) -> bytes:
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {k: str(metadata[k]) for k in sorted(metadata)}
    off = 0
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + raw.nbytes]}
        off += raw.nbytes
    hj = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    return struct.pack("<Q", len(hj)) + hj


def parts_size(head: bytes, bufs: Sequence[memoryview]) -> int:
    """The encoded size of ``save_parts``' pieces."""
    return len(head) + sum(b.nbytes for b in bufs)


def save_bytes(state_dict: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """Encodes a dict of numpy arrays / torch tensors as safetensors bytes."""
    head, bufs = save_parts(state_dict, metadata)
    out = bytearray(parts_size(head, bufs))
    out[:len(head)] = head
    p = len(head)
    for raw in bufs:
        out[p:p + raw.nbytes] = raw
        p += raw.nbytes
    return bytes(out)


def parse_header(buf: memoryview, total: Optional[int] = None) -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    """Validates a safetensors header; returns (data start, tensors,
    metadata). ``buf`` is the whole file, or with ``total`` (the file's
    size) at least its header: the offsets are checked against ``total``."""
    size = len(buf) if total is None else total
    if len(buf) < 8 or size < 8:
        raise ValueError("safetensors: too short for the header length")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > MAX_HEADER_BYTES or n > size - 8 or n > len(buf) - 8:
        raise ValueError(f"safetensors: header length {n} out of bounds")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"safetensors: malformed header: {err}") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors: header is not an object")
    metadata = header.pop("__metadata__", None) or {}
    start, data_len = 8 + n, size - 8 - n
    spans = []
    for name, info in header.items():
        # The header's values are anyone's (a damaged segment, a peer):
        # their types are checked before use, and quoted bounded (_quote).
        try:
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"safetensors: tensor {_quote(name)} lacks dtype/shape/data_offsets") from None
        if not isinstance(dt, str) or dt not in _SIZES:
            raise ValueError(f"safetensors: tensor {_quote(name)}: unknown dtype {_quote(dt)}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"safetensors: tensor {_quote(name)}: bad shape {_quote(shape)}")
        if not isinstance(b, int) or not isinstance(e, int):
            raise ValueError(f"safetensors: tensor {_quote(name)}: data_offsets {_quote([b, e])} are not integers")
        # The element count, capped past what the data could hold: a
        # claimed shape never costs more than its own length.
        count = 0 if 0 in shape else 1
        for d in shape:
            count = min(count * d, data_len + 1)
        if not (0 <= b <= e <= data_len) or e - b != count * _SIZES[dt]:
            raise ValueError(f"safetensors: tensor {_quote(name)}: data_offsets {_quote([b, e])} do not fit "
                             f"shape {_quote(shape)} × {dt}")
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise ValueError(f"safetensors: tensor {_quote(name)}: gap or overlap at offset {b}")
        pos = e
    if pos != data_len:
        raise ValueError("safetensors: trailing bytes after the last tensor")
    return start, header, metadata


def load_bytes(blob: Any, framework: str = "numpy") -> Dict[str, Any]:
    """Decodes safetensors bytes into a dict (in file order).

    numpy arrays are read-only views over ``blob`` (no copy). With
    ``framework="torch"`` the tensors are views over ``blob`` too when it
    is writable (a pulled version's is: writing a tensor writes the
    blob) and the tensor's bytes lie aligned to its element size; each
    other one (a read-only ``bytes`` blob, an unaligned tensor) is copied
    into a new torch tensor.
    """
    buf = memoryview(blob).cast("B")
    start, header, _ = parse_header(buf)
    out: Dict[str, Any] = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        raw = buf[start + b:start + e]
        dt, shape = info["dtype"], tuple(info["shape"])
        if framework == "torch":
            out[name] = _to_torch(raw, dt, shape)
            continue
        npdt = _DTYPES[dt][1]
        if npdt is None:
            raise TypeError(f"tensor {_quote(name)}: dtype {dt} has no numpy equivalent; use framework='torch'")
        out[name] = np.frombuffer(raw, dtype=npdt).reshape(shape)
    return out


def _torch_dtype(dt: str) -> "torch.dtype":
    import torch

    by_name = {
        "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
        "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
        "F64": torch.float64, "I64": torch.int64,
    }
    for attr, name in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                       ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"),
                       ("complex64", "C64")):
        if hasattr(torch, attr):
            by_name[name] = getattr(torch, attr)
    if dt not in by_name:
        raise TypeError(f"dtype {dt} unsupported by this torch")
    return by_name[dt]


def _to_torch(raw: memoryview, dt: str, shape: Tuple[int, ...]) -> "torch.Tensor":
    import torch

    tdt = _torch_dtype(dt)
    if len(raw) == 0:
        return torch.empty(shape, dtype=tdt)
    if not raw.readonly:  # a view: no copy of the pulled bytes
        t = torch.frombuffer(raw, dtype=tdt)
        if t.data_ptr() % t.element_size() == 0:
            return t.reshape(shape)
    return torch.frombuffer(bytearray(raw), dtype=tdt).reshape(shape)


def unwritable(t: Any) -> Optional[str]:
    """Why a version cannot be written whole into torch tensor ``t`` in
    place (None: it can): it has no memory (the meta device), is not dense,
    has elements that share memory, which ``copy_`` refuses, or is a
    conjugate or negative view, whose memory holds other values than it
    reads. Writers
    check every tensor of a target before the first copy, so a write never
    stops midway or counts a no-op as done."""
    import torch

    fanned = getattr(t, "fanned_out", None)  # one copy into several tensors (rlhub.torchrl's fan-out)
    if fanned is not None:
        return next((why for x in fanned() if (why := unwritable(x)) is not None), None)
    if t.device.type == "meta":
        return "is on the meta device: it holds no memory to write into (materialize it first, e.g. Module.to_empty)"
    if t.layout != torch.strided:
        return f"has layout {t.layout}: only dense tensors are written in place"
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return "has elements that share memory (an expanded tensor): clone it first"
    if t.is_conj() or t.is_neg():
        # Its memory holds the values before the bit is applied: bytes
        # written there would read back conjugated or negated.
        return "is a conjugate or negative view (x.conj(), x.imag): write into a resolved tensor instead"
    return None


def _byte_view(name: str, value: Any) -> Tuple[str, Tuple[int, ...], Optional[np.ndarray]]:
    """(dtype name, shape, writable uint8 numpy view of the memory) for a
    CPU contiguous tensor or array, or (dtype, shape, None) when its bytes
    cannot be viewed (a GPU or non-contiguous tensor: copied through torch)."""
    if type(value).__module__.startswith("torch"):
        import torch

        t = value.detach()
        dt = _torch_dtype_name(t, name)
        why = unwritable(t)
        if why is not None:
            raise ValueError(f"tensor {_quote(name)} {why}")
        if t.device.type == "cpu" and t.is_contiguous():
            return dt, tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy()
        return dt, tuple(t.shape), None
    if not isinstance(value, np.ndarray):
        raise TypeError(f"tensor {_quote(name)}: a {type(value).__name__}, want a torch tensor or numpy array")
    key = value.dtype
    npdt = _NP_TO_NAME.get(np.dtype(key)) if key.byteorder != ">" else None
    if npdt is None:
        raise TypeError(f"tensor {_quote(name)}: unsupported numpy dtype {value.dtype}")
    if not value.flags.writeable:
        raise ValueError(f"tensor {_quote(name)}: numpy array is read-only")
    if not value.flags.c_contiguous:
        raise ValueError(f"tensor {_quote(name)}: numpy array is not C-contiguous")
    return npdt, tuple(int(d) for d in value.shape), value.reshape(-1).view(np.uint8)


def _quote(value: Any) -> str:
    """repr(value) cut to 64 characters (with the full length), for error
    text about values someone else sent, and about tensor names, which may
    be as long as a header allows (16 MiB on the hub)."""
    r = repr(value)
    return r if len(r) <= 64 else f"{r[:64]}…({len(r)} characters)"


def _short(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."


def _state_dict(target: Any) -> Mapping[str, Any]:
    """The tensors of a pull_into target: an nn.Module's ``state_dict()``
    (whose tensors share the parameters' memory) or the mapping itself."""
    sd = target.state_dict() if callable(getattr(target, "state_dict", None)) else target
    if not isinstance(sd, Mapping):
        raise TypeError(f"pull_into target: a {type(target).__name__}, want an nn.Module or a dict of tensors")
    return sd


def _plan_key(sd: Mapping[str, Any], aliased: bool = False) -> Optional[Tuple[Any, ...]]:
    """What byte views of ``sd``'s tensors depend on: per tensor its name,
    memory address, dtype, shape, strides and device, in ``sd``'s order.
    None (never cached) unless every value is a torch tensor (a numpy
    array's views are cheap to rebuild, and its writeable flag can change)
    and, with ``aliased``, a contiguous CPU one without a conjugate or
    negative bit (whose bytes save_parts views in place rather than
    copies)."""
    key: List[Any] = []
    for k, v in sd.items():
        if not type(v).__module__.startswith("torch"):
            return None
        try:
            dev = v.device
            if aliased and (dev.type != "cpu" or not v.is_contiguous() or v.is_conj() or v.is_neg()):
                return None  # save_parts copies these: parts kept would go stale
            key.append((k, v.data_ptr(), v.dtype, v.shape, v.stride(), dev))
        except (RuntimeError, AttributeError):  # no storage (meta, sparse): no cache
            return None
    return tuple(key)


class PartsCache:
    """``save_parts`` of the last state dict seen, reused while its tensors
    are the same contiguous CPU memory with the same dtypes and shapes
    (``_plan_key``): the parts are the encoded header and views of that
    memory, so a reused answer sends the tensors' current values. ~20 µs a
    push for the learner loop's two tensors, against ~3 µs for the key. A
    tensor replaced, reallocated or reshaped makes new parts; other values
    (numpy, GPU, strided tensors, which save_parts may copy) are encoded
    every time.

    Parts are kept only once the same tensors come a second time in a row,
    and dropped at the first miss: the kept views hold their tensors'
    memory, and a caller that pushes fresh tensors every time (a module's
    ``.grad`` after ``zero_grad(set_to_none=True)``) would otherwise keep
    its previous gradient alive for nothing. Between misses only the key
    (numbers, no tensor) is held. Safe for concurrent use (an entry is
    replaced whole and always pairs parts with the key they were made
    from)."""

    __slots__ = ("_entry", "_seen")

    def __init__(self) -> None:
        self._entry: Optional[Tuple[Tuple[Any, ...], Tuple[bytes, List[memoryview]]]] = None
        self._seen: Optional[Tuple[Any, ...]] = None  # the last key, kept or not

    def get(self, state_dict: Mapping[str, Any]) -> Tuple[bytes, List[memoryview]]:
        """The parts of ``state_dict`` as save_parts returns them (the list
        is shared between calls: do not modify it)."""
        key = _plan_key(state_dict, aliased=True)
        e = self._entry
        if key is not None and e is not None and e[0] == key:
            return e[1]
        parts = save_parts(state_dict)
        self._entry = (key, parts) if key is not None and key == self._seen else None
        self._seen = key
        return parts


class TargetCache:
    """The Target of the last target seen, reused while every tensor the
    target's ``state_dict()`` returns is the same memory with the same
    dtype, shape, strides and device (``_plan_key``): rebuilding a Target
    costs ~20 µs for a two-tensor module (the torch byte views), checking
    the key ~2 µs. A tensor replaced, reallocated or reshaped between calls
    makes a new Target, so writes always land in the target's current
    tensors and a version that does not fit the current shapes is refused.
    A kept Target holds references to the tensors it writes, so, as
    ``PartsCache`` does, it is kept only once the same tensors come a second
    time in a row and dropped at the first miss (a caller that pulls into a
    fresh module every time keeps none alive). Not safe for concurrent use:
    each caller keeps its own."""

    __slots__ = ("_key", "_target", "_seen")

    def __init__(self) -> None:
        self._key: Optional[Tuple[Any, ...]] = None
        self._target: Optional[Target] = None
        self._seen: Optional[Tuple[Any, ...]] = None  # the last key, kept or not

    def get(self, target: Any) -> "Target":
        """The Target of ``target``'s tensors as they are now."""
        sd = _state_dict(target)
        key = _plan_key(sd)
        if key is not None and self._target is not None and key == self._key:
            return self._target
        t = Target(sd)
        keep = key is not None and key == self._seen
        self._key, self._target, self._seen = key, (t if keep else None), key
        return t


class Target:
    """Tensors a version is written into in place: an ``nn.Module`` (its
    ``state_dict()``, whose tensors share the parameters' memory) or a dict
    of torch tensors / writable numpy arrays."""

    def __init__(self, target: Any):
        self._tensors = dict(_state_dict(target))
        self._views = {k: _byte_view(k, v) for k, v in self._tensors.items()}
        # The torch tensors written through their byte views, behind
        # autograd's back (see written()).
        self._behind = [v for k, v in self._tensors.items()
                        if self._views[k][2] is not None and type(v).__module__.startswith("torch")]

    def written(self) -> None:
        """Tells autograd that the tensors were changed in place, as
        ``copy_`` (and so ``load_state_dict``) does: it bumps each torch
        tensor's version counter, which a ``state_dict()`` tensor shares
        with its parameter. A graph that saved the old values then refuses
        ``backward`` ("modified by an inplace operation") instead of
        computing a gradient with the new ones. Called after a version was
        written through the byte views: by :meth:`write`, and by the
        caller after a direct receive into :meth:`plan`'s views."""
        if self._behind:
            import torch

            for t in self._behind:
                torch.autograd.graph.increment_version(t)

    def write(self, blob: Any, *, what: str = "version") -> None:
        """Checks that ``blob`` (safetensors) has exactly the target's names,
        dtypes and shapes, then copies every tensor in; on a mismatch raises
        ``errors.InvalidArgument`` naming it and writes nothing."""
        buf = memoryview(blob).cast("B")
        start, header = self._check(buf, len(buf), what)
        src = np.frombuffer(buf, np.uint8)
        for k, (dt, shape, view) in self._views.items():
            b, e = header[k]["data_offsets"]
            if view is not None:
                view[:] = src[start + b:start + e]
            else:  # GPU or strided: through torch
                t = self._tensors[k]
                t.detach().copy_(_to_torch_view(src[start + b:start + e], dt, shape))
        self.written()

    def plan(self, take: Callable[[int], bytes], n: int, *,
             what: str = "version") -> Tuple[bytes, Optional[List[memoryview]]]:
        """Receives a version straight into the tensors (rlhub._bulk.Direct):
        reads the n-byte version's safetensors header with ``take(k)``,
        checks it as :meth:`write` does (raising the same error, nothing
        written), and returns (the bytes read, the tensors' memory in the
        order of their data), or views None when a tensor has no byte view
        (GPU or strided: the caller stages the version and calls write)."""
        from rlhub import errors

        if n < 8:
            raise errors.InvalidArgument(f"{what}: safetensors: too short for the header length")
        head = take(8)
        (hl,) = struct.unpack("<Q", head)
        if hl > MAX_HEADER_BYTES or hl > n - 8:
            raise errors.InvalidArgument(f"{what}: safetensors: header length {hl} out of bounds")
        head += take(hl)
        _, header = self._check(memoryview(head), n, what)
        views = [self._views[k][2] for _, k in sorted((header[k]["data_offsets"][0], k) for k in header)]
        out = [v.data for v in views if v is not None]  # flat uint8 views
        return head, (out if len(out) == len(views) else None)

    def _check(self, buf: memoryview, total: int, what: str) -> Tuple[int, Dict[str, Any]]:
        """(data start, tensors) of a safetensors file of ``total`` bytes
        whose header is in ``buf``, when it has exactly the target's names,
        dtypes and shapes; else ``errors.InvalidArgument`` naming them."""
        from rlhub import errors

        try:
            start, header, _ = parse_header(buf, total)
        except ValueError as err:
            raise errors.InvalidArgument(f"{what}: {err}") from None
        diffs = []
        for k in header.keys() - self._views.keys():
            diffs.append(f"{_short(k)!r} is not in the target")
        for k in self._views.keys() - header.keys():
            diffs.append(f"target's {_short(k)!r} is missing")
        for k, (dt, shape, _) in self._views.items():
            info = header.get(k)
            if info is not None and (info["dtype"] != dt or tuple(info["shape"]) != shape):
                diffs.append(f"{_short(k)!r} is {info['dtype']}{list(info['shape'])[:8]}, "
                             f"the target's {dt}{list(shape)[:8]}")
        if diffs:
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise errors.InvalidArgument(f"{what} does not fit the target: {'; '.join(sorted(diffs)[:3])}{more}")
        return start, header


def _to_torch_view(raw: np.ndarray, dt: str, shape: Tuple[int, ...]) -> "torch.Tensor":
    """A torch view (no copy) of little-endian bytes as dtype ``dt``."""
    import torch

    if raw.size == 0:
        return torch.empty(shape, dtype=_torch_dtype(dt))
    return torch.from_numpy(raw).view(_torch_dtype(dt)).reshape(shape)
