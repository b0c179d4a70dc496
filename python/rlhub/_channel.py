"""The one place the Python client opens connections to a hub.

Every client (``StoreClient``, ``GradClient``, ``Learner``,
``AggregatorClient``, ``ARSWorker``, weight sync) gets its gRPC channel from
:func:`channel`, and the data plane (``rlhub._bulk``) its TLS settings and
token from :func:`default_security`, so TLS, the bearer token and message
limits are configured once.

What to connect with is a :class:`Security`: passed explicitly, set for the
process with :func:`configure`, or read from the environment variables the
``rlhub`` command line reads too::

    RLHUB_TLS_CA           PEM CA that signs the hub's certificate: use TLS
    RLHUB_TLS_CERT/KEY     this client's certificate and key (mutual TLS)
    RLHUB_TLS_SERVER_NAME  name to check the hub's certificate against
    RLHUB_TOKEN_FILE       file holding the token (or RLHUB_TOKEN, the token)

With none of them set a channel is plaintext with no token: what a hub on
loopback without a token file expects.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import random
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, TypeVar, Union

import grpc

DEFAULT_MAX_MSG_BYTES = 16 << 20
"""Message limit in each direction (the Go seam's dial.DefaultMaxMsgBytes)."""

BULK_ALPN = "rlhub-dp/2"
"""TLS application protocol of the data plane (Go: bulk.ALPN)."""

MAX_TOKEN_BYTES = 1024
"""The longest token the data plane's hello carries (Go: bulk.MaxTokenBytes)."""


@dataclasses.dataclass(frozen=True)
class Security:
    """How to reach a hub: TLS files and a bearer token (all optional)."""

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None
    token: Optional[str] = None

    def __post_init__(self) -> None:
        # A token goes into an HTTP/2 header and the data plane's hello: a
        # white-space or control character (a newline left by `$(cat f)`
        # or a secret mounted as a file) made every gRPC call fail with a
        # bare "Invalid metadata" while the data plane sent it on and was
        # told "unknown token"; one over the hello's 1024 bytes failed
        # InvalidArgument there and Unauthenticated over gRPC. Refused
        # here, before anything is sent, without echoing the secret.
        tok = self.token
        if tok is None or tok == "":
            return
        if not isinstance(tok, str) or not all("!" <= c <= "~" for c in tok) or len(tok) > MAX_TOKEN_BYTES:
            from rlhub import errors
            what = f"a {type(tok).__name__}" if not isinstance(tok, str) else f"{len(tok)} characters"
            raise errors.Unauthenticated(
                f"rlhub: malformed token ({what}): want 1 to {MAX_TOKEN_BYTES} printable ASCII characters "
                "without white space (check RLHUB_TOKEN / the token file)")

    @classmethod
    def from_env(cls) -> "Security":
        """Reads the RLHUB_* variables (see the module doc); RLHUB_TOKEN's
        surrounding white space is ignored, as by the Go clients."""
        token = os.environ.get("RLHUB_TOKEN", "").strip() or None
        path = os.environ.get("RLHUB_TOKEN_FILE")
        if token is None and path:
            token = read_token(path)
        return cls(ca=os.environ.get("RLHUB_TLS_CA") or None, cert=os.environ.get("RLHUB_TLS_CERT") or None,
                   key=os.environ.get("RLHUB_TLS_KEY") or None,
                   server_name=os.environ.get("RLHUB_TLS_SERVER_NAME") or None, token=token)

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        def read(p: Optional[str]) -> Optional[bytes]:
            if p is None:
                return None
            with open(p, "rb") as f:
                return f.read()
        if (self.cert is None) != (self.key is None):
            raise ValueError("rlhub: a client certificate needs both cert and key")
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca), private_key=read(self.key),
                                            certificate_chain=read(self.cert))

    def bulk_context(self) -> ssl.SSLContext:
        """An SSL context for the data plane (ALPN ``rlhub-dp/2``)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        ctx.set_alpn_protocols([BULK_ALPN])
        return ctx


def _loopback_addr(addr: str) -> bool:
    """Whether ``addr`` (a gRPC target or "host:port") stays on this
    machine: "localhost", a loopback IP (127.0.0.0/8, ::1), or a socket
    file. Names are not resolved: as for the Go seam
    (netsec.IsLoopback)."""
    if addr.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
    host = addr
    if addr.startswith("["):
        host = addr[1:addr.find("]")] if "]" in addr else addr
    elif addr.count(":") == 1:
        host = addr.rpartition(":")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext_token(addr: str, security: Security) -> None:
    """Raises ``rlhub.Unauthenticated`` when ``security`` would send its
    token in plaintext to ``addr`` off loopback. A hub off loopback that
    takes tokens serves TLS (``rlhub serve`` refuses otherwise), so such a
    client is misconfigured or talking to an impostor: it is refused
    before anything is sent (docs/security.md)."""
    if security.tls or not security.token or _loopback_addr(addr):
        return
    from rlhub import errors
    raise errors.Unauthenticated(
        f"rlhub: refusing to send the token in plaintext to {addr[:80]!r}, which is not a loopback address: "
        "give the hub's CA to use TLS (Security(ca=...) or RLHUB_TLS_CA; the command line's --tls-ca)")


def read_token(path: str) -> str:
    """The token in a file (surrounding white space ignored)."""
    with open(path, "r", encoding="utf-8") as f:
        tok = f.read().strip()
    if not tok or any(c.isspace() for c in tok):
        raise ValueError(f"rlhub: token file {path} must hold one token")
    return tok


_mu = threading.Lock()
_default: Optional[Security] = None


def configure(security: Optional[Security]) -> None:
    """Sets the process-wide :class:`Security` every client uses from now on
    (``None`` goes back to the environment)."""
    global _default
    with _mu:
        _default = security


def default_security() -> Security:
    """The :func:`configure`'d Security, else one read from the environment."""
    with _mu:
        d = _default
    return d if d is not None else Security.from_env()


