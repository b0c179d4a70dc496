"""Which data-plane failures say the request was never sent: every error the
client raises before the first byte of its request went onto a connection
(the dial, TLS, the hello: refused, reset, garbled, unanswered, refused by
status) is a ``_bulk.NothingSent`` of its usual named class; a failure
after the request began, or on a reused connection that may have taken
it, is not. Real listeners on 127.0.0.1 speak each case; a GradClient
shows what hangs on it (a real hub): a reused sequence number after a
hello refused in words that are not the client's own is raised, not taken
for an earlier attempt's duplicate."""

from __future__ import annotations

import socket
import struct
from typing import Callable

import pytest
from google.rpc import status_pb2

import rlhub
from rlhub import _bulk
from conftest import free_port
from test_grads_duplicates import reused_seq_is_raised_after
from test_silent_hub import _hub, _recv_exact, _sends

HELLO = len(_bulk.MAGIC) + 2  # the magic and the empty token's length


def _final(code: int, message: str) -> bytes:
    raw = status_pb2.Status(code=code, message=message).SerializeToString()
    return bytes([3]) + struct.pack("<I", len(raw)) + raw


def _refuses(code: int, message: str) -> Callable[[socket.socket], None]:
    """Reads the hello and refuses it with a status, as a hub refusing a token does."""
    def handle(c: socket.socket) -> None:
        _recv_exact(c, HELLO)
        c.sendall(_final(code, message))
    return handle


def _resets(c: socket.socket) -> None:
    """Reads the hello and resets the connection (SO_LINGER 0)."""
    _recv_exact(c, HELLO)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def _garbles(c: socket.socket) -> None:
    _recv_exact(c, HELLO)
    c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def _breaks_after_request(c: socket.socket) -> None:
    """Answers the hello, reads the request's first byte, then resets."""
    _recv_exact(c, HELLO)
    c.sendall(_bulk.MAGIC)
    _recv_exact(c, 1)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


CASES = {
    # handler, the named class the error keeps
    "silent": (_sends(b""), _bulk.NoAnswer),
    "reset-after-hello": (_resets, rlhub.Unavailable),
    "garbage": (_garbles, _bulk.NotSupported),
    "token-refused": (_refuses(16, "rlhub: unknown token"), rlhub.Unauthenticated),
    "hello-refused-unavailable": (_refuses(14, "rlhub: draining: come back later"), rlhub.Unavailable),
}


def _call(addr: str) -> None:
    _bulk.Client().call(addr, _bulk.PUSH_METHOD, b"", [b"x" * 64], None, timeout=10)


@pytest.mark.parametrize("case", list(CASES))
def test_every_failure_before_the_request_is_nothing_sent(case, monkeypatch):
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 0.3)
    handle, named = CASES[case]
    addr, close = _hub(handle)
    try:
        with pytest.raises(named) as e:
            _call(addr)
        assert isinstance(e.value, _bulk.NothingSent), (type(e.value).__mro__, e.value)
    finally:
        close()


def test_a_refused_dial_and_bad_input_are_nothing_sent():
    with pytest.raises(rlhub.Unavailable) as e:
        _call(f"127.0.0.1:{free_port()}")
    assert isinstance(e.value, _bulk.NothingSent)
    with pytest.raises(rlhub.InvalidArgument) as e2:
        _bulk.Client().call("127.0.0.1:1", "", b"", [], None, timeout=1)
    assert isinstance(e2.value, _bulk.NothingSent)


def test_a_failure_after_the_request_began_is_not_nothing_sent():
    addr, close = _hub(_breaks_after_request)
    try:
        with pytest.raises(rlhub.Unavailable) as e:
            _call(addr)
        assert not isinstance(e.value, _bulk.NothingSent), e.value
    finally:
        close()


def test_a_dial_after_a_reused_connection_broke_is_not_nothing_sent():
    """An idle connection takes the request and breaks unanswered (the hub
    went away); the fresh dial that follows is refused. The request may
    have gone out on the first: the error is not marked."""
    def serves_one(c: socket.socket) -> None:
        _recv_exact(c, HELLO)
        c.sendall(_bulk.MAGIC)
        (kind, n) = struct.unpack("<BH", _recv_exact(c, 3))
        _recv_exact(c, n)
        (hl,) = struct.unpack("<I", _recv_exact(c, 4))
        _recv_exact(c, hl)
        c.sendall(_final(0, ""))

    addr, close = _hub(serves_one)
    cl = _bulk.Client()
    try:
        cl.call(addr, "m", b"", [], None, timeout=10)
    finally:
        close()  # the listener and the idle connection's other end
    with pytest.raises(rlhub.Unavailable) as e:
        cl.call(addr, "m", b"", [], None, timeout=10)
    assert not isinstance(e.value, _bulk.NothingSent), e.value
    assert cl.dials == 1  # the second call took the idle connection first


def test_marked_errors_pickle_as_their_class():
    import pickle
    e = _bulk._nothing_sent(rlhub.Unauthenticated("no"))
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and isinstance(back, rlhub.Unauthenticated) and back.message == "no"


def test_reused_seq_is_raised_after_a_hello_refused_in_other_words(hub):
    """The first attempt goes to a secondary whose data plane refuses the
    hello UNAVAILABLE, in its own words (a status message, not "bulk:
    dial/TLS/handshake ..."): nothing was sent, so the real hub's
    ALREADY_EXISTS for the reused seq is raised — matching the message's
    beginning took it for an earlier attempt's duplicate."""
    addr, close = _hub(_refuses(14, "rlhub: draining: come back later"))
    try:
        reused_seq_is_raised_after(hub.addr, addr)
    finally:
        close()
