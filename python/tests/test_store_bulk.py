"""Store pulls and watches on the hub's data plane, and in-place updates
(StoreClient.pull_into / watch_into), against the real binary."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import threading
import time
import tracemalloc

import grpc
import numpy as np
import pytest
import torch

import rlhub
from rlhub import _bulk, _channel
from rlhub._proto.rlhub.v1 import store_pb2
from rlhub.tensors import save_bytes

from conftest import Hub


@pytest.fixture
def hub_no_dp(rlhub_bin, tmp_path):
    h = Hub(rlhub_bin, tmp_path, extra=("--no-store-data-plane",))
    yield h
    h.stop()


def _all_dtypes():
    """One tensor of every dtype the store takes that this torch has."""
    g = torch.Generator().manual_seed(3)
    out = {
        "bool": torch.rand(5, generator=g) > 0.5,
        "u8": torch.randint(0, 255, (3, 4), dtype=torch.uint8, generator=g),
        "i8": torch.randint(-128, 127, (7,), dtype=torch.int8, generator=g),
        "i16": torch.randint(-30000, 30000, (2, 3), dtype=torch.int16, generator=g),
        "i32": torch.randint(-2**31, 2**31 - 1, (4,), dtype=torch.int32, generator=g),
        "i64": torch.randint(-2**62, 2**62, (2, 2), dtype=torch.int64, generator=g),
        "f16": torch.randn(3, 3, generator=g).half(),
        "bf16": torch.randn(5, generator=g).bfloat16(),
        "f32": torch.randn(4, 2, generator=g),
        "f64": torch.randn(3, generator=g).double(),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    for attr in ("uint16", "uint32", "uint64"):
        if hasattr(torch, attr):
            out[attr] = torch.randint(0, 200, (3,), dtype=torch.int64, generator=g).to(getattr(torch, attr))
    for attr in ("float8_e5m2", "float8_e4m3fn"):
        if hasattr(torch, attr):
            out[attr] = torch.randn(6, generator=g).to(getattr(torch, attr))
    if hasattr(torch, "complex64"):
        out["c64"] = torch.randn(3, dtype=torch.complex64, generator=g)
    return out


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("extra", [(), ("--no-store-data-plane",)], ids=["data-plane", "grpc-fallback"])
def test_pull_into_round_trips_every_dtype(rlhub_bin, tmp_path, extra):
    h = Hub(rlhub_bin, tmp_path, extra=extra)
    try:
        src = _all_dtypes()
        with rlhub.StoreClient(h.addr, retries=1) as sc:
            sc.push("all", src, version=1, expect=0)
            dst = {k: torch.zeros_like(v) for k, v in src.items()}
            ptrs = {k: v.data_ptr() for k, v in dst.items()}
            assert sc.pull_into("all", dst) == 1
            for k in src:
                assert dst[k].data_ptr() == ptrs[k], f"{k} was replaced, not written into"
                assert _raw(dst[k]) == _raw(src[k]), k
            # numpy targets too (the dtypes numpy has)
            npd = {k: np.zeros(tuple(v.shape), v.numpy().dtype) for k, v in src.items()
                   if v.dtype not in (torch.bfloat16,) and not str(v.dtype).startswith("torch.float8")}
            sub = {k: src[k] for k in npd}
            sc.push("np", sub, version=1, expect=0)
            assert sc.pull_into("np", npd) == 1
            for k in npd:
                assert npd[k].tobytes() == _raw(src[k]), k
            if extra:
                assert sc.stats["grpc"] >= 2 and sc.stats["fallback"] >= 1, sc.stats
            else:
                assert sc.stats["bulk"] >= 2 and sc.stats["grpc"] == 0, sc.stats
    finally:
        h.stop()


def test_pull_into_a_module_and_not_modified(hub):
    torch.manual_seed(0)
    src, dst = torch.nn.Linear(30, 20), torch.nn.Linear(30, 20)
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("lin", src.state_dict(), version=4, expect=0)
        w = dst.weight
        assert sc.pull_into("lin", dst) == 4
        assert dst.weight is w and torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)
        assert sc.pull_into("lin", dst, if_newer_than=4) is None
        with pytest.raises(rlhub.NotFound):
            sc.pull_into("nope", dst)


@pytest.mark.parametrize("change", ["name", "shape", "dtype", "extra", "missing"])
def test_pull_into_refuses_a_version_that_does_not_fit(hub, change):
    torch.manual_seed(1)
    target = torch.nn.Linear(8, 4)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    good = {"weight": torch.randn(4, 8), "bias": torch.randn(4)}
    bad = dict(good)
    if change == "name":
        bad["bias2"] = bad.pop("bias")
    elif change == "shape":
        bad["weight"] = torch.randn(8, 4)
    elif change == "dtype":
        bad["weight"] = bad["weight"].double()
    elif change == "extra":
        bad["other"] = torch.randn(2)
    else:
        del bad["bias"]
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("m", bad, version=1, expect=0)
        with pytest.raises(rlhub.InvalidArgument, match="does not fit the target") as ei:
            sc.pull_into("m", target)
        assert "version 1" in str(ei.value)
        for k, v in target.state_dict().items():
            assert torch.equal(v, before[k]), f"{k} changed by a refused version"
        sc.push("m", good, version=2)
        assert sc.pull_into("m", target) == 2
        assert torch.equal(target.weight, good["weight"])


def test_pull_falls_back_to_grpc_against_a_hub_without_the_op(hub_no_dp):
    blob = save_bytes({"w": np.arange(100_000, dtype=np.float32)})
    with rlhub.StoreClient(hub_no_dp.addr) as sc:
        sc.push("m", blob, version=1, expect=0)
        v = sc.pull("m")
        assert bytes(v.blob) == blob
        v2 = sc.pull("m")
        assert bytes(v2.blob) == blob
        # One Unimplemented answer (to the push), then gRPC without asking again.
        assert sc.stats == {"bulk": 0, "grpc": 2, "fallback": 1, "direct": 0, "push_bulk": 0, "push_grpc": 1}, sc.stats
        got = next(sc.watch("m", after=0, timeout=30))
        assert got.version == 1 and bytes(got.blob) == blob


def test_pull_and_watch_on_the_data_plane_match_grpc(hub):
    blob = save_bytes({"w": np.arange(300_000, dtype=np.float32), "b": np.ones(3, np.int64)},
                      metadata={"k": "v"})
    with rlhub.StoreClient(hub.addr) as dp, rlhub.StoreClient(hub.addr, transport="grpc") as g:
        dp.push("m", blob, version=1, expect=0)
        a, b = dp.pull("m"), g.pull("m")
        assert bytes(a.blob) == bytes(b.blob) == blob
        assert (a.name, a.version, a.epoch, a.metadata, a.created_unix_nano) == \
            (b.name, b.version, b.epoch, b.metadata, b.created_unix_nano)
        assert dp.pull("m", if_newer_than=1) is None
        assert dp.stats["bulk"] == 2 and dp.stats["grpc"] == 0 and g.stats["bulk"] == 0
        w = dp.watch("m", after=1, timeout=60)
        blob2 = save_bytes({"w": np.zeros(300_000, np.float32), "b": np.ones(3, np.int64)})
        pusher = threading.Timer(0.2, lambda: g.push("m", blob2, version=2))
        pusher.start()
        v = next(w)
        assert v.version == 2 and bytes(v.blob) == blob2
        w.close()
        pusher.join(60)  # its answer may still be on the way: g stays open until then


def test_watch_into_writes_each_version_in_place(hub):
    target = {"w": torch.zeros(1000)}
    ptr = target["w"].data_ptr()
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("m", {"w": torch.full((1000,), 1.0)}, version=1, expect=0)
        w = sc.watch_into("m", target, after=0, timeout=60)
        assert next(w) == 1 and float(target["w"][0]) == 1.0
        sc.push("m", {"w": torch.full((1000,), 2.0)}, version=2)
        assert next(w) == 2 and float(target["w"][7]) == 2.0
        assert target["w"].data_ptr() == ptr
        w.close()


def _pull_until_direct(sc, name, target, tries=5):
    """pull_into of version 1 until one went straight into the tensors: a
    fresh connection's receive window may still be too small to queue a
    version whole (then it is staged, as correct), the window grows with
    use."""
    before = sc.stats["direct"]
    for _ in range(tries):
        assert sc.pull_into(name, target, version=1) == 1
        if sc.stats["direct"] > before:
            return
    raise AssertionError(f"no pull of {name!r} went straight into the tensors in {tries}: {sc.stats}")


def test_pull_into_receives_a_version_straight_into_the_tensors(hub):
    """Over the data plane a version the socket can queue whole skips the
    staging buffer (stats["direct"]): every tensor written in place, right,
    for the learner loop's 4 MB model (or, where the kernel queues less —
    SO_RCVLOWAT is capped at half of net.ipv4.tcp_rmem's max, 3 MiB on a
    default kernel — the largest square layer it queues whole) and for more
    tensors than one recvmsg takes (IOV_MAX)."""
    torch.manual_seed(2)
    with open("/proc/sys/net/ipv4/tcp_rmem") as f:
        cap = int(f.read().split()[2]) // 2 - _bulk._CLAMP_MARGIN - (64 << 10)
    side = min(1000, int((cap / 4) ** 0.5) - 1)
    src, dst = torch.nn.Linear(side, side), torch.nn.Linear(side, side)
    many = {f"t{i:04d}": torch.full((7,), float(i)) for i in range(_bulk._IOV_MAX + 300)}
    many_dst = {k: torch.zeros(7) for k in many}
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("lin", src.state_dict(), version=1, expect=0)
        ptrs = {k: v.data_ptr() for k, v in dst.state_dict().items()}
        _pull_until_direct(sc, "lin", dst)
        assert {k: v.data_ptr() for k, v in dst.state_dict().items()} == ptrs
        assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)
        sc.push("many", many, version=1, expect=0)
        _pull_until_direct(sc, "many", many_dst)
        for k, v in many.items():
            assert torch.equal(many_dst[k], v), k
        w = sc.watch_into("lin", dst, after=1, timeout=60)
        src2 = {k: v + 1 for k, v in src.state_dict().items()}
        sc.push("lin", src2, version=2)
        assert next(w) == 2 and torch.equal(dst.weight, src2["weight"]) and torch.equal(dst.bias, src2["bias"])
        w.close()


@pytest.mark.parametrize("transport", ["auto", "grpc"])
@pytest.mark.parametrize("how", ["pull_into", "watch_into"])
def test_an_update_in_place_is_seen_by_autograd(hub, how, transport):
    """pull_into / watch_into change the parameters in place, as
    load_state_dict's copy_ does, and must tell autograd so: a graph that
    saved the old weights then refuses backward ("modified by an inplace
    operation") instead of silently computing the gradient with the new
    ones (2 × 5 here in place of 2 × 1)."""
    src = torch.nn.Linear(4, 3)
    with torch.no_grad():
        src.weight.fill_(5.0)
    net = torch.nn.Linear(4, 3)
    with torch.no_grad():
        net.weight.fill_(1.0)
    loss = (net.weight ** 2).sum()  # saves the weight for its backward
    with rlhub.StoreClient(hub.addr, transport=transport) as s:
        s.push("m", src.state_dict(), version=1, expect=0)
        if how == "pull_into":
            assert s.pull_into("m", net) == 1
        else:
            w = s.watch_into("m", net, timeout=30)
            assert next(w) == 1
            w.close()
        assert s.stats["direct"] == (1 if transport == "auto" else 0), s.stats  # both ways of writing
    assert torch.equal(net.weight, src.weight)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _meta_linear():
    with torch.device("meta"):
        return torch.nn.Linear(4, 3)


@pytest.mark.parametrize("make,why", [
    # A module made on the meta device holds no memory: the write was a
    # no-op reported as done (load_state_dict warns of it).
    (_meta_linear, "meta device"),
    # The bias is written first, then torch refuses the expanded weight:
    # half a version was left in the target.
    (lambda: {"bias": torch.zeros(3), "weight": torch.zeros(1, 4).expand(3, 4)}, "share memory"),
    (lambda: {"bias": torch.zeros(3), "weight": torch.zeros(3, 4).to_sparse()}, "layout"),
], ids=["meta", "expanded", "sparse"])
def test_pull_into_refuses_a_target_it_cannot_write_whole(hub, make, why):
    src = torch.nn.Linear(4, 3)
    target = make()
    sd = target.state_dict() if isinstance(target, torch.nn.Module) else target
    dense = lambda t: t.to_dense() if t.layout != torch.strided else t  # noqa: E731
    before = {k: dense(t).clone() for k, t in sd.items() if t.device.type != "meta"}
    with rlhub.StoreClient(hub.addr) as s:
        s.push("m", src.state_dict(), version=1, expect=0)
        with pytest.raises(ValueError, match=why):
            s.pull_into("m", target)
        with pytest.raises(ValueError, match=why):
            next(s.watch_into("m", target, timeout=30))
    for k, t in before.items():
        assert torch.equal(dense(sd[k]), t), k


def test_pull_into_a_strided_target_goes_through_the_staging_buffer(hub):
    """A tensor without a byte view (here a transposed one) cannot take
    the bytes straight from the socket: the version is staged and copied."""
    src = {"w": torch.arange(12.0).reshape(3, 4)}
    target = {"w": torch.zeros(4, 3).t()}
    assert not target["w"].is_contiguous()
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("m", src, version=1, expect=0)
        assert sc.pull_into("m", target) == 1
        assert torch.equal(target["w"], src["w"])
        assert sc.stats["direct"] == 0 and sc.stats["bulk"] == 1, sc.stats


def _truncating_server(n: int, send: int, body: bytes = b"", final_after: float = -1.0):
    """A fake data-plane server: answers every request with a data frame
    announcing n body bytes, sends only ``send`` of them (``body``'s bytes,
    then 0x07s) and hangs up; with ``final_after`` ≥ 0 it sends them all
    and, that many seconds later, an OK final status."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(8)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = lis.accept()
            except OSError:
                return
            with c:
                try:
                    c.recv(8)
                    c.sendall(_bulk.MAGIC)
                    c.recv(1 << 16)  # the request frame
                    hdr = rlhub._proto.rlhub.v1.store_pb2.StorePullHeader()
                    hdr.blob.model, hdr.blob.version, hdr.blob.total_bytes = "m", 9, n
                    hb = hdr.SerializeToString()
                    c.sendall(struct.pack("<BI", 4, len(hb)) + hb + struct.pack("<Q", n) + (body + b"\x07" * send)[:send])
                    if final_after >= 0:
                        time.sleep(final_after)
                        c.sendall(struct.pack("<BI", 3, 0))
                        while c.recv(1 << 16):  # the rest of the request, until the client hangs up
                            pass
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close():
        stop.set()
        lis.close()
        t.join(10)

    return f"127.0.0.1:{lis.getsockname()[1]}", close


@pytest.mark.parametrize("send", [0, 500_000, 1_000_000], ids=["no-body", "mid-body", "no-final"])
def test_a_truncated_data_plane_answer_is_an_error_never_a_partial_update(send):
    import rlhub._proto.rlhub.v1.store_pb2  # noqa: F401  (used by the fake server)

    addr, close = _truncating_server(1_000_000, send)
    try:
        target = {"w": np.full(250_000, 3.0, np.float32)}
        with rlhub.StoreClient(addr, retries=1, timeout=20) as sc:
            with pytest.raises(rlhub.Unavailable):
                sc.pull_into("m", target)
            assert (target["w"] == 3.0).all(), "a truncated answer changed the target"
            with pytest.raises(rlhub.Unavailable):
                sc.pull("m")
    finally:
        close()


@pytest.mark.parametrize("final_after", [0.0, 0.3])
def test_pull_into_takes_a_whole_version_whose_final_status_comes_later(final_after):
    """The version is written once its final OK has come, whether it was
    queued with the body or arrives after it (the direct path waits for
    its first bytes; the staged path reads it)."""
    import rlhub._proto.rlhub.v1.store_pb2  # noqa: F401  (used by the fake server)

    want = np.arange(250_000, dtype=np.float32)
    blob = save_bytes({"w": want})
    addr, close = _truncating_server(len(blob), len(blob), blob, final_after)
    try:
        target = {"w": np.zeros(250_000, np.float32)}
        with rlhub.StoreClient(addr, retries=0, timeout=20) as sc:
            assert sc.pull_into("m", target) == 9
            assert (target["w"] == want).all()
    finally:
        close()


def test_pull_into_allocates_nothing_per_version_at_25m_parameters(hub):
    n = 25_000_000
    src = {"w": torch.arange(n, dtype=torch.float32)}
    target = {"w": torch.zeros(n)}
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("big", src, version=1, expect=0)
        assert sc.pull_into("big", target) == 1  # the receive buffer is allocated here, once
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for _ in range(3):
                assert sc.pull_into("big", target) == 1
            cur, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert torch.equal(target["w"], src["w"])
        assert sc.stats["bulk"] == 4
        # A version is 100 MB; what a pull_into allocates is a few small
        # objects (the header, numpy views), freed again.
        assert peak - base < 1 << 20, f"peak {peak - base} bytes above the start over 3 pulls"
        assert cur - base < 64 << 10, f"{cur - base} bytes still held after 3 pulls"


def _tcp_pair():
    lis = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lis.getsockname())
    b, _ = lis.accept()
    lis.close()
    return a, b