# A hub restarted is back within a second or two: reconnect from 50 ms
# backing off to 1 s. gRPC's defaults (1 s growing to 120 s) leave a
# channel that failed to connect through an outage of a few seconds
# failing fast ("Failed to connect") for seconds after the hub is back,
# longer than a client's retries of a call wait.
_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
              ("grpc.max_reconnect_backoff_ms", 1000)]

KEEPALIVE_MS = (30_000, 20_000)
"""(time, timeout): a channel pings its hub after ``time`` ms without
traffic, idle or not, and drops the connection (its calls fail
Unavailable) when ``timeout`` ms pass without the answer, as the Go
clients do (internal/dial; hubs allow a ping every 10 s). Without it a
stream waiting on a hub that hangs (stopped, or its machine cut off: no
reset comes) waits forever: a watch has no deadline."""


def _keepalive() -> List[Tuple[str, Any]]:
    t, timeout = KEEPALIVE_MS
    return [("grpc.keepalive_time_ms", t), ("grpc.keepalive_timeout_ms", timeout),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # default 2: a quiet watch would stop pinging
            # How long any ping waits for its answer: in grpcio 1.85
            # keepalive_timeout_ms alone did not end a stream on a silent hub.
            ("grpc.http2.ping_timeout_ms", timeout)]


