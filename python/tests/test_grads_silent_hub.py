"""GradClient over the data plane on a silent secondary: a real listener
that accepts connections and sends nothing, or stops mid-handshake (a hung
or SIGSTOPped hub), listed by a real gRPC Reducer as the only secondary. A
push stops dialling it at the second handshake with no answer, rather than
at its ``deadline``, and says why."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
import torch

import rlhub
from rlhub import _bulk
from rlhub._proto.rlhub.v1 import reducer_pb2, reducer_pb2_grpc
from rlhub.grads import GradClient
from test_silent_hub import _counting_hub
from test_store_silent_hub import CASES


class ListsOne(reducer_pb2_grpc.ReducerServicer):
    """A primary whose only secondary is at ``addr``."""

    def __init__(self, addr: str):
        self.addr = addr

    def Secondaries(self, request, context):
        return reducer_pb2.ReducerSecondariesResponse(
            secondaries=[reducer_pb2.ReducerSecondary(addr=self.addr, id="silent")])


@pytest.mark.parametrize("first,says", CASES[:2], ids=["silent", "half-sent"])
def test_a_silent_secondary_is_not_dialled_again_and_again(first, says, monkeypatch):
    # Each handshake to the silent secondary failed Unavailable; the push
    # marked it dead, listed the secondaries again, got it back and dialled
    # it again until its deadline (120 s by default: twelve 10 s
    # handshakes). Now the second silent handshake to the address ends the
    # push. The handshake's bound is shortened and the deadline is short so
    # the old behaviour ends too; the connections accepted are counted.
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 0.3)
    addr, close, dials = _counting_hub(first)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    reducer_pb2_grpc.add_ReducerServicer_to_server(ListsOne(addr), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with GradClient(f"127.0.0.1:{port}", deadline=5) as g:
            with pytest.raises(rlhub.Unavailable) as e:
                g.push("m", 1, {"w": torch.ones(4)})
        assert len(dials) == 2, f"push dialled a silent secondary {len(dials)} times"
        msg = str(e.value)
        assert addr in msg and says in msg and "not tried again" in msg, msg
    finally:
        server.stop(None)
        close()
