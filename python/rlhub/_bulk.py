"""Client side of the hub's data plane (docs/wire.md, internal/wire/bulk).

A hub serves, on its gRPC port, a small TCP protocol for request bodies
that are large byte strings (a pushed gradient). gRPC (grpcio) would cut
the body into messages, copy each into protobuf bytes and again into
HTTP/2 frames; here the safetensors header and the tensors' own memory go
to the kernel in ``socket.sendmsg`` calls (a writev), with no copy in
Python. Control stays on gRPC.

Protocol (little-endian)::

    (TLS first when the hub has it, ALPN "rlhub-dp/2")
    client → server   b"RLHUBDP2" | u16 len | token once per connection
    server → client   b"RLHUBDP2"                   acknowledgement
                  or  u8 3 | u32 len | google.rpc.Status   the hello refused
                      (no token, an unknown one), then the end
    client → server   u8 1 | u16 len | method | u32 len | header (protobuf)
    server → client   u8 2                          continue: send the body
                  or  u8 3 | u32 len | google.rpc.Status   final, no body sent
    client → server   exactly the body's announced bytes  (after continue)
    server → client   u8 4 | u32 len | header | u64 n | n bytes   data (pulls), then
    server → client   u8 3 | u32 len | google.rpc.Status   final

A data frame (the store's pulls and watches) is read with ``recv_into``
straight into a buffer the caller picks once it has seen the frame's
header (:meth:`Client.fetch`); it counts only once the final status that
follows is OK, so a connection that breaks mid-body is an error, never a
short answer.

A final status with code OK carries the response message as its first
detail; any other code is exactly what the gRPC method would have returned,
converted here by :func:`rlhub.errors.from_status` into the same named
exception. A server that does not answer the magic (a bare gRPC server
answers its SETTINGS frame) raises :class:`NotSupported` and is not tried
again for ``NOT_SUPPORTED_FOR`` seconds: the caller uses gRPC.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import ssl
import struct
import termios
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

if TYPE_CHECKING:
    from google.rpc import status_pb2

from rlhub import _channel, errors

MAGIC = b"RLHUBDP2"
PUSH_METHOD = "rlhub.v1.Reducer/Push"

_SILENT = "the hub accepted the connection but sent nothing: it is hung or stopped, or the address is not a hub's"
_NO_ANSWER = " (the hub sent no answer to the request: it is hung or stopped)"

NOT_SUPPORTED_FOR = 60.0
"""Seconds an address that did not speak the data plane is left to gRPC."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a connect, and then the handshake, waits for the hub (within the call's deadline)."""
MAX_IDLE_PER_ADDR = 8
MAX_METHOD_BYTES = 255
MAX_HEADER_BYTES = 1 << 20
MAX_TOKEN_BYTES = _channel.MAX_TOKEN_BYTES
_MAX_STATUS_BYTES = 4 << 20

_KIND_REQUEST, _KIND_CONTINUE, _KIND_FINAL, _KIND_DATA = 1, 2, 3, 4
MAX_DATA_HEADER_BYTES = 1 << 20

try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024


class NothingSent(Exception):
    """Mixed into every error a call raises before the first byte of its
    request (method, header, body) went onto a connection: a bad method
    name or header, a refused or unanswered dial, TLS, the data-plane
    hello (reset, closed, garbled, refused, unanswered: :class:`NoAnswer`).
    Whatever the hub is, it cannot have acted on the request. A failure
    after the request began, or on a reused connection that may have
    taken it, is never one. Callers branch on the type, not on the
    message (``GradClient``: a push not sent cannot be an earlier
    attempt's duplicate); the error keeps its named class (an
    ``isinstance(e, errors.Unavailable)`` holds as before)."""


def _marked(base: type) -> type:
    """``base`` with :class:`NothingSent` mixed in, a module attribute (so
    that it pickles by name, as the named errors do)."""
    name = base.__name__ + "NothingSent"
    cls = type(name, (NothingSent, base), {"__module__": __name__, "__qualname__": name,
                                           "__doc__": f"{base.__name__}: the request was not sent."})
    globals()[name] = cls
    return cls


_NOT_SENT: Dict[type, type] = {
    c: _marked(c) for c in (errors.RlhubError, errors.InvalidArgument, errors.NotFound, errors.StaleVersion,
                            errors.AlreadyExists, errors.QueueFull, errors.Unauthenticated,
                            errors.PermissionDenied, errors.Unavailable, errors.Aborted,
                            errors.DeadlineExceeded)}
_SENT: Dict[type, type] = {v: k for k, v in _NOT_SENT.items()}


def _nothing_sent(e: errors.RlhubError) -> errors.RlhubError:
    """``e``, marked :class:`NothingSent` (its class swapped for the
    subclass that mixes it in: fields, message and named class stay)."""
    cls = _NOT_SENT.get(type(e))
    if cls is not None:
        e.__class__ = cls
    return e