def channel(addr: str, options: Optional[Sequence[Tuple[str, Any]]] = None,
            security: Optional[Security] = None) -> grpc.Channel:
    """A gRPC channel to ``addr``: TLS when ``security`` (default
    :func:`default_security`) names a CA or certificate, the token on every
    call, message limits of ``DEFAULT_MAX_MSG_BYTES``, a reconnect
    back-off of 50 ms to 1 s (``_RECONNECT``) and keepalive pings
    (``KEEPALIVE_MS``) unless ``options`` set them.
    ``addr`` may name a cluster ("h1:p1,h2:p2" or "etcd://E/NAME"): the
    channel then follows its primary (:class:`FollowingChannel`).
    A token without TLS is refused for an address off loopback
    (:func:`check_plaintext_token`, ``rlhub.Unauthenticated``)."""
    sec = security if security is not None else default_security()
    if "," in addr or addr.startswith("etcd://"):
        t = parse_target(addr)
        for h in t.hubs:  # an etcd:// primary is checked as it is learned (FollowingChannel.offer)
            check_plaintext_token(h, sec)
        if t.clustered:
            return FollowingChannel(t, options, sec)
        addr = t.hubs[0]
    check_plaintext_token(addr, sec)
    opts: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", DEFAULT_MAX_MSG_BYTES),
                                   ("grpc.max_send_message_length", DEFAULT_MAX_MSG_BYTES),
                                   *_RECONNECT, *_keepalive()]
    given = dict(options or ())
    opts = [(k, given.pop(k, v)) for k, v in opts] + list(given.items())
    if sec.tls:
        if sec.server_name:
            opts.append(("grpc.ssl_target_name_override", sec.server_name))
        ch = grpc.secure_channel(addr, sec.grpc_credentials(), options=opts)
    else:
        ch = grpc.insecure_channel(addr, options=opts)
    if sec.token:
        ch = grpc.intercept_channel(ch, _TokenInterceptor(sec.token))
    return ch


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Metadata = Tuple[Tuple[str, Union[str, bytes]], ...]


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: grpc.ClientCallDetails, metadata: _Metadata):
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call (plaintext or
    TLS alike; the Go seam does the same)."""

    def __init__(self, token: str):
        self._md = ("authorization", "Bearer " + token)

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _Details(d, tuple(d.metadata or ()) + (self._md,))

    def intercept_unary_unary(self, continuation: Callable[[grpc.ClientCallDetails, _Req], _Resp],
                              client_call_details: grpc.ClientCallDetails, request: _Req) -> _Resp:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Callable[[grpc.ClientCallDetails, _Req], _Resp],
                               client_call_details: grpc.ClientCallDetails, request: _Req) -> _Resp:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Callable[[grpc.ClientCallDetails, Iterator[_Req]], _Resp],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Iterator[_Req]) -> _Resp:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable[[grpc.ClientCallDetails, Iterator[_Req]], _Resp],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Iterator[_Req]) -> _Resp:
        return continuation(self._details(client_call_details), request_iterator)


# --- Following a cluster's primary -------------------------------------------
#
# An address may name a cluster instead of one hub, as in the Go seam
# (internal/dial, docs/cluster.md "Clients"):
#
#     "h1:p1,h2:p2"            any of these hubs answers Cluster/Primary
#     "etcd://e1:2379/NAME"    read cluster NAME's primary from etcd (its
#                              JSON gateway, /v3/kv/range)
#
# :func:`channel` then returns a :class:`FollowingChannel`: calls go to the
# primary, a unary call is sent only on a connection that is READY (a call
# made while there is none waits, within its timeout, and was never sent),
# a call refused by a standby (UNAVAILABLE, trailer ``rlhub-primary``) is
# sent again to the primary it names, a read whose connection died is sent
# again, and any other call whose connection died is raised to the caller
# (its outcome is unknown). An answer with an older epoch than one already
# seen is never followed back. Given etcd, a thread watches the election:
# when the primary moves to another hub, the old one's channel is closed,
# ending what was in flight there (reads are sent again; the rest raise
# :class:`PrimaryMoved`) instead of leaving it to a stalled connection.

import base64
import json
import re
from concurrent import futures as _futures

PRIMARY_TRAILER = "rlhub-primary"
EPOCH_TRAILER = "rlhub-epoch"
FOLLOW_TIMEOUT = 120.0
"""Bound of a unary call on a cluster target given no timeout (seconds)."""
RESOLVE_TIMEOUT = 3.0
MAX_FOLLOW_ATTEMPTS = 8
_BACKOFF0, _BACKOFF_MAX = 0.05, 1.0
_LOOKUP_EVERY_MAX = 0.1  # while waiting for a primary, look it up at least this often (Go: waitResolveEvery)
_MOVES_KEPT = 16  # channels closed by a move, remembered to name the move in their calls' errors
_MAX_TARGET_BYTES = 4096
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_REFUSAL = re.compile(r"this hub is a standby; the primary is (unknown|(\S+) \(epoch (\d+)\))")

IDEMPOTENT = frozenset({
    "/rlhub.v1.Cluster/Primary", "/rlhub.v1.ModelStore/Pull", "/rlhub.v1.ModelStore/List",
    "/rlhub.v1.Reducer/Secondaries", "/rlhub.v1.Reducer/Stats", "/rlhub.v1.ReducerPrimary/Describe",
    "/rlhub.v1.WeightSync/Status", "/rlhub.v1.LearnerAggregator/Resources",
    "/rlhub.v1.LearnerAggregator/Status", "/rlhub.v1.LearnerAggregator/GetDataDemand",
    "/rlhub.v1.ARS/PullPolicy", "/grpc.health.v1.Health/Check",
})
"""Unary methods sent again after their connection died (reads; the Go
seam's list)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed address: one hub, a list of hubs, or etcd + a cluster name."""

    hubs: Tuple[str, ...] = ()
    etcd: Tuple[str, ...] = ()
    cluster: str = ""

    @property
    def clustered(self) -> bool:
        return len(self.hubs) > 1 or bool(self.etcd)

    def __str__(self) -> str:
        if self.etcd:
            return "etcd://" + ",".join(e.replace("http://", "", 1) for e in self.etcd) + "/" + self.cluster
        return ",".join(self.hubs)


def parse_target(s: str) -> Target:
    """Reads an address string (see above); ``ValueError`` with a bounded
    message on bad input."""
    if len(s) > _MAX_TARGET_BYTES:
        raise ValueError(f"rlhub: address of {len(s)} bytes is too long")
    if s.startswith("etcd://"):
        rest = s[len("etcd://"):]
        eps, name = rest, "rlhub"
        i = rest.rfind("/")
        if i >= 0 and not rest[:i].endswith(":/"):
            eps, name = rest[:i], rest[i + 1:]
        if not _CLUSTER_NAME.match(name):
            raise ValueError(f"rlhub: cluster name {name[:80]!r} must match {_CLUSTER_NAME.pattern}")
        urls = tuple(e if "://" in e else "http://" + e for e in (x.strip() for x in eps.split(",")) if e)
        if not urls:
            raise ValueError(f"rlhub: {s[:80]!r} names no etcd endpoint")
        return Target(etcd=urls, cluster=name)
    hubs = tuple(h for h in (x.strip() for x in s.split(",")) if h)
    if not hubs:
        raise ValueError("rlhub: empty hub address")
    if len(hubs) > 1:
        for h in hubs:
            if ":" not in h:
                raise ValueError(f"rlhub: hub address {h[:80]!r} in a list must be host:port")
    return Target(hubs=hubs)


def etcd_target(endpoints: str, cluster: str = "rlhub") -> str:
    """The address of ``cluster``'s primary read from etcd ``endpoints``
    (comma-separated host:port)."""
    eps = [e.strip().replace("http://", "", 1) for e in endpoints.split(",") if e.strip()]
    return "etcd://" + ",".join(eps) + "/" + (cluster or "rlhub")


def refusal(err: Any) -> Optional[Tuple[str, int]]:
    """The primary a standby's refusal names, ``("", 0)`` when it names
    none, or None when ``err`` (a ``grpc.RpcError``, an rlhub error from the
    data plane, or a message) is not a refusal."""
    msg = err if isinstance(err, str) else None
    if isinstance(err, grpc.RpcError):
        try:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                return None
            tm: Any = err.trailing_metadata() or ()
            md: Dict[str, Any] = {str(k): v for k, v in tm}
            if PRIMARY_TRAILER in md:
                return _named(str(md[PRIMARY_TRAILER]), str(md.get(EPOCH_TRAILER, "")))
            msg = err.details() or ""
        except AttributeError:
            msg = str(err)
    elif msg is None:
        msg = str(err)
    m = _REFUSAL.search(msg)
    if m is None:
        return None
    if m.group(1) == "unknown":
        return ("", 0)
    return _named(m.group(2), m.group(3))


_MAX_ADDR_BYTES = 300


def _named(addr: str, epoch: str) -> Tuple[str, int]:
    """The primary a refusal names, bounded as the Go client bounds it
    (internal/cluster fromPair): an address over 300 bytes or holding white
    space, or an epoch that is not a number below 2**64, names none, and the
    client resolves again instead of dialling it or pinning its epoch."""
    if (not addr or len(addr) > _MAX_ADDR_BYTES or any(c.isspace() for c in addr)
            or not epoch.isdigit() or len(epoch) > 20 or int(epoch) >= 1 << 64):
        return ("", 0)
    return (addr, int(epoch))


class NoPrimary(grpc.RpcError):
    """No primary answered within the call's bound: raised in place of the
    call's own error, with the same ``code()``; UNAVAILABLE when no primary
    was ready to send it to (an election running, the primary down)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Tuple[()]:
        return ()

    def __str__(self) -> str:
        return f"<NoPrimary {self._code}: {self._details}>"


class PrimaryMoved(NoPrimary):
    """A call that was in flight on a primary when the cluster's primary
    moved to another hub (Go: ``dial.PrimaryMovedError``): its connection
    was closed to end it, so its outcome is unknown. ``code()`` is
    UNAVAILABLE; reads (``IDEMPOTENT``) are sent again to the new primary
    instead of raising it."""

    def __init__(self, cluster: str, old: Tuple[str, int], new: Tuple[str, int]):
        super().__init__(grpc.StatusCode.UNAVAILABLE,
                         f"rlhub: cluster {cluster}: the primary moved from {old[0]} (epoch {old[1]}) to "
                         f"{new[0]} (epoch {new[1]}) while this was in flight; its outcome is unknown")


def _connect(ch: grpc.Channel) -> None:
    """Makes an idle channel connect now (gRPC backs off between attempts
    itself), as Go's ``ClientConn.Connect``. grpc.Channel has no public
    method for it: this is the call ``subscribe(try_to_connect=True)``
    makes from its poller thread, made here at once. Through subscribe
    the request would stay pending up to 0.2 s, and a channel closed
    meanwhile makes that poller raise in its thread."""
    cy = getattr(ch, "_channel", None)
    if cy is not None and hasattr(cy, "check_connectivity_state"):
        cy.check_connectivity_state(True)
    else:  # another grpc.Channel implementation: the public, pending way
        ch.subscribe(_poke, try_to_connect=True)
        ch.unsubscribe(_poke)


def _poke(_: grpc.ChannelConnectivity) -> None:
    """A subscription made only for its try_to_connect."""


class FollowingChannel(grpc.Channel):
    """A ``grpc.Channel`` to whichever hub is a cluster's primary (see the
    comment above :class:`Target`). Thread-safe."""

    def __init__(self, target: Target, options: Optional[Sequence[Tuple[str, Any]]] = None,
                 security: Optional[Security] = None):
        self.target = target
        self._opts = list(options or ())
        self._sec = security if security is not None else default_security()
        self._cv = threading.Condition()
        self._cur: Tuple[str, int] = ("", 0)
        self._ch: Optional[grpc.Channel] = None
        self._state: Optional[grpc.ChannelConnectivity] = None
        self._stale = True
        self._last_err: Optional[str] = None
        self._seeds: Dict[str, grpc.Channel] = {}
        self._retired: List[grpc.Channel] = []
        self._moves: List[Tuple[grpc.Channel, PrimaryMoved]] = []  # the newest _MOVES_KEPT
        self._on_move: List["weakref.WeakMethod[Callable[[str], None]]"] = []
        self._closed = False
        self._stop = threading.Event()
        self._watcher_thread: Optional[threading.Thread] = None
        if target.etcd:
            self._watcher_thread = threading.Thread(target=self._watch_election, name="rlhub-primary-watch",
                                                    daemon=True)
            self._watcher_thread.start()

    # -- where the primary is
    def primary(self) -> Optional[Tuple[str, int]]:
        """(address, epoch) of the primary followed now, or None."""
        with self._cv:
            return self._cur if self._cur[0] else None

    def offer(self, addr: str, epoch: int) -> None:
        """Follows ``addr`` unless an answer with a newer epoch was seen;
        ``addr`` "" asks for a fresh lookup."""
        ended: Optional[grpc.Channel] = None
        with self._cv:
            if not addr:
                self._stale = True
                return
            if self._closed or epoch < self._cur[1] or (addr, epoch) == self._cur:
                self._stale = False
                return
            # A primary learned at run time (etcd, a refusal) is refused as
            # a given address is, before anything changes (rlhub.Unauthenticated).
            check_plaintext_token(addr, self._sec)
            old, was = self._ch, self._cur
            self._cur, self._stale = (addr, epoch), False
            self._ch = channel(addr, options=self._opts, security=self._sec)
            self._state = None
            self._ch.subscribe(self._watcher(self._ch), try_to_connect=True)
            if old is not None and was[0] != addr:
                # Another hub: what is in flight on the old one is given up
                # (a stopped or cut-off primary would hold it until its
                # deadline), as the Go seam ends the old primary's term.
                ended = old
                self._moves = self._moves[-(_MOVES_KEPT - 1):] + [(old, PrimaryMoved(str(self.target), was,
                                                                                    (addr, epoch)))]
            elif old is not None:
                self._retired.append(old)  # the same hub: calls in flight on it finish there
            self._cv.notify_all()
        if ended is not None:
            ended.close()
            with self._cv:
                fns = [f for f in (r() for r in self._on_move) if f is not None]
            for fn in fns:
                fn(was[0])

    def on_move(self, fn: Callable[[str], None]) -> None:
        """Calls ``fn(old address)`` each time the primary moves to another
        hub, after the old one's channel was closed: a data-plane client
        ends its requests in flight there (``_bulk.Client.abort``). ``fn`` is
        a bound method, held weakly."""
        with self._cv:
            self._on_move = [r for r in self._on_move if r() is not None] + [weakref.WeakMethod(fn)]

    def moved(self, ch: grpc.Channel) -> Optional[PrimaryMoved]:
        """The move that closed ``ch``, or None when it was not closed by
        one."""
        with self._cv:
            for c, e in self._moves:
                if c is ch:
                    return e
        return None

    def _watch_election(self) -> None:
        """Follows the election in etcd (a watch of its prefix through the
        JSON gateway: :meth:`rlhub.discover.Gateway.watch`) and offers each
        new primary as it is elected, so that the primary is known before a
        call fails on the old one and what was in flight there ends
        (:meth:`offer`). The watch and its reads go to one etcd endpoint,
        the first chosen at random (a fleet's watches spread over the
        members); one that fails — its member silent for 2 s, as a member
        whose machine died or was cut off is, or refusing — moves to the
        next after a back-off of 50 ms doubling to 1 s (Go:
        ``cluster.Reader.WatchLeader``)."""
        from rlhub import discover
        wait, ep = _BACKOFF0, random.randrange(len(self.target.etcd))

        def on_events(_: List[Dict[str, Any]]) -> None:
            self._offer_elected(ep)  # where the event came from, which has just answered

        while not self._stop.is_set():
            try:
                rev = self._offer_elected(ep)
                wait = _BACKOFF0
                discover.gateway(self.target.etcd).watch(_election_prefix(self.target), rev + 1, on_events,
                                                         self._stop, ep)
            except Exception:  # noqa: BLE001 - etcd unreachable or refusing: look again, on the next member
                ep += 1
                self._stop.wait(wait)
                wait = min(2 * wait, _BACKOFF_MAX)

    def _offer_elected(self, endpoint: int) -> int:
        """Offers the primary etcd endpoint number ``endpoint`` names now
        (none while an election runs, nor while the record names no usable
        address), read within the watch's bound; returns the revision read."""
        from rlhub import discover, errors
        resp = _election_range(self.target, discover._WATCH_SILENCE, endpoint)
        try:
            leader = _leader_of(resp, self.target.cluster)
        except errors.Unavailable:
            # A refused record (_leader_of) names no primary; etcd answered,
            # so the watch goes on and its next change is read (Go:
            # cluster.status). Raising would take it for a failing member:
            # no watch, the election read again about once a second.
            leader = None
        if leader is not None:
            self.offer(*leader)
        return int(resp.get("header", {}).get("revision", 0))

    def _watcher(self, ch: grpc.Channel) -> Callable[[grpc.ChannelConnectivity], None]:
        def on(state: grpc.ChannelConnectivity) -> None:
            with self._cv:
                if ch is not self._ch:
                    return
                self._state = state
                if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                    self._stale = True
                self._cv.notify_all()
                if state == grpc.ChannelConnectivity.IDLE and not self._closed:
                    # Calls wait for READY, so none would make an idle
                    # channel connect: a new one reports IDLE first, and
                    # the primary's connection goes idle when the hub
                    # closes it (a standby's connections close as it
                    # becomes the primary). Under the lock: offer and close
                    # close a channel only after it stopped being _ch or
                    # _closed was set.
                    _connect(ch)
        return on

    def _seed(self, addr: str) -> grpc.Channel:
        with self._cv:
            ch = self._seeds.get(addr)
            if ch is None:
                ch = self._seeds[addr] = channel(addr, security=self._sec)
            return ch

    def resolve(self, timeout: float = RESOLVE_TIMEOUT) -> Tuple[str, int]:
        """Asks etcd, or every seed hub at once, where the primary is; of
        the hubs' answers the largest epoch wins. Raises ``Unavailable``
        (rlhub.errors) when none answers with one."""
        from rlhub import errors
        if self.target.etcd:
            return _etcd_leader(self.target, timeout)
        from rlhub._proto.rlhub.v1 import cluster_pb2, cluster_pb2_grpc
        calls = []
        for h in self.target.hubs:
            stub = cluster_pb2_grpc.ClusterStub(self._seed(h))
            calls.append((h, stub.Primary.future(cluster_pb2.PrimaryRequest(), timeout=timeout)))
        best: Tuple[str, int] = ("", 0)
        problems = []
        for h, f in calls:
            try:
                r = f.result()
            except grpc.RpcError as e:
                problems.append(f"{h}: {e.code().name} {(e.details() or '')[:200]}")
                continue
            # Bounded as a refusal's primary is (_named): an address no
            # refusal could name, names none.
            named = _named(r.address, str(r.epoch))
            if named[0] and (not best[0] or named[1] > best[1]):
                best = named
        if not best[0]:
            why = "; ".join(problems) if problems else "no hub knows a primary (an election is running)"
            raise errors.Unavailable(f"rlhub: no hub of {self.target} answered where the primary is: {why}")
        return best

    def _ready(self, deadline: float) -> grpc.Channel:
        """The primary's channel once it is READY, resolving as needed;
        :class:`NoPrimary` (UNAVAILABLE, naming the cluster and what the
        last lookup said) when there is none by ``deadline``: a caller's
        lookups and waits all come out of that one budget."""
        from rlhub import errors
        wait = _BACKOFF0
        while True:
            with self._cv:
                if self._closed:
                    raise ValueError("rlhub: channel closed")
                stale, ch, state = self._stale, self._ch, self._state
            if stale or ch is None:
                try:
                    self.offer(*self.resolve(min(RESOLVE_TIMEOUT, max(0.05, deadline - time.monotonic()))))
                    with self._cv:
                        self._stale, self._last_err = False, None
                except errors.Unauthenticated:
                    raise  # a token the primary's address must not see in plaintext: waiting changes nothing
                except Exception as e:  # noqa: BLE001 - kept for the final error
                    with self._cv:
                        self._last_err = str(e)[:1000]
            with self._cv:
                if self._ch is not None and self._state == grpc.ChannelConnectivity.IDLE and not self._closed:
                    _connect(self._ch)  # idle since its last report (see _watcher)
                end = min(deadline, time.monotonic() + max(wait, 0.2))
                while (self._ch is None or self._state != grpc.ChannelConnectivity.READY) and not self._stale:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if self._ch is not None and self._state == grpc.ChannelConnectivity.READY:
                    return self._ch
                if self._ch is not None and self._state != grpc.ChannelConnectivity.READY:
                    self._stale = True  # not connecting: ask again where the primary is
            if time.monotonic() >= deadline:
                # Never sent: the cluster is unavailable, as a hub that is
                # down is (a call that ran out on the primary is
                # DEADLINE_EXCEEDED, and may have been applied).
                raise self.no_primary(grpc.StatusCode.UNAVAILABLE, not_sent=True)
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            # Not more than _LOOKUP_EVERY_MAX between lookups: a primary
            # elected meanwhile is found within it, not a second later.
            wait = min(2 * wait, _LOOKUP_EVERY_MAX)

    def no_primary(self, code: grpc.StatusCode, why: str = "", not_sent: bool = False) -> NoPrimary:
        """The error of a call that found no primary to answer it; with
        ``not_sent``, one that was never sent (no primary was ready)."""
        with self._cv:
            cur, last = self._cur, self._last_err
        where = f"last primary {cur[0]} (epoch {cur[1]}) not reachable" if cur[0] else "no primary found yet"
        if last:
            where += "; last lookup: " + last
        if why:
            where += "; " + why[:500]
        if not_sent:
            where += "; the call was not sent"
        return NoPrimary(code, f"rlhub: cluster {self.target}: {where}")

    def _failed(self, e: grpc.RpcError) -> bool:
        """Acts on a call's failure; True when a standby refused it (not
        applied)."""
        try:
            code = e.code()
        except AttributeError:
            return False
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            # The primary may be cut off by a partition: its connection
            # stalls instead of failing, and would stay READY until the
            # keepalive gives up. The next call looks the primary up first
            # (the same one: nothing changes).
            with self._cv:
                self._stale = True
            return False
        if code != grpc.StatusCode.UNAVAILABLE:
            return False
        r = refusal(e)
        if r is not None:
            self.offer(*r)
            return True
        with self._cv:
            self._stale = True
        return False

    # -- grpc.Channel
    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    **kw: Any) -> Any:
        return _FollowUnary(self, method, request_serializer, response_deserializer, kw)

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     **kw: Any) -> Any:
        return _FollowStream(self, "unary_stream", method, request_serializer, response_deserializer, kw)

    def stream_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     **kw: Any) -> Any:
        return _FollowStream(self, "stream_unary", method, request_serializer, response_deserializer, kw)

    def stream_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                      **kw: Any) -> Any:
        return _FollowStream(self, "stream_stream", method, request_serializer, response_deserializer, kw)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        ch = self._ready(time.monotonic() + FOLLOW_TIMEOUT)
        ch.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        with self._cv:
            chans = [c for c in [self._ch, *self._retired] if c is not None]
        for c in chans:
            try:
                c.unsubscribe(callback)
            except (KeyError, ValueError):
                pass

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            chans = [c for c in [self._ch, *self._retired, *self._seeds.values()] if c is not None]
            self._cv.notify_all()
        if self._watcher_thread is not None:
            from rlhub import discover
            self._stop.set()
            discover.gateway(self.target.etcd).interrupt(self._stop)
            self._watcher_thread.join()
        for c in chans:
            c.close()

    def __enter__(self) -> "FollowingChannel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _left(deadline: float, timeout: Optional[float]) -> Optional[float]:
    """What is left until ``deadline`` of a call given ``timeout`` (None:
    the call has none, and gets none once its primary was found)."""
    return None if timeout is None else max(0.001, deadline - time.monotonic())


