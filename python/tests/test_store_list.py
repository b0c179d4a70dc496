"""StoreClient.list over a hub that answers List a page at a time."""

from concurrent import futures

import grpc
import numpy as np
import pytest

import rlhub
from rlhub._proto.rlhub.v1 import store_pb2, store_pb2_grpc


def test_list_pages_every_model_once_in_order(hub):
    names = [f"p/m{i:03d}" for i in range(23)]
    tiny = {"w": np.zeros(1, np.float32)}
    with rlhub.StoreClient(hub.addr) as s:
        for n in reversed(names):
            s.push(n, tiny, version=1)
        # The hub honours the page size: 4 models and a token for the next.
        with grpc.insecure_channel(hub.addr) as ch:
            first = store_pb2_grpc.ModelStoreStub(ch).List(store_pb2.StoreListRequest(page_size=4), timeout=10)
        assert [m.name for m in first.models] == names[:4] and first.next_page_token
        for size in (4, 1, 0):
            infos = s.list(page_size=size)
            assert [m.name for m in infos] == names, size
            assert all(m.version == 1 for m in infos)
        assert [m.name for m in s.list()] == names
        with pytest.raises(rlhub.InvalidArgument):
            s.list(page_size=-1)


class _Stuck(store_pb2_grpc.ModelStoreServicer):
    """A ModelStore whose List never reaches a last page."""

    def __init__(self, empty: bool):
        self.empty = empty
        self.calls = 0

    def List(self, request, context):
        self.calls += 1
        if self.empty:
            return store_pb2.StoreListResponse(next_page_token=f"t{self.calls}")
        return store_pb2.StoreListResponse(models=[store_pb2.StoreModelInfo(name="m", version=1)],
                                           next_page_token="same")


@pytest.mark.parametrize("empty", [False, True])
def test_list_refuses_pages_that_do_not_advance(empty):
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    stuck = _Stuck(empty)
    store_pb2_grpc.add_ModelStoreServicer_to_server(stuck, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        with rlhub.StoreClient(f"127.0.0.1:{port}", timeout=10, transport="grpc") as s:
            with pytest.raises(rlhub.RlhubError, match="protocol"):
                s.list()
        assert stuck.calls <= 2
    finally:
        srv.stop(None)