def _maybe_sent(e: errors.RlhubError) -> errors.RlhubError:
    """``e`` without the :class:`NothingSent` mark: a reused connection
    may have taken the request before this error."""
    if isinstance(e, NoAnswer):
        return errors.Unavailable(e.message)
    cls = _SENT.get(type(e))
    if cls is not None:
        e.__class__ = cls
    return e


class NotSupported(NothingSent):
    """The server at an address does not speak the data plane: use gRPC."""


class NoAnswer(NothingSent, errors.Unavailable):
    """A connect or handshake to ``addr`` that got no answer within
    ``HANDSHAKE_TIMEOUT`` while the call had time left: the address takes
    no connection or sends nothing on it (a hung or stopped hub, a dead
    machine, a listener that is not a hub's). Unavailable, as any failure
    to reach the hub; a caller's retries try such an address again only
    once (``NO_ANSWER_TRIES``: ``StoreClient``, ``GradClient``), since a
    hub silent for that long will not start answering on a later try."""

    def __init__(self, message: str, addr: str):
        super().__init__(message)
        self.addr = addr


NO_ANSWER_TRIES = 2
"""Data-plane connects or handshakes to one address that may go unanswered
(``NoAnswer``, ``HANDSHAKE_TIMEOUT`` each) in one call before the call
stops trying it. A hub that sent nothing for that long is hung, stopped or
not a hub: it does not start answering on the fifth try, and the retries
(for a hub restarting or a connection that broke, which fail at once)
spent five 10 s handshakes of the default 60 s timeout on it (a gradient
push: its whole 120 s ``deadline``), to end Unavailable all the same. One
more try covers a hub that was only briefly stalled; then the call ends
Unavailable saying the hub sent nothing (``not_tried_again``; on a
cluster a store push goes to gRPC, which waits for a primary), rather than
holding the caller until its timeout for an error that would say no more."""


def not_tried_again(e: errors.RlhubError, times: int) -> errors.Unavailable:
    """The error a call ends with once ``e.addr`` left ``times``
    (``NO_ANSWER_TRIES``) connects or handshakes unanswered."""
    return errors.Unavailable(f"{e.message} ({times} times in this call: not tried again)")


class _Broken(Exception):
    """The connection broke; ``answered`` says whether the server had sent
    anything for the request."""

    def __init__(self, msg: str, answered: bool):
        super().__init__(msg)
        self.answered = answered


class _Deadline(Exception):
    """The call's deadline ran out; ``answered`` (set by the exchange) says
    whether the server had sent anything for the request."""

    answered = True


class _Refused(Exception):
    """The caller's ``alloc`` refused a data frame (its exception is
    ``__cause__``); the connection is out of step and is closed."""


