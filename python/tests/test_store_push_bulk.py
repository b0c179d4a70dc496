"""Store pushes on the hub's data plane (one sendmsg from the tensors'
memory), and over gRPC against a hub without them, against the real binary:
the same versions land, every refusal keeps its kind and changes nothing."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

import rlhub
from rlhub import errors
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