@pytest.mark.parametrize("case", ["direct", "refused", "wrong-size", "short"])
def test_reader_direct_writes_whole_bodies_only(case):
    """_bulk._Reader.direct against a real TCP pair: a queued body goes
    into the plan's views; a plan that refuses, or views that do not add
    up to the body, raise _Refused with nothing written; a body that never
    comes whole (the peer hangs up) goes to the stage."""
    body = bytes(range(256)) * 40  # 10240 bytes
    a, b = _tcp_pair()
    try:
        b.sendall(body[:4096] if case == "short" else body + b"\x03\0\0\0\0")
        if case == "short":
            b.close()
        dst = [bytearray(16), bytearray(len(body) - 16 - 100), bytearray(100)]
        stage = bytearray(len(body))

        def plan(take, n):
            head = take(16)
            if case == "refused":
                raise ValueError("does not fit")
            views = [memoryview(d) for d in dst[1:]]
            if case == "wrong-size":
                views = views[:1]
            return head, views

        sink = _bulk.Direct(plan, lambda n: stage)
        a.setblocking(True)
        rd = _bulk._Reader(a, time.monotonic() + 20)
        if case in ("refused", "wrong-size"):
            with pytest.raises(_bulk._Refused):
                rd.direct(sink, len(body))
            assert not any(dst[1]) and not any(dst[2]) and not sink.direct
        elif case == "short":
            with pytest.raises(EOFError):
                rd.direct(sink, len(body))
            assert not any(dst[1]) and not sink.direct and stage[:4096] == body[:4096]
        else:
            rd.direct(sink, len(body))
            assert sink.direct and bytes(dst[1]) + bytes(dst[2]) == body[16:]
            assert rd.take(5) == b"\x03\0\0\0\0"
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_reader_waits_for_a_body_with_quick_acks():
    """While _Reader.direct waits for a whole body it reads nothing, so the
    kernel's delayed ACKs of a request/response ("pingpong") connection
    would stall the sender until its tail-loss probe: the wait leaves
    pingpong mode (TCP_QUICKACK reads 1), and puts SO_RCVLOWAT back to 1."""
    body = bytes(range(256)) * 40
    a, b = _tcp_pair()
    try:
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # pingpong mode, as after a request
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
        b.sendall(body + b"\x03\0\0\0\0")
        dst = bytearray(len(body))
        sink = _bulk.Direct(lambda take, n: (b"", [memoryview(dst)]), lambda n: bytearray(n))
        a.setblocking(True)
        rd = _bulk._Reader(a, time.monotonic() + 20)
        rd.direct(sink, len(body))
        assert sink.direct and bytes(dst) == body
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        a.close()
        b.close()