def _split_addr(addr: str) -> Tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or "/" in addr:
        raise ValueError(addr)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _settimeout(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Deadline()
    sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        _settimeout(sock, deadline)
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _advance(views: List[memoryview], i: int, n: int) -> int:
    """After a vectored send or receive of n bytes from views[i:]: the
    index of the first view not done, the partly done one cut to its rest."""
    while n > 0:
        size = views[i].nbytes
        if n < size:
            views[i] = views[i][n:]
            break
        n -= size
        i += 1
    return i


def _sendmsg_all(sock: socket.socket, bufs: Sequence[Any], deadline: float, rearm: bool = True) -> None:
    """Writes every buffer in order with sendmsg (writev), resuming after
    partial writes; at most IOV_MAX buffers per call. Each write re-arms the
    socket's timeout to the deadline; with ``rearm`` False (the plaintext
    path, whose socket timeout was set once for the call) the deadline is
    only checked between writes, saving a syscall per write."""
    views = [v for v in (memoryview(b).cast("B") for b in bufs) if v.nbytes]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS: one encrypted write per buffer
        for v in views:
            _settimeout(sock, deadline)
            sock.sendall(v)
        return
    i = 0
    while i < len(views):
        if rearm:
            _settimeout(sock, deadline)
        elif time.monotonic() > deadline:
            raise _Deadline()
        i = _advance(views, i, sock.sendmsg(views[i:i + _IOV_MAX]))


class Client:
    """Data-plane calls with idle connections kept per address for reuse
    (one request at a time on a connection). Safe for concurrent use.

    ``close`` closes the idle connections; a call after it opens new ones,
    as ``GradClient``'s gRPC channels are re-created after its ``close``.
    A forked child never reuses its parent's connections (their bytes
    would interleave on the same TCP stream).
    """

    def __init__(self, security: "Optional[_channel.Security]" = None) -> None:
        # TLS settings and token: ``security``, else the process default
        # read at each dial (rlhub._channel.default_security).
        self._security = security
        self._mu = threading.Lock()  # guards the fields below
        self._idle: Dict[str, List[socket.socket]] = {}
        self._busy: Dict[str, Set[socket.socket]] = {}  # connections with a request in flight, by address
        self._aborted: Set[socket.socket] = set()  # of those, the ones abort shut down
        self._no_bulk: Dict[str, float] = {}
        self._gen = 0  # bumped by close: connections taken before it are not kept
        self._pid = os.getpid()
        self.dials = 0
        """Connections opened (handshake done)."""

    def supported(self, addr: str) -> bool:
        """False for NOT_SUPPORTED_FOR seconds after ``addr`` did not answer the magic."""
        with self._mu:
            at = self._no_bulk.get(addr)
        return at is None or time.monotonic() - at > NOT_SUPPORTED_FOR

    def _not_supported(self, addr: str, why: str) -> NotSupported:
        with self._mu:
            self._no_bulk[addr] = time.monotonic()
        return NotSupported(f"{addr} does not speak the data plane: {why}")

    def fetch(self, addr: str, method: str, header: bytes, alloc: Callable[[bytes, int], Any],
              timeout: float, *, answer_within: Optional[float] = None) -> Tuple[Optional[bytes], Any]:
        """A request whose answer is a data frame: ``alloc(frame_header,
        n)`` returns a writable buffer of at least ``n`` bytes (or raises,
        which fails the call with that exception), the body is received
        into it with ``recv_into``, and ``(frame_header, buffer)`` is
        returned once the final status is OK (``(None, None)`` for an OK
        answer without a data frame). Errors as :meth:`call`; what was
        written into the buffer of a failed call is garbage."""
        out: List[Any] = [None, None]
        self.call(addr, method, header, (), None, timeout, answer_within=answer_within, _alloc=alloc, _out=out)
        return out[0], out[1]

    def call(self, addr: str, method: str, header: bytes, body: Sequence[Any], resp: Any,
             timeout: float, *, answer_within: Optional[float] = None,
             _alloc: Optional[Callable[[bytes, int], Any]] = None, _out: Optional[List[Any]] = None) -> None:
        """Sends one request: ``header`` (the method's serialized header
        message), then, if the server asks for it, the ``body`` buffers in
        order, straight from their memory. On success ``resp`` (a protobuf
        message) is filled from the answer.

        Raises the server's answer as a named exception
        (``errors.from_status``); ``NotSupported`` when ``addr`` does not
        speak the data plane; ``DeadlineExceeded`` when ``timeout`` seconds
        ran out; ``Unavailable`` for a broken connection (the request may or
        may not have been served).

        ``answer_within`` (seconds, at most ``timeout``) bounds the dial,
        the handshake and the wait for the answer's first byte: a hub that
        accepts the connection and then sends nothing fails the call
        ``DeadlineExceeded`` then, while an answer that has begun (a long
        poll's version sent at the end of its wait) has until ``timeout``
        to arrive whole.
        """
        m = method.encode()
        if not 0 < len(m) <= MAX_METHOD_BYTES:
            raise _nothing_sent(errors.InvalidArgument(f"bulk: method name {method!r}"))
        if len(header) > MAX_HEADER_BYTES:
            raise _nothing_sent(errors.InvalidArgument(f"bulk: header of {len(header)} bytes exceeds "
                                                       f"{MAX_HEADER_BYTES}"))
        frame = struct.pack("<BH", _KIND_REQUEST, len(m)) + m + struct.pack("<I", len(header)) + bytes(header)
        deadline = time.monotonic() + timeout
        first = deadline if answer_within is None else min(deadline, time.monotonic() + answer_within)
        fresh = False
        taken = False  # a reused connection broke, having maybe taken the request
        while True:
            try:
                sock, reused, gen = self._get(addr, fresh, first)
            except NotSupported as e:
                if taken:  # the request may be on the connection that broke: its outcome is unknown
                    raise errors.Unavailable(f"bulk: {method} to {addr}: {e}") from None
                raise
            except errors.RlhubError as e:
                # The dial, TLS or hello failed: the request goes out only
                # after them. Marked here, once, so that no failure there
                # (today's or one added later) is missed.
                raise (_maybe_sent(e) if taken else _nothing_sent(e)) from None
            exchange = _exchange if isinstance(sock, ssl.SSLSocket) else _exchange_plain
            with self._mu:
                self._busy.setdefault(addr, set()).add(sock)
            try:
                try:
                    st = exchange(sock, frame, body, deadline, _alloc, _out, first)
                finally:
                    with self._mu:
                        busy = self._busy.get(addr)
                        if busy is not None:
                            busy.discard(sock)
                            if not busy:
                                del self._busy[addr]
                        aborted = sock in self._aborted
                        self._aborted.discard(sock)
            except _Refused as e:
                sock.close()
                raise (e.__cause__ or e) from None  # the cause is always set (_read_data)
            except (_Broken, _Deadline) as e:
                sock.close()
                if aborted:
                    raise errors.Unavailable(f"bulk: {method} to {addr}: ended in flight: the primary moved "
                                             f"away from {addr}") from None
                if isinstance(e, _Deadline):
                    raise errors.DeadlineExceeded(f"bulk: {method} to {addr}: deadline exceeded"
                                                  + ("" if e.answered else _NO_ANSWER)) from None
                if reused and not e.answered:
                    # An idle connection the server has since closed (it
                    # restarted, or shut idle ones down): nothing was served.
                    fresh = True
                    taken = True
                    continue
                raise errors.Unavailable(f"bulk: {method} to {addr}: {e}") from None
            except BaseException:
                sock.close()
                raise
            if aborted:
                sock.close()  # answered before the shutdown: the answer stands, the connection does not
            else:
                self._put(addr, sock, gen)
            break
        if st.code != 0:
            raise errors.from_status(st)
        if resp is not None:
            if not st.details:
                raise errors.RlhubError(f"bulk: {method} answered OK without a response")
            if not st.details[0].Unpack(resp):
                raise errors.RlhubError(f"bulk: {method} answered with a {st.details[0].type_url[:200]!r}")

    def _get(self, addr: str, fresh: bool, deadline: float) -> Tuple[socket.socket, bool, int]:
        with self._mu:
            if os.getpid() != self._pid:  # a forked child: the idle sockets are the parent's too
                stale = [s for l in self._idle.values() for s in l]
                self._idle, self._pid = {}, os.getpid()
                self._gen += 1
            else:
                stale = []
            gen = self._gen
            idle = self._idle.get(addr)
            sock = idle.pop() if idle and not fresh else None
        for s in stale:
            s.close()  # this process's descriptor only: the parent's connection stays up
        if sock is not None:
            return sock, True, gen
        return self._dial(addr, deadline), False, gen

    def _dial(self, addr: str, deadline: float) -> socket.socket:
        try:
            host, port = _split_addr(addr)
        except ValueError:
            raise self._not_supported(addr, "not a host:port address") from None
        sec = self._security if self._security is not None else _channel.default_security()
        _channel.check_plaintext_token(addr, sec)  # the handshake would write the token in the clear
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.DeadlineExceeded(f"bulk: dial {addr}: deadline exceeded")
        try:
            sock = socket.create_connection((host, port), timeout=min(left, HANDSHAKE_TIMEOUT))
        except socket.timeout:
            if time.monotonic() >= deadline:
                raise errors.DeadlineExceeded(f"bulk: dial {addr}: deadline exceeded") from None
            raise NoAnswer(f"bulk: dial {addr}: timed out: no answer within {HANDSHAKE_TIMEOUT:g} s", addr) from None
        except OSError as e:
            raise errors.Unavailable(f"bulk: dial {addr}: {e}") from None
        tok = (sec.token or "").encode()
        if len(tok) > MAX_TOKEN_BYTES:
            sock.close()
            raise errors.InvalidArgument(f"bulk: token of {len(tok)} bytes exceeds {MAX_TOKEN_BYTES}")
        got = b""  # the hub's answer to the magic, so far
        tls = sec.tls  # still in the TLS handshake
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hs = min(deadline, time.monotonic() + HANDSHAKE_TIMEOUT)
            _settimeout(sock, hs)
            if sec.tls:
                try:
                    sock = sec.bulk_context().wrap_socket(sock, server_hostname=sec.server_name or host)
                except ssl.SSLError as e:
                    sock.close()
                    raise errors.Unavailable(f"bulk: TLS with {addr}: {e}") from None
                if sock.selected_alpn_protocol() != _channel.BULK_ALPN:
                    sock.close()
                    raise self._not_supported(addr, "TLS without the data plane's ALPN")
                tls = False
            sock.sendall(MAGIC + struct.pack("<H", len(tok)) + tok)
            refusal = None
            while len(got) < len(MAGIC):
                _settimeout(sock, hs)
                b = sock.recv(len(MAGIC) - len(got))
                if not b:
                    break
                got += b
                if got[:1] == bytes([_KIND_FINAL]):
                    refusal = _read_refusal(sock, got[1:], hs)
                    break
                if not MAGIC.startswith(got):
                    break
        except (_Deadline, socket.timeout):
            sock.close()
            # Say what the hub sent: a hung or stopped hub (SIGSTOP) accepts
            # the connection in the kernel and then sends nothing.
            why = ("the TLS handshake did not finish" if tls else
                   _SILENT if not got else f"the hub sent {len(got)} bytes of its answer, then nothing")
            if time.monotonic() >= deadline:
                raise errors.DeadlineExceeded(f"bulk: handshake with {addr}: deadline exceeded: {why}") from None
            raise NoAnswer(f"bulk: handshake with {addr}: timed out: no answer within {HANDSHAKE_TIMEOUT:g} s: {why}",
                           addr) from None
        except OSError as e:
            # A reset too (ConnectionResetError, BrokenPipeError) is the
            # hub gone, not a server without the data plane: one SIGKILLed
            # resets the connections waiting in its accept queue. A bare
            # gRPC server answers the magic with its SETTINGS frame, and a
            # TLS one refusing plaintext closes the connection: those are
            # the bytes or the end read below (as the Go client).
            sock.close()
            raise errors.Unavailable(f"bulk: handshake with {addr}: {e}") from None
        if refusal is not None:
            # The hub refused the hello (its token): the answer to the
            # call, as a request's refusal would be; the data plane stays.
            sock.close()
            raise errors.from_status(refusal)
        if got != MAGIC:
            sock.close()
            raise self._not_supported(addr, f"answered {got[:16]!r}")
        with self._mu:
            self.dials += 1
        return sock

    def _put(self, addr: str, sock: socket.socket, gen: int) -> None:
        with self._mu:
            idle = self._idle.setdefault(addr, [])
            if gen == self._gen and len(idle) < MAX_IDLE_PER_ADDR:
                idle.append(sock)
                return
        sock.close()

    def abort(self, addr: str) -> None:
        """Ends the requests in flight to ``addr`` (each raises
        ``Unavailable``: its outcome is unknown) and closes the idle
        connections to it: a cluster's primary moved away from ``addr``,
        which may be stopped or cut off and would hold them until their
        deadline (``_channel.FollowingChannel.on_move``)."""
        with self._mu:
            idle = self._idle.pop(addr, [])
            busy = list(self._busy.get(addr, ()))
            self._aborted.update(busy)
        for s in idle:
            s.close()
        for s in busy:
            try:
                # The plain socket's shutdown, also under TLS: the owner's
                # recv sees the end of the stream; SSLSocket.shutdown would
                # drop the TLS state under the owner's feet.
                socket.socket.shutdown(s, socket.SHUT_RDWR)
            except OSError:
                pass

    def shutdown(self) -> None:
        """:meth:`close`, and ends the requests in flight to every address
        as :meth:`abort` does (each raises ``Unavailable``): for an owner
        being closed, whose long polls would otherwise run on."""
        with self._mu:
            addrs = list(self._busy)
        for addr in addrs:
            self.abort(addr)
        self.close()

    def close(self) -> None:
        """Closes the idle connections; calls in progress close theirs when done."""
        with self._mu:
            self._gen += 1
            socks = [s for l in self._idle.values() for s in l]
            self._idle = {}
        for s in socks:
            s.close()


def _read_refusal(sock: socket.socket, head: bytes, deadline: float) -> "Optional[status_pb2.Status]":
    """Reads the final status a hub sends in place of the magic when it
    refuses the hello (no token, an unknown or expired one), ``head`` the
    bytes after its kind already read; None when what came is no such
    status (something else answered)."""
    from google.rpc import status_pb2

    try:
        head += _recv_exact(sock, max(0, 4 - len(head)), deadline)
        (n,) = struct.unpack("<I", head[:4])
        if n > _MAX_STATUS_BYTES:
            return None
        raw = head[4:4 + n] + _recv_exact(sock, max(0, n - len(head[4:])), deadline)
    except EOFError:
        return None
    try:
        st = status_pb2.Status.FromString(raw)
    except Exception:  # noqa: BLE001 - a garbled status: not a refusal
        return None
    return st if st.code != 0 else None


def _recv_into(sock: socket.socket, mv: memoryview, deadline: float) -> None:
    """Fills ``mv`` from the socket (``recv_into``, no copy in Python)."""
    got, n = 0, mv.nbytes
    while got < n:
        _settimeout(sock, deadline)
        k = sock.recv_into(mv[got:] if got else mv)
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} body bytes")
        got += k


