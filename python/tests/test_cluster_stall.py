"""A primary whose connection stalls, as one cut off by a partition does
(nothing resets it; gRPC keeps it READY until a keepalive goes
unanswered): a call that runs out its deadline there makes the following
channel look the primary up before its next call, which then goes to the
new primary instead of onto the stalled connection. Two scripted servers
speak the Cluster/Primary contract; the lab tests (internal/replica,
partition_lab_test.go) run the real thing in Go.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any, Tuple

import grpc
import pytest

from rlhub import _channel
from rlhub._proto.rlhub.v1 import cluster_pb2, cluster_pb2_grpc, store_pb2, store_pb2_grpc


class _Cluster(cluster_pb2_grpc.ClusterServicer):
    def __init__(self) -> None:
        self.answer: Tuple[str, int] = ("", 0)
        self.me = ""

    def Primary(self, request: Any, context: Any) -> Any:
        addr, epoch = self.answer
        return cluster_pb2.PrimaryResponse(address=addr, epoch=epoch, self=addr == self.me)


class _Store(store_pb2_grpc.ModelStoreServicer):
    def __init__(self, stall: bool) -> None:
        self.stall, self.calls, self.release = stall, 0, threading.Event()

    def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.stall:
            self.release.wait(60)  # a stalled connection: no answer
        return store_pb2.StoreListResponse()


def _serve(store: _Store) -> Tuple[Any, _Cluster, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    cl = _Cluster()
    cluster_pb2_grpc.add_ClusterServicer_to_server(cl, server)
    store_pb2_grpc.add_ModelStoreServicer_to_server(store, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    cl.me = f"127.0.0.1:{port}"
    return server, cl, cl.me


def test_timed_out_call_looks_the_primary_up_again() -> None:
    stalled, fresh = _Store(stall=True), _Store(stall=False)
    s1, c1, old = _serve(stalled)
    s2, c2, new = _serve(fresh)
    c1.answer = c2.answer = (old, 3)
    ch = _channel.channel(old + "," + new)
    try:
        stub = store_pb2_grpc.ModelStoreStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.List(store_pb2.StoreListRequest(), timeout=0.5)
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert stalled.calls == 1
        c1.answer = c2.answer = (new, 4)  # elected while the old one's connection stalls
        stub.List(store_pb2.StoreListRequest(), timeout=20)
        assert stalled.calls == 1, "the next call went onto the stalled connection again"
        assert fresh.calls == 1
    finally:
        stalled.release.set()
        ch.close()
        s1.stop(None)
        s2.stop(None)


@pytest.mark.parametrize("bad", ["h" * (1 << 20) + ":1", "bad host:1"])
def test_an_absurd_primary_address_names_no_primary(bad: str) -> None:
    """A hub answering Cluster/Primary with an address a refusal could not
    name (1 MiB long, or holding white space) under a newer epoch names no
    primary, as in a refusal: the client follows the primary another hub
    names instead of dialling that address, and no error quotes it."""
    liar, good = _Store(stall=False), _Store(stall=False)
    s1, c1, a1 = _serve(liar)
    s2, c2, a2 = _serve(good)
    c1.answer = (bad, 9)
    c2.answer = (a2, 3)
    ch = _channel.channel(a1 + "," + a2)
    try:
        assert ch.resolve(5.0) == (a2, 3)
        store_pb2_grpc.ModelStoreStub(ch).List(store_pb2.StoreListRequest(), timeout=10)
        assert good.calls == 1
    finally:
        ch.close()
        s1.stop(None)
        s2.stop(None)
