"""A silent hub: a real listener on 127.0.0.1 that accepts connections and
never answers (as a SIGSTOPped or wedged hub does), or sends a valid start
and then stops. The gRPC error says the hub sent nothing (not that it
closed the connection and may want TLS), and ``DataPlaneSource.wait_newer``
is bounded by its timeout, not the poll's 10 s slack, while a version the
hub begins sending at the very end of the last poll still arrives."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Callable, List, Tuple

import numpy as np
import pytest

import rlhub
import rlhub.wsync as ws
from rlhub import _bulk
from rlhub._proto.rlhub.v1 import store_pb2, sync_pb2

# The first 12 bytes of an HTTP/2 SETTINGS frame: its 9-byte header
# announcing 6 bytes, and 3 of them (a server that stopped mid-frame).
HALF_SETTINGS = bytes([0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0])


def _recv_exact(c: socket.socket, n: int) -> bytes:
    b = b""
    while len(b) < n:
        k = c.recv(n - len(b))
        if not k:
            raise OSError("closed")
        b += k
    return b


def _hub(handle: Callable[[socket.socket], None]) -> Tuple[str, Callable[[], None]]:
    """A listener whose every connection ``handle`` serves, on its own
    thread; close() closes the listener and the connections and joins
    the threads."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(16)
    conns: List[socket.socket] = []
    threads: List[threading.Thread] = []
    mu = threading.Lock()

    def serve(c: socket.socket) -> None:
        try:
            handle(c)
            while c.recv(1 << 16):  # hold it open, discarding, until the client or close() ends it
                pass
        except OSError:
            pass

    def accept() -> None:
        while True:
            try:
                c, _ = lis.accept()
            except OSError:
                return
            t = threading.Thread(target=serve, args=(c,), daemon=True)
            with mu:
                conns.append(c)
                threads.append(t)
            t.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()

    def close() -> None:
        lis.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        lis.close()
        acceptor.join(10)
        with mu:
            for c in conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            ts = list(threads)
        for t in ts:
            t.join(10)

    return f"127.0.0.1:{lis.getsockname()[1]}", close


def _sends(first: bytes) -> Callable[[socket.socket], None]:
    def handle(c: socket.socket) -> None:
        if first:
            c.sendall(first)
    return handle


@pytest.mark.parametrize("first", [b"", HALF_SETTINGS], ids=["silent", "half-sent"])
def test_grpc_call_to_a_silent_hub_says_it_sent_nothing(first):
    # gRPC gives up on the connection at its connect deadline (no SETTINGS
    # frame came): the error says so, and does not suggest TLS.
    addr, close = _hub(_sends(first))
    try:
        with rlhub.StoreClient(addr, transport="grpc") as s:
            with pytest.raises(rlhub.Unavailable) as e:
                s.list()
        msg = str(e.value)
        assert "sent nothing" in msg and "TLS" not in msg, msg
    finally:
        close()