_Alloc = Callable[[bytes, int], Any]
"""alloc(data header, n): a writable buffer of at least n bytes for the body."""


class Direct:
    """A body's destination that may take it straight into the caller's
    buffers (``pull_into``'s tensors) instead of a staging buffer, given
    by ``alloc`` in place of a buffer.

    On a plaintext connection the reader first waits until the whole body
    and the final frame's first bytes are in the socket's receive queue
    (SO_RCVLOWAT and poll; a body the kernel cannot queue whole, or a
    connection that ends first, takes the staged path instead). Then
    ``plan(take, n)`` reads the body's leading bytes with ``take(k)`` and
    returns ``(consumed, views)``: ``views`` the buffers the rest of the
    body fills in order (their sizes sum to n − len(consumed)), or None
    to stage it; ``plan`` raises to refuse the body (the connection is
    closed, nothing written). Once the bytes are queued the reads that
    follow cannot stop midway, so the views are written whole or not at
    all. Otherwise (TLS, a body not queued whole, plan None) the body goes
    to ``stage(n)`` as an ordinary buffer. ``direct`` says which happened;
    the caller reads the stage only when it is False."""

    __slots__ = ("plan", "stage", "direct")

    def __init__(self, plan: Callable[[Callable[[int], bytes], int], Tuple[bytes, Optional[List[memoryview]]]],
                 stage: Callable[[int], Any]):
        self.plan, self.stage = plan, stage
        self.direct = False


