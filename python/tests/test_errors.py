import grpc

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
