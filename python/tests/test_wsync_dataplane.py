"""Push fan-out on the data plane from Python: ``rlhub.wsync.DataPlaneSource``
against the real binary — every version in order into a module, a skip
reported, the version the collector runs visible in `rlhub sync status`,
the gRPC push stream against a hub without the method, and a version cut off
mid-body an error that changes nothing."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch

import rlhub
import rlhub.wsync as ws
from rlhub import _bulk
from rlhub._proto.rlhub.v1 import store_pb2, sync_pb2
from conftest import Hub


def filled(module: torch.nn.Module, value: float) -> dict:
    return {k: torch.full_like(t, value) for k, t in module.state_dict().items()}


def status_row(hub, model: str, cid: str) -> list:
    out = hub.run_cli("sync", "status", "--hub", hub.addr, "--model", model).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == cid:
            return f
    raise AssertionError(f"collector {cid} not in status:\n{out}")


def test_data_plane_source_applies_every_version_in_order_and_reports(hub):
    m = torch.nn.Linear(64, 32)
    seen = []
    with rlhub.StoreClient(hub.addr) as store, \
            ws.Receiver(m, ws.DataPlaneSource(hub.addr, "pol", collector_id="py-dp")) as r:
        for v in range(1, 7):
            store.push("pol", filled(m, float(v)), version=v)
            assert r.wait(timeout=30), f"version {v} did not arrive"
            seen.append(r.version)
            assert torch.equal(m.weight, torch.full((32, 64), float(v))) and torch.equal(m.bias, torch.full((32,), float(v)))
        assert seen == [1, 2, 3, 4, 5, 6]
        src = r.source
        assert src.transport == "dataplane" and src.stats["versions"] == 6 and src.stats["skipped"] == 0
        assert not r.wait(timeout=0.3)  # nothing newer: a no-op
        # The hub learns the version from each poll: the collector runs 6.
        for _ in range(100):
            row = status_row(hub, "pol", "py-dp")
            if row[1] == "6":
                break
            time.sleep(0.05)
        assert row[1:4] == ["6", "0", "push-dp"], row
        # A slow collector gets the newest, and the skip is counted.
        for v in (7, 8, 9):
            store.push("pol", filled(m, float(v)), version=v)
        assert r.wait(timeout=30) and r.version == 9
        assert src.stats["skipped"] == 2
        assert torch.equal(m.weight, torch.full((32, 64), 9.0))
        # get_if_newer: "not modified" is None, a newer version comes at once.
        assert r.poll() is False
        store.push("pol", filled(m, 10.0), version=10)
        assert r.poll() and r.version == 10


def test_data_plane_source_falls_back_to_the_push_stream(rlhub_bin, tmp_path):
    hub = Hub(rlhub_bin, tmp_path, extra=["--no-store-data-plane"])
    try:
        m = torch.nn.Linear(8, 3)
        with rlhub.StoreClient(hub.addr) as store, \
                ws.Receiver(m, ws.DataPlaneSource(hub.addr, "pol", collector_id="py-fb")) as r:
            for v in (1, 2, 3):
                store.push("pol", filled(m, float(v)), version=v)
                assert r.wait(timeout=30) and r.version == v
                assert torch.equal(m.weight, torch.full((3, 8), float(v)))
            assert r.source.transport == "grpc" and r.source.stats["fallback"] == 1
        with pytest.raises(rlhub.Unavailable, match="fallback off"):
            ws.DataPlaneSource(hub.addr, "pol", fallback=False).wait_newer(0, timeout=5)
    finally:
        hub.stop()


def _cutting_server(blobs: dict, cut_at: int):
    """A fake hub data plane: answers poll k with version k+1 of ``blobs``,
    whole except poll ``cut_at``, whose body stops halfway and the
    connection closes. Records each poll's SyncHello.version."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(8)
    afters = []
    step = [0]
    stop = threading.Event()

    def recv_exact(c, n):
        b = b""
        while len(b) < n:
            k = c.recv(n - len(b))
            if not k:
                raise OSError("closed")
            b += k
        return b

    def serve():
        while not stop.is_set():
            try:
                c, _ = lis.accept()
            except OSError:
                return
            with c:
                try:
                    recv_exact(c, 8)
                    (tl,) = struct.unpack("<H", recv_exact(c, 2))
                    recv_exact(c, tl)
                    c.sendall(_bulk.MAGIC)
                    while True:
                        recv_exact(c, 1)
                        (ml,) = struct.unpack("<H", recv_exact(c, 2))
                        recv_exact(c, ml)
                        (hl,) = struct.unpack("<I", recv_exact(c, 4))
                        hello = sync_pb2.SyncHello.FromString(recv_exact(c, hl))
                        afters.append(hello.version)
                        step[0] += 1
                        v = step[0]
                        if v not in blobs:
                            break
                        blob = blobs[v]
                        hdr = store_pb2.StorePullHeader()
                        hdr.blob.model, hdr.blob.version, hdr.blob.total_bytes = "m", v, len(blob)
                        hb = hdr.SerializeToString()
                        frame = struct.pack("<BI", 4, len(hb)) + hb + struct.pack("<Q", len(blob))
                        if v == cut_at:
                            c.sendall(frame + blob[:len(blob) // 2])
                            break
                        c.sendall(frame + blob + struct.pack("<BI", 3, 0))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close():
        stop.set()
        lis.close()
        t.join(10)

    return f"127.0.0.1:{lis.getsockname()[1]}", afters, close


def test_a_version_cut_off_mid_body_is_an_error_and_changes_nothing():
    blobs = {v: bytes(rlhub.save_bytes({"w": np.full(100_000, float(v), np.float32)})) for v in (1, 2, 3)}
    addr, afters, close = _cutting_server(blobs, cut_at=2)
    try:
        target = {"w": torch.zeros(100_000)}
        with ws.Receiver(target, ws.DataPlaneSource(addr, "m", fallback=False)) as r:
            assert r.wait(timeout=20) and r.version == 1
            with pytest.raises(rlhub.Unavailable):
                r.wait(timeout=20)
            assert r.version == 1 and (target["w"] == 1.0).all(), "a cut-off version changed the module"
            assert r.wait(timeout=20) and r.version == 3 and (target["w"] == 3.0).all()
        assert afters == [0, 1, 1], afters  # after the cut it asked again after 1
    finally:
        close()