# Bytes that follow a data frame's body when the call succeeds: the final
# frame's kind and status length (an OK status with no response message is
# empty). The direct path waits for them too, so a server that stops after
# the body but before its final frame leaves the caller's buffers unwritten.
_FINAL_HEAD = 5
_SIOCINQ = getattr(termios, "FIONREAD", 0x541B)
_SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", 18)
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 0)  # Linux; 0: not available
# A wake-up with at most _TAIL_BYTES missing is waited out, sleeping
# _TAIL_SLEEPS in turn (3.2 ms in all), before the body is staged. Measured
# with 4 MB versions in the learner loop, load 4–8: with the window clamp
# margin below only a connection's first pull is staged (its window is
# still small) and under 1% of the others wake early; without the margin
# up to half woke early and ~15% were staged.
_TAIL_BYTES = 1 << 20
_CLAMP_MARGIN = 256 << 10
_TAIL_SLEEPS = (25e-6, 50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1600e-6)


def _queued(sock: socket.socket) -> int:
    """Bytes in the socket's receive queue (SIOCINQ)."""
    b = fcntl.ioctl(sock.fileno(), _SIOCINQ, b"\0\0\0\0")
    (n,) = struct.unpack("i", b)
    return int(n)


def _read_data(take: Callable[[int], bytes], into: Callable[[memoryview], None],
               alloc: Optional[_Alloc], out: Optional[List[Any]],
               direct: "Optional[Callable[[Direct, int], None]]" = None) -> None:
    """Reads one data frame's header and body (its kind byte already read)
    with ``take(n)`` (exactly n bytes) and ``into(view)`` (fills view), into
    the buffer ``alloc`` gives; ``out`` receives (header, buffer). When
    ``alloc`` gives a :class:`Direct`, ``direct(sink, n)`` reads the body
    (the plaintext exchange), or without it the sink's stage does."""
    (hl,) = struct.unpack("<I", take(4))
    if hl > MAX_DATA_HEADER_BYTES:
        raise EOFError(f"data header of {hl} bytes exceeds {MAX_DATA_HEADER_BYTES}")
    hdr = take(hl) if hl else b""
    (n,) = struct.unpack("<Q", take(8))
    if alloc is None or out is None:
        raise EOFError("a data frame for a call that expects none")
    try:
        buf = alloc(hdr, n)
        sink = buf if isinstance(buf, Direct) and direct is not None and n else None
        if sink is None:
            if isinstance(buf, Direct):
                buf.direct = False
            mv = memoryview(buf.stage(n) if isinstance(buf, Direct) else buf).cast("B")
            if mv.nbytes < n or mv.readonly:
                raise ValueError(f"receive buffer of {mv.nbytes} bytes for a {n}-byte body")
    except Exception as e:  # noqa: BLE001 - the caller's refusal, raised as it is
        raise _Refused() from e
    if sink is not None and direct is not None:
        direct(sink, n)
    elif n:
        into(mv[:n])
    out[0], out[1] = hdr, buf