def test_a_hub_killed_during_the_handshake_keeps_the_data_plane(rlhub_bin, tmp_path):
    """A hub SIGKILLed while a client's connection waits in its accept
    queue resets it (the client's hello is unread): the hub is down, not a
    server without the data plane. The client must say Unavailable and use
    the data plane again once the hub is back on its address — not fall
    to gRPC for NOT_SUPPORTED_FOR (a minute of slower pulls, no direct
    pull_into, and a watch that falls to gRPC is no longer retried)."""
    h = Hub(rlhub_bin, tmp_path)
    try:
        addr = h.addr
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": torch.arange(4.0)}, version=1, expect=0)
        h.proc.send_signal(signal.SIGSTOP)  # connections queue unaccepted
        sc = rlhub.StoreClient(addr, timeout=20, retries=0)  # no idle connection: it dials
        got: list = []
        t = threading.Thread(target=lambda: got.append(_raises(lambda: sc.pull("m"))))
        t.start()
        deadline = time.monotonic() + 10
        while not _connected_to(addr):  # the hello is sent and waits for the magic
            assert time.monotonic() < deadline, "the client did not connect"
            time.sleep(0.01)
        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        t.join(30)
        assert not t.is_alive()
        assert isinstance(got[0], rlhub.Unavailable), got
        assert sc._bulk is not None and sc._bulk.supported(addr)
        h.stop()
        h = Hub(rlhub_bin, tmp_path, addr=addr)
        tgt = {"w": torch.zeros(4)}
        assert sc.pull_into("m", tgt) == 1 and torch.equal(tgt["w"], torch.arange(4.0))
        assert (sc.stats["bulk"], sc.stats["grpc"], sc.stats["fallback"]) == (1, 0, 0), sc.stats
        sc.close()
    finally:
        h.stop()


