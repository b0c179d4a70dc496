"""GradClient over the hub's data plane (rlhub._bulk): the same bytes, model
versions and exceptions as over gRPC; gRPC fallback for a server that does
not speak it; the protocol's connection handling against a scripted server."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import rlhub
from rlhub import _bulk
from rlhub._proto.rlhub.v1 import reducer_pb2, reducer_pb2_grpc
from rlhub._transfer import iter_chunks, iter_part_chunks
from rlhub.grads import GradClient, gradient_dict
from rlhub.tensors import parts_size, save_bytes, save_parts
from conftest import Hub
from test_grads import fill_grads, make_net, setup_model, wait_version


# -- the body: the same bytes as save_bytes --------------------------------

def sample_dicts():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    yield {"w": t, "b": torch.ones(3)}
    yield {"t": t.t(), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}  # non-contiguous, 0-d, empty
    yield {"h": torch.ones(5, dtype=torch.bfloat16), "d": np.arange(7, dtype=">f8"), "i": np.arange(3, dtype=np.int64),
           "u": np.ones((2, 2), np.uint8), "é": np.zeros(1, np.float32)}
    yield gradient_dict(make_net())  # no .grad yet: zeros


@pytest.mark.parametrize("d", list(sample_dicts()))
def test_parts_are_save_bytes_and_chunk_alike(d):
    head, bufs = save_parts(d)
    blob = save_bytes(d)
    assert head + b"".join(bufs) == blob
    assert parts_size(head, bufs) == len(blob)
    for cb in (1, 7, 64, 100, len(blob), 1 << 20):
        assert list(iter_part_chunks(head, bufs, cb)) == list(iter_chunks(blob, cb)), cb


def test_parts_view_contiguous_tensors_without_copying():
    t = torch.zeros(1000)
    _, (raw,) = save_parts({"w": t})
    t[0] = 1.0  # the view is the tensor's memory
    assert np.frombuffer(raw, np.float32)[0] == 1.0


# -- against the real hub -------------------------------------------------

def run_training(g: GradClient, s: rlhub.StoreClient, model: str, steps: int) -> dict:
    learner = make_net(seed=5)
    version = 1
    for step in range(steps):
        fill_grads(learner, seed=100 + step)
        r = g.push(model, version, learner)
        assert (r.version, r.attempts, r.duplicate) == (version, 1, False)
        version = wait_version(s, model, version).version
    assert version == steps + 1
    return s.pull(model).tensors


def test_same_versions_over_both_transports(hub):
    """Two identical runs, one per transport, end on identical weights."""
    net = make_net()
    setup_model(hub.addr, "over-bulk", net)
    setup_model(hub.addr, "over-grpc", net)
    opt = {"kind": "adam", "lr": 1e-2, "weight_decay": 1e-3}
    with GradClient(hub.addr) as gb, GradClient(hub.addr, transport="grpc") as gg, \
            rlhub.StoreClient(hub.addr) as s:
        gb.register("over-bulk", optimizer=opt, gradient_max=0.5)
        gg.register("over-grpc", optimizer=opt, gradient_max=0.5)
        wb = run_training(gb, s, "over-bulk", 5)
        wg = run_training(gg, s, "over-grpc", 5)
        assert gb.transport_stats() == {"bulk": 5, "grpc": 0, "fallback": 0, "bulk_dials": 1}  # one reused connection
        assert gg.transport_stats() == {"bulk": 0, "grpc": 5, "fallback": 0, "bulk_dials": 0}
    assert set(wb) == set(wg) == set(net.state_dict())
    for k in wb:
        a, b = np.asarray(wb[k]), np.asarray(wg[k])
        assert a.tobytes() == b.tobytes(), k
        assert not np.array_equal(a, net.state_dict()[k].numpy()), k  # training moved it


def error_cases(g: GradClient, s: rlhub.StoreClient, model: str) -> list:
    """The error cases of test_grads' bad-input test: (exception type, message, current_version)."""
    net = make_net()
    fill_grads(net, 0)
    out = []

    def expect(cls, *args, **kw):
        with pytest.raises(cls) as ei:
            g.push(*args, **kw)
        e = ei.value
        assert type(e) is cls, repr(e)
        out.append((type(e).__name__, e.message.replace(model, "M").replace(g.client_id, "C"), getattr(e, "current_version", None)))

    expect(rlhub.NotFound, model, 1, net)  # not registered yet
    g.register(model, optimizer={"kind": "sgd", "lr": 0.1}, staleness="drop", max_lag=0)
    good = {k: v.clone() for k, v in gradient_dict(net).items()}
    expect(rlhub.InvalidArgument, model, 1, dict(good, **{"0.weight": torch.zeros(8, 6)}))  # wrong shape
    nan = {k: v.clone() for k, v in good.items()}
    nan["2.bias"][1] = float("nan")
    expect(rlhub.InvalidArgument, model, 1, nan)
    inf = {k: v.clone() for k, v in good.items()}
    inf["0.weight"][3, 4] = float("inf")
    expect(rlhub.InvalidArgument, model, 1, inf)
    expect(rlhub.InvalidArgument, model, 1, {k: v for k, v in good.items() if k != "2.bias"})  # missing
    expect(rlhub.InvalidArgument, model, 1, {k: v.double() for k, v in good.items()})  # wrong dtype
    expect(rlhub.InvalidArgument, model, 7, good)  # a base version from the future
    expect(rlhub.NotFound, "nope", 1, good)
    r = g.push(model, 1, good, seq=1000)
    assert wait_version(s, model, 1).version == 2
    expect(rlhub.StaleVersion, model, 1, good)  # drop, max_lag 0
    expect(rlhub.AlreadyExists, model, 2, good, seq=r.seq)  # a first attempt reusing an applied seq
    assert s.pull(model).version == 2
    return out