def _exchange(sock: socket.socket, frame: bytes, body: Sequence[Any], deadline: float,
              alloc: Optional[_Alloc] = None, out: Optional[List[Any]] = None,
              first: Optional[float] = None) -> "status_pb2.Status":
    """Runs one request; returns the final google.rpc.Status or raises
    ``_Broken`` / ``_Deadline`` / ``_Refused`` (the connection is then out
    of step). The answer's first byte must come by ``first`` (default
    ``deadline``), the rest by ``deadline``."""
    from google.rpc import status_pb2

    first = deadline if first is None else first
    answered = False
    try:
        _settimeout(sock, first)
        sock.sendall(frame)
        kind = _recv_exact(sock, 1, first)[0]
        answered = True
        if kind == _KIND_CONTINUE:
            _sendmsg_all(sock, body, deadline)
            kind = _recv_exact(sock, 1, deadline)[0]
        if kind == _KIND_DATA:
            _read_data(lambda k: _recv_exact(sock, k, deadline), lambda v: _recv_into(sock, v, deadline), alloc, out)
            kind = _recv_exact(sock, 1, deadline)[0]
        if kind != _KIND_FINAL:
            raise _Broken(f"frame kind {kind}, want a final status (3)", answered)
        (n,) = struct.unpack("<I", _recv_exact(sock, 4, deadline))
        if n > _MAX_STATUS_BYTES:
            raise _Broken(f"status of {n} bytes exceeds {_MAX_STATUS_BYTES}", answered)
        raw = _recv_exact(sock, n, deadline)
    except (socket.timeout, _Deadline):
        d = _Deadline()
        d.answered = answered
        raise d from None
    except (OSError, EOFError) as e:
        raise _Broken(str(e) or type(e).__name__, answered) from None
    try:
        return status_pb2.Status.FromString(raw)
    except Exception as e:  # noqa: BLE001 - a garbled answer is a broken connection
        raise _Broken(f"decode status: {e}", answered) from None