def retry_following(deadline: float, attempt: Callable[[float], _Resp],
                    again: Callable[[Exception], Optional[bool]],
                    give_up: Callable[[Exception], BaseException]) -> _Resp:
    """Runs ``attempt(seconds left until deadline)`` until it returns: the
    one back-off loop of calls that follow a cluster's primary (the Go
    seam's ``follower.unary``). When it raises a ``grpc.RpcError`` or
    ``ValueError``, ``again(e)`` says what to do: None raises ``e``, False
    tries again at once (nothing reached a primary: a move closed the
    channel first), True after a back-off of 50 ms doubling to 1 s (a
    standby refused it; a read whose primary went away). At most
    ``MAX_FOLLOW_ATTEMPTS`` attempts, and no back-off that would end after
    ``deadline`` (the caller's whole budget: ``attempt`` bounds its own
    primary lookup by it); then ``give_up(e)`` is raised for the last
    error."""
    wait = _BACKOFF0
    for n in range(1, MAX_FOLLOW_ATTEMPTS + 1):
        try:
            return attempt(max(0.001, deadline - time.monotonic()))
        except (grpc.RpcError, ValueError) as e:
            how = again(e)
            if how is None:
                raise
            if n == MAX_FOLLOW_ATTEMPTS or (how and time.monotonic() + wait >= deadline):
                out = give_up(e)
                if out is e:
                    raise
                raise out from e
            if how:
                time.sleep(wait)
                wait = min(2 * wait, _BACKOFF_MAX)
    raise AssertionError("unreachable")