def test_errors_are_the_same_exceptions_over_both_transports(hub):
    net = make_net()
    setup_model(hub.addr, "model-over-bulk", net)
    setup_model(hub.addr, "model-over-grpc", net)
    with GradClient(hub.addr, "client-over-bulk") as gb, \
            GradClient(hub.addr, "client-over-grpc", transport="grpc") as gg, \
            rlhub.StoreClient(hub.addr) as s:
        over_bulk = error_cases(gb, s, "model-over-bulk")
        over_grpc = error_cases(gg, s, "model-over-grpc")
        assert gb.transport_stats()["bulk"] == 11 and gb.transport_stats()["grpc"] == 0
        assert gg.transport_stats()["grpc"] == 11 and gg.transport_stats()["bulk"] == 0
        t = gb.stats().total
        assert t.pushed == 22 and t.applied == 2 and t.pushed == t.applied + t.dropped_total
    assert over_bulk == over_grpc
    assert over_bulk[-2][0] == "StaleVersion" and over_bulk[-2][2] == 2


def test_bulk_client_against_the_hub_directly(hub):
    """_bulk.Client by hand: a refused push moves no body, an admitted one is answered OK."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    fill_grads(net, 1)
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        sid = g.secondaries()[0][1]
    head, bufs = save_parts(gradient_dict(net))
    h = reducer_pb2.ReducerPushHeader(client_id="direct", seq=1, secondary=sid)
    h.blob.model, h.blob.version, h.blob.total_bytes = "pol", 1, parts_size(head, bufs)
    c = _bulk.Client()
    try:
        resp = reducer_pb2.ReducerPushResponse()
        c.call(hub.addr, _bulk.PUSH_METHOD, h.SerializeToString(), [head, *bufs], resp, timeout=10)
        assert (resp.version, resp.weight) == (1, 1.0)
        h.blob.model = "nope"
        with pytest.raises(rlhub.NotFound):
            c.call(hub.addr, _bulk.PUSH_METHOD, h.SerializeToString(), [head, *bufs], None, timeout=10)
        with pytest.raises(rlhub.RlhubError) as ei:  # unknown method: UNIMPLEMENTED
            c.call(hub.addr, "rlhub.v1.Nope/Push", b"", [], None, timeout=10)
        assert ei.value.code == grpc.StatusCode.UNIMPLEMENTED
        assert c.dials == 1  # every answer left the connection in step
    finally:
        c.close()


# -- fallback ---------------------------------------------------------------

class FakeReducer(reducer_pb2_grpc.ReducerServicer):
    """A bare grpcio Reducer (no data plane): one secondary, itself."""

    def __init__(self):
        self.bodies = []
        self.headers = []

    def Secondaries(self, request, context):
        return reducer_pb2.ReducerSecondariesResponse(secondaries=[reducer_pb2.ReducerSecondary(id="fake")])

    def Push(self, request_iterator, context):
        first = next(request_iterator)
        body = b"".join(m.chunk.data for m in request_iterator)
        assert len(body) == first.header.blob.total_bytes
        self.bodies.append(body)
        self.headers.append(first.header)
        return reducer_pb2.ReducerPushResponse(version=42, weight=0.5)


def test_falls_back_to_grpc_on_a_bare_grpc_server():
    fake = FakeReducer()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    reducer_pb2_grpc.add_ReducerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        addr = f"127.0.0.1:{port}"
        grads = {"w": torch.arange(10, dtype=torch.float32), "b": torch.ones(2)}
        with GradClient(addr) as g:
            for i in range(3):
                r = g.push("m", 1, grads)
                assert (r.version, r.weight, r.attempts, r.addr) == (42, 0.5, 1, addr)
            # The first push found out (grpcio answers the magic with its
            # SETTINGS frame); the next ones go straight to gRPC.
            assert g.transport_stats() == {"bulk": 0, "grpc": 3, "fallback": 1, "bulk_dials": 0}
            assert not g._bulk.supported(addr)
        assert fake.bodies == [save_bytes(grads)] * 3
    finally:
        server.stop(None)


class Listener:
    """A plain TCP server running ``serve(conn)`` for every connection."""

    def __init__(self, serve):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.conns = 0
        self._serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        try:
            self._serve(c)
        except (OSError, EOFError):
            pass  # the client hung up
        finally:
            c.close()

    def close(self):
        self.sock.close()


def test_garbage_answer_falls_back_and_the_push_lands_elsewhere(hub):
    """A secondary address that answers garbage: not the data plane, gRPC
    fails too (UNAVAILABLE), the push is retried, same seq, on the hub."""
    def garbage(c):
        c.recv(64)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    lis = Listener(garbage)
    net = make_net()
    setup_model(hub.addr, "pol", net)
    fill_grads(net, 0)
    try:
        with GradClient(hub.addr, timeout=10) as g:
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
            g._targets = [(lis.addr, "garbage")]
            r = g.push("pol", 1, net)
            assert r.attempts == 2 and r.addr == hub.addr
            assert g.transport_stats() == {"bulk": 1, "grpc": 1, "fallback": 1, "bulk_dials": 1}
            assert not g._bulk.supported(lis.addr) and g._bulk.supported(hub.addr)
    finally:
        lis.close()


# -- the protocol against a scripted server ----------------------------------

def recv_exact(c, n):
    b = b""
    while len(b) < n:
        x = c.recv(n - len(b))
        if not x:
            raise EOFError
        b += x
    return b


def read_request(c):
    kind, ml = struct.unpack("<BH", recv_exact(c, 3))
    assert kind == 1
    method = recv_exact(c, ml).decode()
    (hl,) = struct.unpack("<I", recv_exact(c, 4))
    return method, recv_exact(c, hl)


def final(c, st: status_pb2.Status):
    b = st.SerializeToString()
    c.sendall(struct.pack("<BI", 3, len(b)) + b)


def ok_status(version=3):
    a = any_pb2.Any()
    a.Pack(reducer_pb2.ReducerPushResponse(version=version, weight=1.0))
    return status_pb2.Status(code=0, details=[a])


def handshake(c):
    assert recv_exact(c, 8) == _bulk.MAGIC
    (n,) = struct.unpack("<H", recv_exact(c, 2))  # the token's length, then the token
    recv_exact(c, n)
    c.sendall(_bulk.MAGIC)


def read_body(c) -> bytes:
    """One request of the scripted servers: its header is a little-endian
    u64 body length; answers continue and returns the body."""
    _, header = read_request(c)
    c.sendall(b"\x02")
    (n,) = struct.unpack("<Q", header)
    return recv_exact(c, n)


def test_idle_connection_closed_by_the_server_is_replaced():
    """The server serves one request per connection and hangs up: the
    reused idle connection fails unanswered and a fresh one takes over."""
    bodies = []

    def one_request(c):
        handshake(c)
        bodies.append(read_body(c))
        final(c, ok_status())

    lis = Listener(one_request)
    cl = _bulk.Client()
    try:
        for i in range(3):
            body = [b"abc", memoryview(np.full(100_000, i, np.float32)).cast("B")]
            resp = reducer_pb2.ReducerPushResponse()
            cl.call(lis.addr, "m", struct.pack("<Q", 400_003), body, resp, timeout=5)
            assert resp.version == 3
        assert lis.conns == 3 and cl.dials == 3
        assert [b[3:] == np.full(100_000, i, np.float32).tobytes() for i, b in enumerate(bodies)] == [True] * 3
    finally:
        cl.close()
        lis.close()


def test_many_buffers_and_partial_writes_arrive_in_order():
    """More buffers than one sendmsg takes (IOV_MAX) and more bytes than the
    socket buffer holds: every byte arrives, in order."""
    got = []

    def serve(c):
        handshake(c)
        while True:
            got.append(read_body(c))
            final(c, ok_status())

    lis = Listener(serve)
    cl = _bulk.Client()
    try:
        small = [bytes([i % 251]) * (i % 5) for i in range(3000)]  # some empty
        big = [np.random.default_rng(0).bytes(16 << 20)]
        for body in (small, big, small + big + small):
            want = b"".join(body)
            cl.call(lis.addr, "m", struct.pack("<Q", len(want)), body, None, timeout=30)
            assert got[-1] == want
        assert cl.dials == 1
    finally:
        cl.close()
        lis.close()


def test_refusal_and_stale_details_without_a_body():
    stale = error_details_pb2.ErrorInfo(reason="STALE_VERSION", domain="rlhub",
                                        metadata={"model": "m", "current_version": "9"})
    a = any_pb2.Any()
    a.Pack(stale)

    def serve(c):
        handshake(c)
        while True:
            read_request(c)
            final(c, status_pb2.Status(code=9, message="too stale", details=[a]))  # no continue: no body

    lis = Listener(serve)
    cl = _bulk.Client()
    try:
        for _ in range(2):
            with pytest.raises(rlhub.StaleVersion) as ei:
                cl.call(lis.addr, "m", b"", [b"x" * 10], None, timeout=5)
            assert (ei.value.message, ei.value.model, ei.value.current_version) == ("too stale", "m", 9)
        assert cl.dials == 1
    finally:
        cl.close()
        lis.close()


def test_broken_midway_is_unavailable_and_not_resent():
    def serve(c):
        handshake(c)
        read_request(c)
        c.sendall(b"\x02")
        recv_exact(c, 10)  # then hang up in the middle of the body

    lis = Listener(serve)
    cl = _bulk.Client()
    try:
        with pytest.raises(rlhub.Unavailable):
            cl.call(lis.addr, "m", b"", [b"x" * (8 << 20)], None, timeout=5)
        assert lis.conns == 1  # answered (continue): not retried on a fresh connection
    finally:
        cl.close()
        lis.close()


def test_deadline_bounds_a_silent_server():
    # The server stays silent until the call has returned: the call can only
    # end through its own deadline (without one it would wait out the
    # server's 60 s and then see the connection close: Unavailable).
    returned = threading.Event()

    def serve(c):
        handshake(c)
        read_request(c)
        returned.wait(60)

    lis = Listener(serve)
    cl = _bulk.Client()
    try:
        with pytest.raises(rlhub.DeadlineExceeded):
            cl.call(lis.addr, "m", b"", [], None, timeout=0.3)
    finally:
        returned.set()
        cl.close()
        lis.close()


def test_a_silent_handshake_or_closed_port_is_unavailable_not_unsupported():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % port.getsockname()[1]
    port.close()  # nothing listens
    cl = _bulk.Client()
    with pytest.raises(rlhub.Unavailable):
        cl.call(addr, "m", b"", [], None, timeout=2)
    assert cl.supported(addr)
    with pytest.raises(_bulk.NotSupported):
        cl.call("unix:/tmp/x.sock", "m", b"", [], None, timeout=2)
    assert not cl.supported("unix:/tmp/x.sock")


def echo_server():
    """Answers every request OK with the body's length as the version."""
    def serve(c):
        handshake(c)
        while True:
            final(c, ok_status(len(read_body(c))))

    return Listener(serve)


