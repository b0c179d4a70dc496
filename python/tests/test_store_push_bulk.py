"""Store pushes on the hub's data plane (one sendmsg from the tensors'
memory), and over gRPC against a hub without them, against the real binary:
the same versions land, every refusal keeps its kind and changes nothing."""

from __future__ import annotations

import socket
import struct
import threading

import numpy as np
import pytest
import torch

import rlhub
from rlhub import _bulk, errors
from rlhub.tensors import save_bytes

from conftest import Hub


@pytest.mark.parametrize("extra", [(), ("--no-store-data-plane",)], ids=["data-plane", "grpc-fallback"])
def test_push_lands_and_refusals_change_nothing(rlhub_bin, tmp_path, extra):
    h = Hub(rlhub_bin, tmp_path, extra=extra)
    try:
        with rlhub.StoreClient(h.addr, retries=1) as sc:
            g = torch.Generator().manual_seed(1)
            sd = {"w": torch.randn(300, 70, generator=g), "b": np.arange(5, dtype=np.int64),
                  "h": torch.randn(9, generator=g).half(), "t": torch.randn(4, 6, generator=g).t()}  # t: not contiguous
            info = sc.push("m", sd, version=1, expect=0, metadata={"step": "1"})
            want1 = save_bytes(sd, {"step": "1"})
            assert (info.name, info.version, info.bytes) == ("m", 1, len(want1))
            assert bytes(sc.pull("m").blob) == want1

            blob2 = save_bytes({"w": torch.ones(3)})
            assert sc.push("m", memoryview(blob2), version=2, expect=1).version == 2
            assert bytes(sc.pull("m").blob) == blob2
            pushed = 2

            bad = bytearray(blob2)
            struct.pack_into("<Q", bad, 0, len(bad))  # a header longer than the blob
            for args, kw, exc in [
                (("m", sd), dict(version=2), errors.StaleVersion),           # not newer
                (("m", sd), dict(version=3, expect=1), errors.StaleVersion),  # expect mismatch
                (("m", bytes(bad)), dict(version=3), errors.InvalidArgument),
                (("m", b"tiny"), dict(version=3), errors.InvalidArgument),
                (("no spaces", sd), dict(version=1), errors.InvalidArgument),
            ]:
                with pytest.raises(exc):
                    sc.push(*args, **kw)
                pushed += 1
                got = sc.pull("m")
                assert got.version == 2 and bytes(got.blob) == blob2, kw

            on_dp = not extra
            assert sc.stats["push_bulk"] == (pushed if on_dp else 0), sc.stats
            assert sc.stats["push_grpc"] == (0 if on_dp else pushed), sc.stats
    finally:
        h.stop()


def test_grpc_only_client_pushes_over_grpc(hub):
    with rlhub.StoreClient(hub.addr, transport="grpc") as sc:
        blob = save_bytes({"w": np.ones(4, np.float32)})
        sc.push("m", blob, version=1)
        assert bytes(sc.pull("m").blob) == blob
        assert sc.stats["push_grpc"] == 1 and sc.stats["push_bulk"] == 0


def test_an_ok_answer_of_another_type_is_an_error_quoted_bounded():
    """A server answering a push OK with a response of another type (its
    type URL 3 MiB long) fails the push with an error that quotes the type
    bounded, not the whole URL."""
    from google.rpc import status_pb2

    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(4)

    def serve():
        c, _ = lis.accept()
        with c:
            try:
                c.recv(64)  # magic and token
                c.sendall(_bulk.MAGIC)
                c.recv(1 << 16)  # the request frame
                c.sendall(b"\x02")  # continue
                c.settimeout(0.5)
                try:
                    while c.recv(1 << 16):  # the body
                        pass
                except OSError:
                    pass
                st = status_pb2.Status(code=0)
                st.details.add(type_url="type.googleapis.com/" + "x" * (3 << 20))
                raw = st.SerializeToString()
                c.sendall(struct.pack("<BI", 3, len(raw)) + raw)
                c.recv(1)  # until the client hangs up
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with rlhub.StoreClient(f"127.0.0.1:{lis.getsockname()[1]}", timeout=20, retries=0) as sc:
            with pytest.raises(rlhub.errors.RlhubError) as ei:
                sc.push("m", {"w": np.zeros(4, np.float32)}, version=1)
        assert "answered with a" in str(ei.value) and "type.googleapis.com/xxx" in str(ei.value)
        assert len(str(ei.value)) < 1000, len(str(ei.value))
    finally:
        lis.close()
        t.join(10)