class _FollowUnary:
    def __init__(self, fc: FollowingChannel, method: str, ser: Any, deser: Any, kw: Dict[str, Any]):
        self._fc, self._method, self._ser, self._deser, self._kw = fc, method, ser, deser, kw

    def _mc(self, ch: grpc.Channel) -> Any:
        return ch.unary_unary(self._method, self._ser, self._deser, **self._kw)

    def _invoke(self, with_call: bool, request: Any, timeout: Optional[float] = None, metadata: Any = None,
                credentials: Any = None, wait_for_ready: Any = None, compression: Any = None) -> Any:
        fc = self._fc
        deadline = time.monotonic() + (timeout if timeout is not None else FOLLOW_TIMEOUT)
        on: List[grpc.Channel] = []  # the channel of the latest attempt

        def attempt(left: float) -> Any:
            on.clear()
            on.append(fc._ready(deadline))
            left = max(0.001, deadline - time.monotonic())
            mc = self._mc(on[0])
            if with_call:
                return mc.with_call(request, timeout=left, metadata=metadata, credentials=credentials,
                                    wait_for_ready=wait_for_ready, compression=compression)
            return mc(request, timeout=left, metadata=metadata, credentials=credentials,
                      wait_for_ready=wait_for_ready, compression=compression)

        def again(e: Exception) -> Optional[bool]:
            if not on:
                return None  # from _ready: no primary by the deadline
            ch = on[0]
            if isinstance(e, ValueError):
                # Closed by a move before the call was made: nothing was sent.
                return None if fc.moved(ch) is None else False
            assert isinstance(e, grpc.RpcError)
            moved = fc.moved(ch)
            if moved is not None and e.code() == grpc.StatusCode.CANCELLED:
                if self._method in IDEMPOTENT:
                    return False  # a read: sent again, to the new primary
                raise moved from e
            if not fc._failed(e):
                code: grpc.StatusCode = e.code()
                if code != grpc.StatusCode.UNAVAILABLE or self._method not in IDEMPOTENT:
                    return None  # sent; its outcome is the caller's to judge
            return True

        return retry_following(deadline, attempt, again,
                               lambda e: fc.no_primary(e.code(), e.details() or "") if isinstance(e, grpc.RpcError)
                               else e)

    def __call__(self, request: Any, **kw: Any) -> Any:
        return self._invoke(False, request, **kw)

    def with_call(self, request: Any, **kw: Any) -> Any:
        return self._invoke(True, request, **kw)

    def future(self, request: Any, timeout: Optional[float] = None, **kw: Any) -> Any:
        deadline = time.monotonic() + (timeout if timeout is not None else FOLLOW_TIMEOUT)
        ch = self._fc._ready(deadline)
        return self._mc(ch).future(request, timeout=_left(deadline, timeout), **kw)