def call_echo(cl, addr, n):
    resp = reducer_pb2.ReducerPushResponse()
    cl.call(addr, "m", struct.pack("<Q", n), [b"y" * n], resp, timeout=5)
    return resp.version


def test_close_drops_idle_connections_and_later_calls_reconnect():
    lis = echo_server()
    cl = _bulk.Client()
    try:
        assert call_echo(cl, lis.addr, 5) == 5
        cl.close()
        assert call_echo(cl, lis.addr, 6) == 6  # as GradClient re-creates gRPC channels after close
        assert cl.dials == 2
    finally:
        cl.close()
        lis.close()


def test_a_forked_child_does_not_share_the_parents_connections():
    lis = echo_server()
    cl = _bulk.Client()
    try:
        assert call_echo(cl, lis.addr, 7) == 7
        pid = os.fork()
        if pid == 0:  # the child: its own connection, or the bytes would interleave
            ok = call_echo(cl, lis.addr, 8) == 8 and cl.dials == 2
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert call_echo(cl, lis.addr, 9) == 9  # the parent's connection still works
        assert cl.dials == 1 and lis.conns == 2
    finally:
        cl.close()
        lis.close()


def test_push_after_close_still_works(hub):
    net = make_net()
    setup_model(hub.addr, "pol", net)
    fill_grads(net, 0)
    g = GradClient(hub.addr)
    try:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        g.push("pol", 1, net)
        g.close()
        assert g.push("pol", 1, net).attempts == 1
        assert g.transport_stats() == {"bulk": 2, "grpc": 0, "fallback": 0, "bulk_dials": 2}
    finally:
        g.close()


