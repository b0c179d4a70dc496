"""A client holding a token and no TLS never sends the token in plaintext
to an address off loopback (docs/security.md, "Tokens without TLS"): the
gRPC channel, a cluster's primary learned at run time and the data plane
refuse it with ``rlhub.Unauthenticated`` naming the address and the CA to
give, before anything is sent. No packet leaves this machine: gRPC
channels go through a recording HTTP CONNECT proxy on loopback that
refuses every tunnel, and the data plane's connects are recorded and
refused off loopback."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest

import rlhub
from rlhub import _bulk, _channel

SEC = _channel.Security(token="rlh_secret")
OFF = ["192.0.2.1:7470", "10.255.255.1:7470", "[2001:db8::1]:7470"]


class Proxy:
    """An HTTP CONNECT proxy on loopback that records each tunnel asked
    for and refuses it (403)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.asked: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        b = c.recv(4096)
                        if not b:
                            break
                        data += b
                    self.asked.append(data.split(b"\r\n", 1)[0].decode(errors="replace"))
                    c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def proxy():
    p = Proxy()
    yield p
    p.close()


def _refused(e: pytest.ExceptionInfo, addr: str) -> None:
    msg = str(e.value)
    assert addr in msg and "plaintext" in msg and "ca=" in msg and "--tls-ca" in msg, msg


def test_grpc_channel_refuses_a_token_in_plaintext_off_loopback(proxy):
    opts = [("grpc.http_proxy", proxy.url)]
    # The proxy does see a channel's connection: one without a token goes.
    ch = _channel.channel(OFF[0], options=opts, security=_channel.Security())
    with pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(ch).result(timeout=1)
    ch.close()
    assert proxy.asked and OFF[0] in proxy.asked[0], proxy.asked
    del proxy.asked[:]

    for addr in OFF:
        with pytest.raises(rlhub.Unauthenticated) as e:
            ch = _channel.channel(addr, options=opts, security=SEC)
            grpc.channel_ready_future(ch).result(timeout=1)  # before the fix: it connects
        _refused(e, addr)
    # Each hub of a list (its seed channels do not take the proxy: not
    # connected here).
    with pytest.raises(rlhub.Unauthenticated) as e:
        _channel.channel("127.0.0.1:7470,192.0.2.1:7470", options=opts, security=SEC).close()
    _refused(e, "192.0.2.1:7470")
    # A cluster's primary learned at run time (from etcd, or a standby's
    # refusal) is refused where it is offered, and not followed.
    fc = _channel.channel("127.0.0.1:1,127.0.0.1:2", options=opts, security=SEC)
    try:
        with pytest.raises(rlhub.Unauthenticated) as e:
            fc.offer(OFF[0], 1)
            grpc.channel_ready_future(fc._ch).result(timeout=1)  # before the fix: it connects
        _refused(e, OFF[0])
        assert fc.primary() is None
    finally:
        fc.close()
    assert proxy.asked == []
    # Loopback takes the token in plaintext (a hub with a token file, tests).
    for addr in ("127.0.0.1:1", "localhost:1", "[::1]:1", "127.0.0.1:1,127.0.0.2:1"):
        _channel.channel(addr, security=SEC).close()


def test_data_plane_refuses_a_token_in_plaintext_off_loopback(monkeypatch):
    dialled = []
    real = socket.create_connection

    def connect(address, *a, **kw):
        dialled.append(address)
        if not address[0].startswith("127."):
            raise ConnectionRefusedError("test: no connection leaves this machine")
        return real(address, *a, **kw)

    monkeypatch.setattr(socket, "create_connection", connect)
    c = _bulk.Client(SEC)
    try:
        for addr in OFF:
            with pytest.raises(rlhub.Unauthenticated) as e:
                c.call(addr, _bulk.PUSH_METHOD, b"", [], None, timeout=5)
            _refused(e, addr)
        assert dialled == []
        # On loopback it dials (nothing listens on port 1).
        with pytest.raises(rlhub.Unavailable):
            c.call("127.0.0.1:1", _bulk.PUSH_METHOD, b"", [], None, timeout=5)
        assert dialled == [("127.0.0.1", 1)]
    finally:
        c.close()


def test_the_hostname_is_refused_though_it_resolves_to_loopback():
    """The rule is on the address as named, not on what it resolves to
    (docs/security.md: names are not resolved): this machine's hostname,
    which /etc/hosts maps to loopback (Debian: 127.0.1.1), is refused a
    plaintext token by the channel, as a primary learned at run time, and
    by the data plane — as the Go seam refuses it at GRPC, on each call's
    connection and in its data plane (internal/dial
    TestTokenRefusedToTheHostnameEverywhere). A server listening where the
    name resolves sees no connection."""
    host = socket.gethostname()
    try:
        ips = {ai[4][0] for ai in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError as e:
        pytest.skip(f"this machine's hostname {host!r} does not resolve ({e}): /etc/hosts has no mapping of it "
                    "to compare with loopback")
    if not ips or not all(ip.startswith("127.") for ip in ips):
        pytest.skip(f"this machine's hostname {host!r} resolves to {sorted(ips)}, not to loopback only "
                    "(/etc/hosts has no loopback mapping of it)")
    lis = socket.create_server((sorted(ips)[0], 0))
    lis.setblocking(False)
    named = f"{host}:{lis.getsockname()[1]}"
    try:
        with pytest.raises(rlhub.Unauthenticated) as e:
            _channel.channel(named, security=SEC).close()
        _refused(e, named)
        fc = _channel.channel("127.0.0.1:1,127.0.0.1:2", security=SEC)
        try:
            with pytest.raises(rlhub.Unauthenticated) as e:
                fc.offer(named, 1)
            _refused(e, named)
            assert fc.primary() is None
        finally:
            fc.close()
        c = _bulk.Client(SEC)
        try:
            with pytest.raises(rlhub.Unauthenticated) as e:
                c.call(named, _bulk.PUSH_METHOD, b"", [], None, timeout=5)
            _refused(e, named)
        finally:
            c.close()
        with pytest.raises(BlockingIOError):
            lis.accept()  # nothing connected
    finally:
        lis.close()