class _FollowStream:
    """A streaming call goes to the primary once (streams are not resent);
    its failure makes the next call look the primary up again."""

    def __init__(self, fc: FollowingChannel, kind: str, method: str, ser: Any, deser: Any, kw: Dict[str, Any]):
        self._fc, self._kind, self._method, self._ser, self._deser, self._kw = fc, kind, method, ser, deser, kw

    def _mc(self, timeout: Optional[float]) -> Tuple[grpc.Channel, Any, Optional[float]]:
        """The primary's channel, the call on it, and what is left of
        ``timeout`` (None: none) for the stream itself once it was found."""
        deadline = time.monotonic() + (timeout if timeout is not None else FOLLOW_TIMEOUT)
        ch = self._fc._ready(deadline)
        return ch, getattr(ch, self._kind)(self._method, self._ser, self._deser, **self._kw), _left(deadline, timeout)

    def __call__(self, request_or_iterator: Any, timeout: Optional[float] = None, **kw: Any) -> Any:
        ch, mc, left = self._mc(timeout)
        try:
            out = mc(request_or_iterator, timeout=left, **kw)
        except grpc.RpcError as e:
            _stream_failed(self._fc, ch, e)
        if self._kind == "stream_unary":
            return out
        return _WatchedIterator(out, self._fc, ch)

    def with_call(self, request_or_iterator: Any, timeout: Optional[float] = None, **kw: Any) -> Any:
        ch, mc, left = self._mc(timeout)
        try:
            return mc.with_call(request_or_iterator, timeout=left, **kw)
        except grpc.RpcError as e:
            _stream_failed(self._fc, ch, e)

    def future(self, request_or_iterator: Any, timeout: Optional[float] = None, **kw: Any) -> Any:
        _, mc, left = self._mc(timeout)
        return mc.future(request_or_iterator, timeout=left, **kw)