class _RpcError(grpc.RpcError):
    def __init__(self, st: status_pb2.Status):
        self._st = st

    def code(self):
        return {c.value[0]: c for c in grpc.StatusCode}[self._st.code]

    def details(self):
        return self._st.message

    def trailing_metadata(self):
        return (("grpc-status-details-bin", self._st.SerializeToString()),)


def test_from_status_is_from_rpc_error_for_every_code():
    info = error_details_pb2.ErrorInfo(reason="STALE_VERSION", metadata={"model": "m", "current_version": "4",
                                                                          "current_epoch": "2"})
    a = any_pb2.Any()
    a.Pack(info)
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        st = status_pb2.Status(code=code.value[0], message=f"m{code.value[0]}", details=[a])
        x, y = rlhub.errors.from_status(st), rlhub.from_rpc_error(_RpcError(st))
        assert (type(x), x.code, x.message) == (type(y), y.code, y.message) == (type(x), code, st.message)
        if isinstance(x, rlhub.StaleVersion):
            assert (x.model, x.current_version, x.current_epoch) == (y.model, y.current_version, y.current_epoch) \
                == ("m", 4, 2)


def test_the_data_plane_sends_what_grpc_sends():
    """The same push over each transport: the same header message and the
    same body bytes (tensors.save_bytes of the gradient)."""
    got = []

    def serve(c):
        handshake(c)
        method, header = read_request(c)
        h = reducer_pb2.ReducerPushHeader.FromString(header)
        c.sendall(b"\x02")
        got.append((method, h, recv_exact(c, h.blob.total_bytes)))
        final(c, ok_status(42))

    lis = Listener(serve)
    fake = FakeReducer()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    reducer_pb2_grpc.add_ReducerServicer_to_server(fake, server)
    fake_addr = "127.0.0.1:%d" % server.add_insecure_port("127.0.0.1:0")
    server.start()
    net = make_net()
    fill_grads(net, 3)
    try:
        with GradClient("127.0.0.1:1", "same-id", chunk_bytes=100) as gb, \
                GradClient(fake_addr, "same-id", chunk_bytes=100, transport="grpc") as gg:
            gb._targets = [(lis.addr, "sid")]  # no gRPC call: the listed secondary is the scripted server
            gg._targets = [(fake_addr, "sid")]
            assert gb.push("pol", 3, net, seq=77).version == 42
            assert gg.push("pol", 3, net, seq=77).version == 42
            assert gb.transport_stats()["bulk"] == 1 and gg.transport_stats()["grpc"] == 1
        ((method, hb, body),) = got
        assert method == "rlhub.v1.Reducer/Push"
        assert hb.SerializeToString() == fake.headers[0].SerializeToString()
        assert (hb.blob.model, hb.blob.version, hb.blob.chunk_bytes, hb.client_id, hb.seq, hb.secondary) == \
            ("pol", 3, 100, "same-id", 77, "sid")
        assert body == fake.bodies[0] == save_bytes(gradient_dict(net))
    finally:
        lis.close()
        server.stop(None)


