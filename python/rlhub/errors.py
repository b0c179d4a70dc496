"""Named exceptions for rlhub errors.

The Go side maps its error conditions to gRPC status codes in one table
(internal/errs); this module maps the same codes back, so callers can write
``except rlhub.StaleVersion as e: e.current_version``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple, Union, cast

import grpc

if TYPE_CHECKING:
    from google.rpc import status_pb2


class RlhubError(Exception):
    """Base class of every rlhub error. ``code`` is the gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(RlhubError):
    """Malformed input: bad tensor bytes, wrong shape or dtype, NaN/Inf."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RlhubError):
    """Unknown model, version, learner or job."""

    code = grpc.StatusCode.NOT_FOUND


class StaleVersion(RlhubError):
    """A stale or conflicting version or epoch.

    ``current_version`` and ``current_epoch`` say what the server holds,
    when it said so.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, *, model: str = "",
                 current_version: Optional[int] = None,
                 current_epoch: Optional[int] = None):
        super().__init__(message, code)
        self.model = model
        self.current_version = current_version
        self.current_epoch = current_epoch


class AlreadyExists(RlhubError):
    code = grpc.StatusCode.ALREADY_EXISTS


class QueueFull(RlhubError):
    """A bounded queue or size limit is exhausted; back off and retry."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(RlhubError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(RlhubError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(RlhubError):
    """The peer is down or failing over; retry, possibly elsewhere."""

    code = grpc.StatusCode.UNAVAILABLE


class Aborted(RlhubError):
    code = grpc.StatusCode.ABORTED


class DeadlineExceeded(RlhubError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, StaleVersion, AlreadyExists, QueueFull,
                Unauthenticated, PermissionDenied, Unavailable, Aborted, DeadlineExceeded)
}


_CODE_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


PERMANENT_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
})
"""Codes a retry of the same request cannot change: the request or the
caller's identity is refused (the Go side's ``grpcerr.Permanent``). Retry
loops give these back to their caller instead of trying again."""


UINT64_MAX = (1 << 64) - 1


def check_version(field: str, value: int) -> int:
    """``value`` as a version field (an unsigned 64-bit number), or
    ``InvalidArgument`` naming ``field``: what protobuf would refuse with a
    bare ``ValueError`` that names neither. The value is not echoed past
    24 characters."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT64_MAX:
        shown = repr(value)
        if len(shown) > 24:
            shown = shown[:24] + "…"
        raise InvalidArgument(f"{field} must be a whole number from 0 to 2**64-1, not {shown}")
    return value


def is_permanent(err: BaseException) -> bool:
    """Whether ``err`` (a named rlhub exception or a ``grpc.RpcError``)
    carries one of :data:`PERMANENT_CODES`."""
    if isinstance(err, RlhubError):
        return err.code in PERMANENT_CODES
    if isinstance(err, grpc.RpcError):
        code = getattr(err, "code", None)
        return callable(code) and code() in PERMANENT_CODES
    return False


def _status_of(err: grpc.RpcError) -> Optional["status_pb2.Status"]:
    """The ``google.rpc.Status`` a failed call carries in its trailers, or None."""
    try:
        from google.rpc import status_pb2
    except ImportError:  # googleapis-common-protos not installed
        return None
    # grpc's trailers are (key, value) named tuples; types-grpcio calls them
    # _Metadatum, which it does not let unpack.
    trailers = cast("Iterable[Tuple[str, Union[str, bytes]]]", err.trailing_metadata() or ())
    for key, value in trailers:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return None


def _stale_metadata(st: Optional["status_pb2.Status"]) -> Dict[str, str]:
    """The metadata of a ``google.rpc.Status``'s STALE_VERSION ErrorInfo detail."""
    if st is None:
        return {}
    try:
        from google.rpc import error_details_pb2
    except ImportError:
        return {}
    for d in st.details:
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info) and info.reason == "STALE_VERSION":
            return dict(info.metadata)
    return {}


MAX_MESSAGE = 4096
"""How much of a peer's status message an exception keeps: over the data
plane a status may be 4 MiB, and the message is logged on every retry."""


def _number(md: Dict[str, str], key: str) -> Optional[int]:
    """A version or epoch from a peer's error details; None when absent or
    not a plain number (a malformed detail must not turn the named error
    into a ValueError that the caller's ``except RlhubError`` misses)."""
    v = md.get(key, "")
    return int(v) if v.isdigit() and len(v) <= 20 else None


def _make(code: grpc.StatusCode, message: str, st: Optional["status_pb2.Status"]) -> RlhubError:
    """The named exception for ``code``; ``st`` is the full status (or None)."""
    cls = _BY_CODE.get(code, RlhubError)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"…({len(message)} characters)"
    if cls is StaleVersion:
        md = _stale_metadata(st)
        return StaleVersion(
            message,
            model=md.get("model", "")[:MAX_MESSAGE],
            current_version=_number(md, "current_version"),
            current_epoch=_number(md, "current_epoch"),
        )
    return cls(message, code)


# What a plaintext channel to a hub that serves TLS reports: the hub closes
# the connection at the first bytes, which are not a TLS handshake.
_CLOSED_AT_CONNECT = re.compile(r"failed to connect to all addresses.*Socket closed")
_TLS_HINT = (" (the hub closed the connection before answering; if it serves TLS, pass its CA:"
             " rlhub.Security(ca=...) or RLHUB_TLS_CA)")
# What gRPC reports when it gave up on a connection at its connect deadline
# because the server's preface (its SETTINGS frame) never came: the hub did
# not close it, it accepted it and sent nothing (or stopped mid-frame), so
# the hint says that, not the TLS one (as the Go side's internal/dial).
_SILENT_AT_CONNECT = re.compile(r"failed to connect to all addresses.*timed out before receiving SETTINGS")
_SILENT_HINT = (" (the hub accepted the connection but sent nothing within the connect timeout:"
                " it is hung or stopped, or the address is not a hub's)")


def from_rpc_error(err: grpc.RpcError) -> RlhubError:
    """Converts a ``grpc.RpcError`` into the matching named exception."""
    code = err.code()
    message = err.details() or str(code)
    if code == grpc.StatusCode.UNAVAILABLE:
        if _SILENT_AT_CONNECT.search(message):
            message += _SILENT_HINT
        elif _CLOSED_AT_CONNECT.search(message):
            message += _TLS_HINT
    return _make(code, message, _status_of(err) if _BY_CODE.get(code) is StaleVersion else None)


def from_status(st: "status_pb2.Status") -> RlhubError:
    """Converts a non-OK ``google.rpc.Status`` (as the hub's data plane
    answers, with the same code, message and details a gRPC call would
    carry) into the same named exception ``from_rpc_error`` gives."""
    code = _CODE_BY_NUMBER.get(st.code, grpc.StatusCode.UNKNOWN)
    return _make(code, st.message or str(code), st)
