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


def _status_peer(st):
    """A data-plane peer on loopback (test_grads_bulk's scripted server)
    that answers every request with the final status ``st``: what a
    hostile or buggy peer may send (the data plane carries statuses up to
    4 MiB)."""
    from test_grads_bulk import Listener, final, handshake, read_request

    def serve(c):
        handshake(c)
        while True:
            read_request(c)
            final(c, st)

    return Listener(serve)


def test_a_peers_long_status_message_is_bounded():
    """A 3 MiB status message becomes an exception of a few KiB that says
    how long it was, not a 3 MiB one logged on every retry."""
    from google.rpc import status_pb2

    peer = _status_peer(status_pb2.Status(code=3, message="x" * (3 << 20)))
    try:
        with rlhub.StoreClient(peer.addr, timeout=5) as store:
            with pytest.raises(rlhub.InvalidArgument) as ei:
                store.pull("policy")
    finally:
        peer.close()
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
    peer = _status_peer(st)
    try:
        with rlhub.StoreClient(peer.addr, timeout=5) as store:
            with pytest.raises(rlhub.StaleVersion) as ei:
                store.push("policy", {"w": np.zeros(2, np.float32)}, version=2)
    finally:
        peer.close()
    assert ei.value.current_version is None and ei.value.current_epoch is None