def test_threads_share_the_connection_pool(hub):
    """GradClient is thread-safe: concurrent pushes each take their own
    connection from the pool (at most one per thread), all over the data plane."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    fill_grads(net, 0)
    grads = {k: v.clone() for k, v in gradient_dict(net).items()}
    receipts, failures = [], []
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "sgd", "lr": 1e-3})
        g.secondaries()

        def pusher():
            try:
                for _ in range(10):
                    receipts.append(g.push("pol", 1, grads))
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)

        ts = [threading.Thread(target=pusher) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert failures == [] and len(receipts) == 40
        st = g.transport_stats()
        assert st["grpc"] == 0 and st["bulk"] == sum(r.attempts for r in receipts)
        assert 1 <= st["bulk_dials"] <= 4, st



def test_idle_connection_to_a_restarted_hub_is_replaced(rlhub_bin, tmp_path):
    """The hub closes idle data-plane connections when it stops; after a
    restart on the same address the next push replaces the dead idle
    connection without a failed attempt."""
    net = make_net()
    fill_grads(net, 0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    h = Hub(rlhub_bin, tmp_path / "a")
    with GradClient(h.addr) as g:
        try:
            setup_model(h.addr, "pol", net)
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
            assert g.push("pol", 1, net).attempts == 1
        finally:
            h.stop()
        h2 = Hub(rlhub_bin, tmp_path / "b", addr=h.addr)  # the same address
        try:
            assert h2.addr == h.addr
            setup_model(h2.addr, "pol", net)
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
            r = g.push("pol", 1, net)
            assert r.attempts == 1 and r.version == 1
            assert g.transport_stats() == {"bulk": 2, "grpc": 0, "fallback": 0, "bulk_dials": 2}
        finally:
            h2.stop()