def _raises(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - returned for the test to look at
        return e


def _connected_to(addr: str) -> bool:
    """Whether this process has an established TCP connection to addr
    (/proc/net/tcp: local and remote address, then the state, 01)."""
    host, port = addr.rsplit(":", 1)
    want = "%s:%04X" % ("".join("%02X" % int(b) for b in reversed(host.split("."))), int(port))
    with open(f"/proc/{os.getpid()}/net/tcp") as f:
        return any(line.split()[2] == want and line.split()[3] == "01" for line in f.readlines()[1:])


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_close_ends_a_watch_waiting_in_another_thread(hub, transport):
    """A watch_into waiting in a thread for the next version ends when
    the client is closed, and leaves no connection to the hub. On the data
    plane it used to poll on (a connection reopened after each poll)
    forever after close; over gRPC the closed channel ended it."""
    s = rlhub.StoreClient(hub.addr, transport=transport)
    net = torch.nn.Linear(4, 3)
    s.push("m", net.state_dict(), version=1, expect=0)
    errs: list = []

    def watch():
        try:
            for _ in s.watch_into("m", net, after=1):
                pass
        except Exception as e:  # noqa: BLE001 - the test looks at it
            errs.append(e)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.5)  # the watch waits on the hub
    s.close()
    t.join(10)
    assert not t.is_alive(), "the watch runs on after close"
    assert len(errs) == 1 and isinstance(errs[0], rlhub.RlhubError), errs
    assert errs[0].code == grpc.StatusCode.CANCELLED, errs[0]
    assert not _connected_to(hub.addr)
    with pytest.raises(rlhub.RlhubError):
        s.pull("m")
    s.close()  # twice: a no-op


