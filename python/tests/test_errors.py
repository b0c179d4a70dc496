import grpc
import pytest

import rlhub


class FakeRpcError(grpc.RpcError):
    """A grpc.RpcError as a failed call raises it: code, details, trailers."""

    def __init__(self, code, details, trailers=()):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


def test_codes_map_to_named_exceptions():
    cases = {
        grpc.StatusCode.INVALID_ARGUMENT: rlhub.InvalidArgument,
        grpc.StatusCode.NOT_FOUND: rlhub.NotFound,
        grpc.StatusCode.FAILED_PRECONDITION: rlhub.StaleVersion,
        grpc.StatusCode.RESOURCE_EXHAUSTED: rlhub.QueueFull,
        grpc.StatusCode.UNAUTHENTICATED: rlhub.Unauthenticated,
        grpc.StatusCode.PERMISSION_DENIED: rlhub.PermissionDenied,
        grpc.StatusCode.UNAVAILABLE: rlhub.Unavailable,
        grpc.StatusCode.DEADLINE_EXCEEDED: rlhub.DeadlineExceeded,
    }
    for code, cls in cases.items():
        e = rlhub.from_rpc_error(FakeRpcError(code, "boom"))
        assert type(e) is cls and e.message == "boom" and e.code == code
        assert isinstance(e, rlhub.RlhubError)
    e = rlhub.from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, "x"))
    assert type(e) is rlhub.RlhubError and e.code == grpc.StatusCode.INTERNAL


def test_stale_version_carries_current_version():
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    info = error_details_pb2.ErrorInfo(reason="STALE_VERSION", domain="rlhub",
                                       metadata={"model": "pol", "current_version": "7", "current_epoch": "2"})
    detail = any_pb2.Any()
    detail.Pack(info)
    st = status_pb2.Status(code=9, message="stale", details=[detail])
    e = rlhub.from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "stale",
                                          (("grpc-status-details-bin", st.SerializeToString()),)))
    assert isinstance(e, rlhub.StaleVersion)
    assert (e.model, e.current_version, e.current_epoch) == ("pol", 7, 2)


def _status_peer(status: bytes):
    """A data-plane peer on loopback that speaks the handshake, then answers
    every request with the final status ``status`` (what a hostile or buggy
    peer may send: the data plane carries statuses up to 4 MiB)."""
    import socket
    import struct
    import threading

    from rlhub import _bulk

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)

    def exact(c, n):
        b = b""
        while len(b) < n:
            k = c.recv(n - len(b))
            if not k:
                raise EOFError
            b += k
        return b

    def serve(c):
        with c:
            try:
                assert exact(c, 8) == _bulk.MAGIC
                (tl,) = struct.unpack("<H", exact(c, 2))
                exact(c, tl)
                c.sendall(_bulk.MAGIC)
                while True:
                    assert exact(c, 1)[0] == 1
                    (ml,) = struct.unpack("<H", exact(c, 2))
                    exact(c, ml)
                    (hl,) = struct.unpack("<I", exact(c, 4))
                    exact(c, hl)
                    c.sendall(struct.pack("<BI", 3, len(status)) + status)
            except (EOFError, OSError, AssertionError):
                pass

    def accept():
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls, "127.0.0.1:%d" % ls.getsockname()[1]


def test_a_peers_long_status_message_is_bounded():
    """A 3 MiB status message becomes an exception of a few KiB that says
    how long it was, not a 3 MiB one logged on every retry."""
    from google.rpc import status_pb2

    ls, addr = _status_peer(status_pb2.Status(code=3, message="x" * (3 << 20)).SerializeToString())
    try:
        with rlhub.StoreClient(addr, timeout=5) as store:
            with pytest.raises(rlhub.InvalidArgument) as ei:
                store.pull("policy")
    finally:
        ls.close()
    msg = str(ei.value)
    assert len(msg) < 8 << 10 and f"({3 << 20} characters)" in msg, len(msg)


def test_a_malformed_stale_version_detail_is_still_a_named_error():
    """A STALE_VERSION detail whose current version is not a number gives a
    StaleVersion without it, not a ValueError the caller's handler misses."""
    import numpy as np
    from google.rpc import error_details_pb2, status_pb2

    st = status_pb2.Status(code=9, message="stale")  # FAILED_PRECONDITION
    st.details.add().Pack(error_details_pb2.ErrorInfo(reason="STALE_VERSION",
                                                      metadata={"current_version": "not-a-number", "current_epoch": "9" * 40}))
    ls, addr = _status_peer(st.SerializeToString())
    try:
        with rlhub.StoreClient(addr, timeout=5) as store:
            with pytest.raises(rlhub.StaleVersion) as ei:
                store.push("policy", {"w": np.zeros(2, np.float32)}, version=2)
    finally:
        ls.close()
    assert ei.value.current_version is None and ei.value.current_epoch is None