def _stream_failed(fc: FollowingChannel, ch: grpc.Channel, e: grpc.RpcError) -> NoReturn:
    """Raises for a stream on ``ch`` that failed with ``e``: the move that
    ended it (:class:`PrimaryMoved`), else ``e``, told to the channel."""
    moved = fc.moved(ch)
    if moved is not None and e.code() == grpc.StatusCode.CANCELLED:
        raise moved from e
    fc._failed(e)
    raise e


class _WatchedIterator:
    """A response stream that tells its channel when it fails."""

    def __init__(self, call: Any, fc: FollowingChannel, ch: grpc.Channel):
        self._call, self._fc, self._ch = call, fc, ch

    def __iter__(self) -> "_WatchedIterator":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as e:
            _stream_failed(self._fc, self._ch, e)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def _etcd_leader(t: Target, timeout: float) -> Tuple[str, int]:
    """The cluster's primary from etcd's JSON gateway: the election key
    with the lowest creation revision (internal/cluster's layout). etcd is
    reached with :func:`rlhub.discover.default_security` (TLS, a user)."""
    from rlhub import errors
    try:
        resp = _election_range(t, timeout)
    except errors.Unavailable as e:
        raise errors.Unavailable(f"rlhub: etcd of cluster {t.cluster} did not answer: {e}") from None
    leader = _leader_of(resp, t.cluster)
    if leader is None:
        raise errors.Unavailable(f"rlhub: cluster {t.cluster} has no primary (an election is running)")
    return leader