def test_a_hello_without_a_valid_token_is_refused_in_place_of_the_magic(rlhub_bin, tmp_path):
    """A hub with a token file refuses a data-plane connection without a
    token, or with one it does not know, at its hello: a final status
    (first byte 3) in place of the magic, then the end, before it reads
    any request. The client raises it as the call's Unauthenticated and
    keeps using the data plane for the address (it speaks it); a reader's
    token is served."""
    subprocess.run([rlhub_bin, "token", "new", "--role", "reader", "--scope", "*", "--out",
                    str(tmp_path / "reader.token"), "--append", str(tmp_path / "tokens")],
                   check=True, capture_output=True, timeout=60)
    h = Hub(rlhub_bin, tmp_path, extra=("--auth-tokens", str(tmp_path / "tokens")))
    try:
        for tok in (b"", b"rlh_nobody"):
            host, port = h.addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=20) as s:
                s.sendall(_bulk.MAGIC + struct.pack("<H", len(tok)) + tok)
                got = s.recv(4096)
                assert got[:1] == b"\x03", f"hello with token {tok!r} answered {got[:16]!r}, want a final status"
                while s.recv(4096):  # then the end (a hang guard: the socket's timeout)
                    pass
        req = store_pb2.StorePullRequest(model="m").SerializeToString()
        anon = _bulk.Client(rlhub.Security())
        with pytest.raises(rlhub.Unauthenticated, match="no token"):
            anon.fetch(h.addr, "rlhub.v1.ModelStore/Pull", req, lambda hdr, n: bytearray(n), 20)
        assert anon.supported(h.addr)
        reader = _bulk.Client(rlhub.Security(token=_channel.read_token(str(tmp_path / "reader.token"))))
        with pytest.raises(rlhub.NotFound):
            reader.fetch(h.addr, "rlhub.v1.ModelStore/Pull", req, lambda hdr, n: bytearray(n), 20)
        anon.close()
        reader.close()
    finally:
        h.stop()