# --------------------------------------------------------------------------
# The plaintext exchange with fewer system calls.
#
# A socket with a Python timeout costs, per operation, an ioctl (settimeout
# switches the blocking mode each time) and a poll before the recv or send:
# 19 system calls per gradient push, 12 of them those. On plaintext
# connections the socket is blocking instead, with SO_RCVTIMEO/SO_SNDTIMEO
# armed once per call to the time left (each operation waits at most that,
# and the deadline is checked between operations, so a call ends within
# twice its timeout even against a peer that trickles bytes), and the small
# frames (continue, the final status, a data frame's header) are read
# through one small buffer: one recv each instead of three. TLS sockets keep
# the timeout path (their records cannot be read around).

_READ_AHEAD = 4096
_TIMEVAL = struct.Struct("@ll")


def _arm(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Deadline()
    if sock.gettimeout() is not None:
        sock.settimeout(None)  # once per connection: blocking, bounded by the options below
    sec = int(left)
    tv = _TIMEVAL.pack(sec, max(int((left - sec) * 1e6), 0 if sec else 1))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class _Reader:
    """Reads one exchange's answer: small frames through a read-ahead
    buffer, bodies straight into the caller's memory."""

    __slots__ = ("sock", "deadline", "buf", "mv", "pos", "end")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.buf = bytearray(_READ_AHEAD)
        self.mv = memoryview(self.buf)
        self.pos = self.end = 0

    def _recv_into(self, mv: memoryview) -> int:
        if time.monotonic() > self.deadline:
            raise _Deadline()
        k = self.sock.recv_into(mv)
        if k == 0:
            raise EOFError("connection closed")
        return k

    def take(self, n: int) -> bytes:
        """Exactly n bytes."""
        avail = self.end - self.pos
        if n <= avail:
            out = bytes(self.mv[self.pos:self.pos + n])
            self.pos += n
            return out
        if n > len(self.buf):  # a big header or status: its own buffer
            big = bytearray(n)
            big[:avail] = self.mv[self.pos:self.end]
            self.pos = self.end = 0
            got, bmv = avail, memoryview(big)
            while got < n:
                got += self._recv_into(bmv[got:])
            return bytes(big)
        if self.pos:  # keep what is left at the front
            self.buf[:avail] = self.mv[self.pos:self.end]
            self.pos, self.end = 0, avail
        while self.end < n:
            self.end += self._recv_into(self.mv[self.end:])
        out = bytes(self.mv[:n])
        self.pos = n
        return out

    def into(self, mv: memoryview) -> None:
        """Fills mv: what was read ahead first, then straight from the socket."""
        n = mv.nbytes
        got = min(self.end - self.pos, n)
        if got:
            mv[:got] = self.mv[self.pos:self.pos + got]
            self.pos += got
        while got < n:
            k = self._recv_into(mv[got:])
            got += k

    def into_many(self, views: List[memoryview]) -> None:
        """Fills each view in order: what was read ahead first, then with
        recvmsg_into (a readv) straight from the socket."""
        views = [v for v in views if v.nbytes]
        i = 0
        while i < len(views) and self.pos < self.end:
            v = views[i]
            k = min(self.end - self.pos, v.nbytes)
            v[:k] = self.mv[self.pos:self.pos + k]
            self.pos += k
            if k == v.nbytes:
                i += 1
            else:
                views[i] = v[k:]
        while i < len(views):
            if time.monotonic() > self.deadline:
                raise _Deadline()
            k = self.sock.recvmsg_into(views[i:i + _IOV_MAX])[0]
            if k == 0:
                raise EOFError("connection closed")
            i = _advance(views, i, k)

    def _wait_queued(self, need: int) -> bool:
        """Waits (until the deadline) for ``need`` bytes in the receive
        queue; False when the kernel will not queue that many (its receive
        buffer limit) or the connection ended first."""
        sock = self.sock
        try:
            # Setting SO_RCVLOWAT grows a receive buffer too small for it
            # and then clamps the window to the value (Linux
            # tcp_set_rcvlowat). Clamped to exactly ``need``, the window
            # closes before the last bytes of a later, slightly larger
            # need and the sender stalls (a closed window reopens only
            # when we read): so grow it for _CLAMP_MARGIN more first.
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, need + _CLAMP_MARGIN)
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, need)
            if sock.getsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT) < need:
                return False  # capped at half of net.ipv4.tcp_rmem's max
            # A request/response connection is in delayed-ACK ("pingpong")
            # mode: the kernel holds ACKs back for the next request to
            # carry them. A reader that reads as bytes come acknowledges
            # them anyway (each read opens the window); this one reads
            # nothing until the whole body is in, so while it waits the
            # kernel acknowledges only two full segments at a time, and a
            # sender left with less than that unacknowledged and its
            # congestion window full stalls until its tail-loss probe
            # (2 RTT + 2 jiffies: 8 ms at HZ=250) or our delayed ACK.
            # TCP_QUICKACK leaves pingpong mode for this wait (and sends
            # an ACK already due). Measured in the learner loop (4 MB
            # versions, 2 learners, load 4-8): the hub's loss probes went
            # from 85-250 to 3-77 per 600 gradients and the time in poll
            # halved (docs/benchlog/2026-12-02-s14-speed7.md).
            if _TCP_QUICKACK:
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Deadline()
            p = select.poll()
            p.register(sock, select.POLLIN)
            if not p.poll(max(int(left * 1000), 1)):
                raise _Deadline()
            # Readable also under memory pressure, on a closing window or
            # at the end of the stream: count what is there. The window
            # closes (to at most a segment) just before the last bytes
            # come, as the kernel clamps it to ``need``, and a receive
            # buffer near full wakes it early too: poll would return at
            # once again, so wait for the rest briefly, then stage.
            q = _queued(sock)
            for pause in _TAIL_SLEEPS:
                if q >= need or need - q > _TAIL_BYTES:
                    break
                time.sleep(pause)
                q = _queued(sock)
            return q >= need
        finally:
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, 1)

    def direct(self, sink: Direct, n: int) -> None:
        """Reads an n-byte body for ``sink`` (see :class:`Direct`)."""
        need = n + _FINAL_HEAD - (self.end - self.pos)
        if need <= 0 or self._wait_queued(need):
            try:
                consumed, views = sink.plan(self.take, n)
            except (OSError, EOFError, _Deadline):
                raise
            except Exception as e:  # noqa: BLE001 - the sink's refusal, raised as it is
                raise _Refused() from e
            if views is not None:
                if len(consumed) + sum(v.nbytes for v in views) != n:
                    raise _Refused() from ValueError(f"receive views of {sum(v.nbytes for v in views)} bytes "
                                                     f"after {len(consumed)} for a {n}-byte body")
                self.into_many(views)
                sink.direct = True
                return
        else:
            consumed = b""
        mv = memoryview(sink.stage(n)).cast("B")
        if mv.nbytes < n or mv.readonly:
            raise _Refused() from ValueError(f"receive buffer of {mv.nbytes} bytes for a {n}-byte body")
        mv[:len(consumed)] = consumed
        self.into(mv[len(consumed):n])
        sink.direct = False