def _election_prefix(t: Target) -> str:
    return f"/rlhub/{t.cluster}/election/"


def _election_range(t: Target, timeout: float, endpoint: Optional[int] = None) -> Any:
    """The election key with the lowest creation revision, from etcd (from
    endpoint number ``endpoint`` alone, given one)."""
    from rlhub import discover
    return discover.gateway(t.etcd).range_prefix(_election_prefix(t), timeout, endpoint, sort_order="ASCEND",
                                                 sort_target="CREATE", limit=1)


def _leader_of(resp: Any, cluster: str) -> Optional[Tuple[str, int]]:
    """The primary in a range of the election prefix (lowest creation
    revision first, limit 1): (address, epoch), or None when no hub is
    campaigning."""
    from rlhub import errors
    kvs = resp.get("kvs") or []
    if not kvs:
        return None
    # The record is whatever the election key holds: one that is not a
    # hub's JSON, or whose address no refusal could name (cluster.NamesPrimary:
    # 1 to 300 bytes, no white space), names no primary. It is neither
    # dialled nor quoted (it could be etcd's whole value limit).
    try:
        info = json.loads(base64.b64decode(kvs[0].get("value", "")) or b"{}")
        addr = info.get("addr", "") if isinstance(info, dict) else ""
        epoch = str(kvs[0].get("create_revision", ""))
    except (ValueError, TypeError, AttributeError):  # binascii.Error, UnicodeDecodeError are ValueErrors
        addr, epoch = "", ""
    named = _named(addr, epoch) if isinstance(addr, str) else ("", 0)
    if not named[0]:
        raise errors.Unavailable(f"rlhub: cluster {cluster}: the primary's record names no address "
                                 f"(want JSON with an \"addr\" of 1 to {_MAX_ADDR_BYTES} bytes, no white space)")
    return named


def primary_addr(ch: Any, addr: str, timeout: float = RESOLVE_TIMEOUT) -> str:
    """Where the data plane should dial for a client whose channel is
    ``ch`` and whose address is ``addr``: the followed primary for a
    :class:`FollowingChannel` (looked up, waiting up to ``timeout`` seconds
    for a ready one, if none is known), else ``addr``."""
    if isinstance(ch, FollowingChannel):
        try:  # a READY primary, found again if the old one went away
            ch._ready(time.monotonic() + timeout)
        except grpc.RpcError:
            pass  # the data-plane call fails and is retried
        p = ch.primary()
        return p[0] if p is not None else addr
    return addr