def _exchange_plain(sock: socket.socket, frame: bytes, body: Sequence[Any], deadline: float,
                    alloc: Optional[_Alloc] = None, out: Optional[List[Any]] = None,
                    first: Optional[float] = None) -> "status_pb2.Status":
    """_exchange on a plaintext socket (see above)."""
    from google.rpc import status_pb2

    first = deadline if first is None else first
    answered = False
    try:
        _arm(sock, first)
        sock.sendall(frame)
        rd = _Reader(sock, first)
        kind = rd.take(1)[0]
        answered = True
        if first < deadline:  # the answer began: the rest has until the deadline
            _arm(sock, deadline)
            rd.deadline = deadline
        if kind == _KIND_CONTINUE:
            _sendmsg_all(sock, body, deadline, rearm=False)
            kind = rd.take(1)[0]
        if kind == _KIND_DATA:
            _read_data(rd.take, rd.into, alloc, out, rd.direct)
            kind = rd.take(1)[0]
        if kind != _KIND_FINAL:
            raise _Broken(f"frame kind {kind}, want a final status (3)", answered)
        (n,) = struct.unpack("<I", rd.take(4))
        if n > _MAX_STATUS_BYTES:
            raise _Broken(f"status of {n} bytes exceeds {_MAX_STATUS_BYTES}", answered)
        raw = rd.take(n)
    except (socket.timeout, BlockingIOError, _Deadline):  # SO_RCVTIMEO / SO_SNDTIMEO ran out
        d = _Deadline()
        d.answered = answered
        raise d from None
    except (OSError, EOFError) as e:
        raise _Broken(str(e) or type(e).__name__, answered) from None
    try:
        return status_pb2.Status.FromString(raw)
    except Exception as e:  # noqa: BLE001 - a garbled answer is a broken connection
        raise _Broken(f"decode status: {e}", answered) from None
