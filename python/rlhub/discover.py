"""Discovery from etcd: secondaries, relays, and etcd's own TLS and auth.

The Go hub keeps a cluster's records under ``/rlhub/NAME/`` in etcd
(internal/cluster): the election, the members, and the services processes
announce under a lease (``/rlhub/NAME/services/KIND/ID``, JSON with ``kind``,
``id``, ``addr``, ``model``, ``host``, a relay's ``shm`` segment and, for a hub of secondary reducers,
``secondaries``). This module reads them through etcd's JSON gateway
(``/v3/kv/range``, ``/v3/auth/authenticate``; ``/v3/watch`` as a
WebSocket, with websocket-client) as :class:`rlhub._channel.FollowingChannel`
does:

* :func:`services` lists announcements; :func:`local_relay` is the relay of
  a model on this host (matched by :func:`host_name`: ``$RLHUB_HOST``, else
  the hostname) and :func:`collector_target`
  is where a collector should connect: that relay, or the hub when there is
  none.
* :class:`ServiceWatch` follows the announcements of a kind with an etcd
  watch (a thread) and calls back with the live list at each change:
  :class:`rlhub.grads.GradClient` uses it for secondaries, so one started
  after the client gets pushes, and one that dies is dropped when its lease
  expires, without waiting for the primary's list.
* :class:`EtcdSecurity` is how etcd is reached: ``cacert`` (TLS), ``cert``
  and ``key`` (a client certificate for an etcd with
  ``--client-cert-auth``), ``user`` and ``password_file`` (never a password
  itself). It defaults to the ``RLHUB_ETCD_CACERT``, ``RLHUB_ETCD_CERT``,
  ``RLHUB_ETCD_KEY``, ``RLHUB_ETCD_USER`` and ``RLHUB_ETCD_PASSWORD_FILE``
  environment the Go command line reads too; :func:`configure` sets it for
  the process. Plaintext to an endpoint off loopback is refused unless
  ``insecure`` (``RLHUB_ETCD_INSECURE=1``), the hub's own rule.

Errors name etcd: :class:`rlhub.errors.Unauthenticated` for a refused user
or password, :class:`rlhub.errors.PermissionDenied` for a role without the
cluster's keys, :class:`rlhub.errors.Unavailable` for a failed TLS handshake
or an etcd that does not answer, :class:`rlhub.errors.InvalidArgument` for
bad settings (checked before anything is sent).
"""

import base64
import dataclasses
import http.client
import io
import ipaddress
import json
import os
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Tuple

import websocket

from rlhub import errors

__all__ = ["EtcdSecurity", "configure", "Gateway", "Service", "services", "local_relay",
           "collector_target", "ServiceWatch", "KIND_RELAY", "KIND_SECONDARY", "HOST_ENV", "host_name"]

KIND_RELAY = "relay"
KIND_SECONDARY = "secondary"
_MAX_RESPONSE = 4 << 20
_MAX_PASSWORD = 4096
# A watch asks its member for a progress notification every _WATCH_PROBE
# and gives the member up after _WATCH_SILENCE without any answer (Go:
# internal/cluster watchProbe, watchSilence); the reads a watcher makes
# for it are bounded by _WATCH_SILENCE too. A watch without events for
# _WATCH_IDLE checks that its member can still answer a read (one cut off
# from its peers answers progress requests from memory, but no event
# reaches it); a POST stream is also opened again after _WATCH_IDLE. A
# WebSocket watch also asks its member for its status every
# _WATCH_LEADER and gives it up once two answers in a row, _WATCH_LEADER
# apart, name no raft leader (a cut member loses its leader within ~2 s;
# a normal election leaves a member without one for milliseconds).
_WATCH_PROBE, _WATCH_SILENCE, _WATCH_IDLE, _WATCH_LEADER = 0.5, 2.0, 5.0, 1.0


@dataclasses.dataclass(frozen=True)
class EtcdSecurity:
    """TLS files and an etcd user (the Go ``cluster.EtcdSecurity``)."""
    cacert: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    user: Optional[str] = None
    password_file: Optional[str] = None
    insecure: bool = False

    @classmethod
    def from_env(cls) -> "EtcdSecurity":
        g = os.environ.get
        return cls(cacert=g("RLHUB_ETCD_CACERT") or None, cert=g("RLHUB_ETCD_CERT") or None,
                   key=g("RLHUB_ETCD_KEY") or None, user=g("RLHUB_ETCD_USER") or None,
                   password_file=g("RLHUB_ETCD_PASSWORD_FILE") or None,
                   insecure=g("RLHUB_ETCD_INSECURE", "") in ("1", "true", "yes"))


_default: Optional[EtcdSecurity] = None


def configure(security: Optional[EtcdSecurity]) -> None:
    """Sets the process's etcd security (``None``: back to the environment)."""
    global _default
    _default = security
    with _gateways_mu:
        _gateways.clear()


def default_security() -> EtcdSecurity:
    return _default if _default is not None else EtcdSecurity.from_env()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Gateway:
    """etcd's JSON gateway at ``endpoints`` (URLs), with ``security``.

    :meth:`call` posts one request to the first endpoint that answers and
    returns the decoded reply; :meth:`watch` streams one watch. Thread-safe.

    A call starts at the endpoint that answered the last one: an etcd
    member that stopped answering (its machine dead or cut off: each
    request to it waits out its timeout) costs one call that timeout, not
    every call after it (Go: internal/cluster endpoints.go).
    """

    def __init__(self, endpoints: Tuple[str, ...], security: Optional[EtcdSecurity] = None):
        sec = security if security is not None else default_security()
        if bool(sec.cert) != bool(sec.key):
            raise errors.InvalidArgument("rlhub: an etcd client certificate needs both cert and key")
        if bool(sec.user) != bool(sec.password_file):
            raise errors.InvalidArgument("rlhub: etcd authentication needs both user and password_file")
        tls = bool(sec.cacert or sec.cert) or any(e.startswith("https://") for e in endpoints)
        self._eps: List[Tuple[str, int]] = []
        for e in endpoints:
            u = urllib.parse.urlsplit(e if "://" in e else "http://" + e)
            host, port = u.hostname or "", u.port or 2379
            if not tls and not sec.insecure and not _loopback(host):
                raise errors.InvalidArgument(
                    f"rlhub: etcd endpoint {host[:80]!r} is not on loopback and would be reached without TLS: "
                    "set cacert (RLHUB_ETCD_CACERT), or insecure")
            self._eps.append((host, port))
        self.endpoints = tuple(("https://" if tls else "http://") + f"{h}:{p}" for h, p in self._eps)
        self._ctx: Optional[ssl.SSLContext] = None
        if tls:
            try:
                ctx = ssl.create_default_context(cafile=sec.cacert) if sec.cacert else ssl.create_default_context()
                if sec.cert:
                    ctx.load_cert_chain(sec.cert, sec.key)
            except (OSError, ssl.SSLError) as e:
                raise errors.InvalidArgument(f"rlhub: etcd TLS files: {str(e)[:200]}") from None
            self._ctx = ctx
        self._user, self._password = sec.user, None
        if sec.user:
            try:
                with open(sec.password_file or "", "rb") as f:
                    raw = f.read(_MAX_PASSWORD + 1)
            except OSError as e:
                raise errors.InvalidArgument(f"rlhub: etcd password_file: {e.strerror}") from None
            if len(raw) > _MAX_PASSWORD:
                raise errors.InvalidArgument(f"rlhub: etcd password_file is longer than {_MAX_PASSWORD} bytes")
            pw = raw.decode("utf-8", "replace").split("\n", 1)[0].rstrip("\r")
            if not pw:
                raise errors.InvalidArgument("rlhub: etcd password_file is empty")
            self._password = pw
        self._token: Optional[str] = None
        self._mu = threading.Lock()
        self._watching: Dict[threading.Event, socket.socket] = {}  # by stop event
        self._first = 0  # the endpoint that answered the last call: the next starts there (_mu)
        self.passed = 0  # endpoints a call gave up on for the next (_mu; tests)
        # Whether etcd takes the user's token over a WebSocket (None: not
        # known yet; False: its watches are POST streams).
        self._bearer: Optional[bool] = None

    def _conn(self, i: int, timeout: float) -> http.client.HTTPConnection:
        host, port = self._eps[i]
        if self._ctx is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ctx)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _where(self) -> str:
        return ",".join(self.endpoints)[:200]

    @staticmethod
    def _refused(status: int, body: bytes, where: str) -> errors.RlhubError:
        try:
            d = json.loads(body)
        except ValueError:
            d = None
        if isinstance(d, dict):
            msg = str(d.get("error") or d.get("message") or "")
        else:
            msg = body[:200].decode("utf-8", "replace")
        return Gateway._refusal(status, msg, where)

    @staticmethod
    def _refusal(status: int, msg: str, where: str) -> errors.RlhubError:
        """The error of etcd's refusal ``msg`` (any length), with HTTP
        ``status`` (0: none)."""
        msg = msg[:300]
        if "authentication failed" in msg or "invalid auth token" in msg or "user name is empty" in msg or status == 401:
            return errors.Unauthenticated(f"rlhub: etcd {where}: {msg} (check the etcd user and password_file)")
        if "permission denied" in msg or status == 403:
            return errors.PermissionDenied(
                f"rlhub: etcd {where}: {msg} (the etcd user's role must grant the cluster's prefix /rlhub/NAME/)")
        return errors.Unavailable(f"rlhub: etcd {where}: " + (f"HTTP {status}: " if status else "") + msg)

    def _post(self, i: int, path: str, body: Dict[str, Any], timeout: float, auth: bool = True,
              conn: Optional[http.client.HTTPConnection] = None) -> Any:
        """One request to endpoint i (on ``conn``, kept open, given one:
        the caller closes it); raises OSError when unreachable."""
        headers = {"Content-Type": "application/json"}
        if auth and self._user:
            headers["Authorization"] = self._auth_token(i, timeout)
        c = conn or self._conn(i, timeout)
        deadline = time.monotonic() + timeout
        try:
            c.request("POST", path, json.dumps(body).encode(), headers)
            c.response_class = lambda sock, **kw: _Response(sock, deadline, **kw)  # type: ignore[assignment]
            r = c.getresponse()
            data = r.read(_MAX_RESPONSE)
        finally:
            if conn is None:
                c.close()
            elif c.sock is not None:
                c.sock.settimeout(timeout)  # a kept connection's next request starts afresh
        if r.status != 200:
            raise self._refused(r.status, data, self._where())
        try:
            reply = json.loads(data)
        except ValueError:
            raise errors.Unavailable(f"rlhub: etcd {self._where()}: a reply that is not JSON") from None
        if not isinstance(reply, dict):
            raise errors.Unavailable(f"rlhub: etcd {self._where()}: a reply that is not a JSON object")
        return reply

    def _auth_token(self, i: int, timeout: float) -> str:
        with self._mu:
            tok = self._token
        if tok:
            return tok
        # etcd checks the password with bcrypt: slow on a loaded server.
        resp = self._post(i, "/v3/auth/authenticate", {"name": self._user, "password": self._password},
                          max(timeout, 10.0), auth=False)
        tok = str(resp.get("token", ""))
        with self._mu:
            self._token = tok
        return tok

    def call(self, path: str, body: Dict[str, Any], timeout: float = 3.0, endpoint: Optional[int] = None) -> Any:
        """Posts ``body`` to ``path`` at the first endpoint that answers, or
        at endpoint number ``endpoint`` (modulo their count) alone."""
        problems = []
        n = len(self._eps)
        if endpoint is None:
            with self._mu:
                first = self._first
            order = [(first + k) % n for k in range(n)]
        else:
            order = [endpoint % n]
        for i in order:
            for attempt in range(2):
                try:
                    reply = self._post(i, path, body, timeout)
                    if endpoint is None:
                        with self._mu:
                            self._first = i
                    return reply
                except errors.Unauthenticated:
                    if attempt == 0 and self._user:  # an expired token: once more with a new one
                        with self._mu:
                            self._token = None
                        continue
                    raise
                except ssl.SSLError as e:
                    raise errors.Unavailable(
                        f"rlhub: etcd {self.endpoints[i]}: TLS handshake: {str(e)[:200]} "
                        "(check cacert, and cert/key if etcd checks clients)") from None
                except (OSError, http.client.HTTPException) as e:
                    problems.append(f"{self.endpoints[i]}: {str(e)[:200]}")
                    with self._mu:
                        self.passed += 1
                    break
        raise errors.Unavailable(f"rlhub: etcd did not answer: {'; '.join(problems)}")

    def range_prefix(self, prefix: str, timeout: float = 3.0, endpoint: Optional[int] = None, **extra: Any) -> Any:
        """The keys under ``prefix`` (:meth:`call`'s ``endpoint``)."""
        return self.call("/v3/kv/range", {**_span(prefix), **extra}, timeout, endpoint)

    def watch(self, prefix: str, start_revision: int, on_events: Callable[[List[Dict[str, Any]]], None],
              stop: threading.Event, endpoint: int = 0) -> None:
        """Streams a watch of ``prefix`` from ``start_revision`` at endpoint
        number ``endpoint`` (modulo their count), calling ``on_events`` with
        each batch on this thread, until ``stop`` is set (returns) or the
        watch fails (raises; the caller reads again and watches on the next
        endpoint).

        The watch is a WebSocket to etcd's gateway: every ``_WATCH_PROBE``
        it asks the member for a progress notification, which etcd answers
        at once, and fails once ``_WATCH_SILENCE`` passed without any
        answer or event: a member whose machine died or was cut off, or
        which is stopped, keeps its connection open and answers nothing.
        A member cut off from its peers answers progress requests, but no
        event reaches it: every ``_WATCH_LEADER`` the watch asks the member
        for its status (on one connection kept open) and fails once two
        answers in a row name no raft leader (within ~4 s of a cut). After
        ``_WATCH_IDLE`` without events it also reads ``prefix`` once at
        the same member (bounded by ``_WATCH_SILENCE``) and fails when that
        fails (a cut member has no leader to read through; this catches it
        where the user may not ask for the status).

        With an etcd user, an etcd whose gateway refuses the token over a
        WebSocket (it gets it as ``Bearer TOKEN``, which etcd 3.4 does not
        take: etcd-io/etcd#19752) is watched with a POST stream instead,
        which cannot be probed: it returns after ``_WATCH_IDLE`` without a
        line, for the caller to read and watch again. It asks etcd to end
        it once its member has no leader (Go: ``WithRequireLeader``; the
        gateway passes that on for a POST, not over a WebSocket): a
        member cut off from its peers ends it within ~4 s."""
        i = endpoint % len(self._eps)
        body = {"create_request": {**_span(prefix), "start_revision": str(start_revision)}}
        if not (self._user and self._bearer is False) and self._watch_ws(i, prefix, body, on_events, stop):
            return
        self._watch_stream(i, body, on_events, stop)

    def _socket(self, i: int) -> socket.socket:
        """A connection to endpoint i, TLS as configured; raises OSError."""
        host, port = self._eps[i]
        sock = socket.create_connection((host, port), _WATCH_SILENCE)
        if self._ctx is not None:
            try:
                sock = self._ctx.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        return sock

    def _watch_ws(self, i: int, prefix: str, body: Dict[str, Any],
                  on_events: Callable[[List[Dict[str, Any]]], None], stop: threading.Event) -> bool:
        """:meth:`watch` through a WebSocket; False when etcd refused there
        a token it takes on a read (the caller falls back to a stream)."""
        where = self.endpoints[i][:200]
        header = []
        tok = ""
        if self._user:
            tok = self._auth_token(i, _WATCH_SILENCE)
            if not tok.isprintable():  # as http.client refuses it in a header
                raise errors.Unavailable(f"rlhub: etcd {where}: an auth token that is not one line of text")
            # The gateway passes only this header on, as "Bearer TOKEN".
            header.append("Sec-WebSocket-Protocol: Bearer, " + tok)
        sock: Optional[socket.socket] = None
        status: Optional[http.client.HTTPConnection] = None
        opened = False
        try:
            sock = self._socket(i)
            with self._mu:
                self._watching[stop] = sock
            if stop.is_set():
                return True
            meter = _Metered(sock)
            scheme = "wss" if self._ctx is not None else "ws"
            ws = websocket.create_connection(f"{scheme}://{self._eps[i][0]}:{self._eps[i][1]}/v3/watch",
                                             timeout=_WATCH_SILENCE, socket=meter, header=header, suppress_origin=True)
            opened = True
            ws.send(json.dumps(body))
            heard = event = probed = checked = time.monotonic()
            status = self._conn(i, _WATCH_SILENCE)
            leaderless: Optional[float] = None  # when the member first named no leader, of answers in a row
            while not stop.is_set():
                now = time.monotonic()
                if now - heard > _WATCH_SILENCE:
                    raise errors.Unavailable(f"rlhub: etcd {where}: the watch heard nothing for {now - heard:.1f} s "
                                             "(the member is stopped or cut off)")
                if status is not None and now - checked >= _WATCH_LEADER:
                    try:
                        has = self._has_leader(i, status)
                    except errors.PermissionDenied:  # the user may not ask (etcd 3.6): the idle read alone
                        status.close()
                        status, has = None, None
                    checked = time.monotonic()
                    if has is not False:
                        leaderless = None
                    elif leaderless is None:
                        leaderless = checked
                    elif checked - leaderless >= _WATCH_LEADER:
                        raise errors.Unavailable(
                            f"rlhub: etcd {where}: the member has had no raft leader for {checked - leaderless:.1f} s "
                            "(cut off from its peers, or etcd lost its quorum)")
                if now - event > _WATCH_IDLE:
                    self.range_prefix(prefix, _WATCH_SILENCE, endpoint=i, count_only=True)
                    event = time.monotonic()
                if now - probed >= _WATCH_PROBE:
                    ws.send('{"progress_request": {}}')
                    probed = now
                wake = min(probed + _WATCH_PROBE, checked + _WATCH_LEADER if status is not None else probed + 1)
                sock.settimeout(max(0.001, wake - time.monotonic()))
                try:
                    op, data = ws.recv_data()
                except websocket.WebSocketTimeoutException:
                    continue
                meter.left = _MAX_RESPONSE  # per message
                heard = time.monotonic()
                if op == websocket.ABNF.OPCODE_CLOSE:
                    break
                res = _watch_result(data, where)
                if res.get("canceled"):
                    err = self._refusal(0, "the watch was canceled: " + str(res.get("cancel_reason", "")), where)
                    if isinstance(err, errors.Unauthenticated) and self._user:
                        if self._bearer is None:  # expired, or not taken as "Bearer TOKEN"? A read tells.
                            self.range_prefix(prefix, _WATCH_SILENCE, endpoint=i, count_only=True)
                        with self._mu:
                            if self._token == tok and self._bearer is None:
                                self._bearer = False
                                return False
                            if self._token == tok:
                                self._token = None  # expired: the next watch authenticates again
                    raise err
                if res.get("created") and self._user:
                    self._bearer = True
                if res.get("events"):
                    event = heard
                    on_events(res["events"])
            if stop.is_set():
                return True
            raise errors.Unavailable(f"rlhub: etcd {where}: the watch ended")
        except ssl.SSLError as e:
            if stop.is_set():
                return True
            if opened:
                raise errors.Unavailable(f"rlhub: etcd {where}: watch: {str(e)[:200]}") from None
            raise errors.Unavailable(f"rlhub: etcd {where}: TLS handshake: {str(e)[:200]} "
                                     "(check cacert, and cert/key if etcd checks clients)") from None
        except (OSError, ValueError, websocket.WebSocketException) as e:
            if stop.is_set():
                return True
            raise errors.Unavailable(f"rlhub: etcd {where}: watch: {str(e)[:200]}") from None
        finally:
            with self._mu:
                if self._watching.get(stop) is sock:
                    self._watching.pop(stop, None)
            if sock is not None:
                sock.close()
            if status is not None:
                status.close()

    def _has_leader(self, i: int, conn: http.client.HTTPConnection) -> Optional[bool]:
        """Whether endpoint i's member has a raft leader, by its status
        (``/v3/maintenance/status``, answered from the member's memory
        without a raft round: a member without a leader leaves ``leader``
        out), asked on ``conn``, which stays open between checks (once more
        on a new connection when etcd closed a kept one). None when not
        known: the user's token expired (the next check authenticates
        again). Raises ``Unavailable`` when the member does not answer
        within ``_WATCH_SILENCE``, ``PermissionDenied`` when the user may
        not ask."""
        for attempt in range(2):
            kept = conn.sock is not None
            try:
                st = self._post(i, "/v3/maintenance/status", {}, _WATCH_SILENCE, conn=conn)
                return st.get("leader") not in (None, "", "0", 0)
            except errors.Unauthenticated:
                with self._mu:
                    self._token = None
                return None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if kept and attempt == 0 and not isinstance(e, TimeoutError):
                    continue
                raise errors.Unavailable(f"rlhub: etcd {self.endpoints[i][:200]}: status: {str(e)[:200]}") from None
        return None

    def _watch_stream(self, i: int, body: Dict[str, Any], on_events: Callable[[List[Dict[str, Any]]], None],
                      stop: threading.Event) -> None:
        """:meth:`watch` through a POST stream, which takes no progress
        requests: it returns after ``_WATCH_IDLE`` without a line, and
        fails when etcd ends it because its member lost its leader."""
        where = self.endpoints[i][:200]
        # The gateway hands Grpc-Metadata-* headers on as gRPC metadata:
        # etcd's "hasleader" requirement, which a WebSocket cannot carry.
        headers = {"Content-Type": "application/json", "Grpc-Metadata-Hasleader": "true"}
        c = self._conn(i, _WATCH_SILENCE)
        streaming = False
        try:
            if self._user:
                headers["Authorization"] = self._auth_token(i, _WATCH_SILENCE)
            c.request("POST", "/v3/watch", json.dumps(body).encode(), headers)
            r = c.getresponse()
            if r.status != 200:
                err = self._refused(r.status, r.read(_MAX_RESPONSE), where)
                if isinstance(err, errors.Unauthenticated):
                    with self._mu:
                        self._token = None  # expired: the next watch authenticates again
                raise err
            assert c.sock is not None
            c.sock.settimeout(_WATCH_IDLE)  # a watch is quiet until something changes
            streaming = True
            with self._mu:
                self._watching[stop] = c.sock
            if stop.is_set():
                return
            while not stop.is_set():
                line = r.readline(_MAX_RESPONSE)
                if not line:
                    if stop.is_set():
                        return
                    raise errors.Unavailable(f"rlhub: etcd {where}: the watch ended")
                if not line.strip():
                    continue
                res = _watch_result(line, where)
                if res.get("canceled"):  # worded and mapped as over the WebSocket
                    err = self._refusal(0, "the watch was canceled: " + str(res.get("cancel_reason", "")), where)
                    if isinstance(err, errors.Unauthenticated):
                        with self._mu:
                            self._token = None  # expired: the next watch authenticates again
                    raise err
                if res.get("events"):
                    on_events(res["events"])
        except (OSError, ValueError, http.client.HTTPException) as e:
            if stop.is_set() or (streaming and isinstance(e, TimeoutError)):
                return
            raise errors.Unavailable(f"rlhub: etcd {where}: watch: {str(e)[:200]}") from None
        finally:
            with self._mu:
                self._watching.pop(stop, None)
            c.close()

    def interrupt(self, stop: threading.Event) -> None:
        """Wakes the :meth:`watch` given ``stop`` (set it first) if it is
        blocked on its connection."""
        with self._mu:
            sock = self._watching.get(stop)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _watch_result(data: Any, where: str) -> Dict[str, Any]:
    """The result of one watch message (JSON, either transport); raises
    ``Unavailable`` for an error (ValueError for one that is not JSON)."""
    msg = json.loads(data)
    if "error" in msg:
        raise errors.Unavailable(f"rlhub: etcd {where}: watch: {str(msg['error'])[:200]}")
    res: Dict[str, Any] = msg.get("result", {})
    return res


def _span(prefix: str) -> Dict[str, str]:
    """The key range of ``prefix``, as the gateway takes it."""
    p = prefix.encode()
    return {"key": base64.b64encode(p).decode(), "range_end": base64.b64encode(p[:-1] + bytes([p[-1] + 1])).decode()}


class _Metered:
    """A socket whose reads count down ``left``: a WebSocket handshake or
    message longer than ``_MAX_RESPONSE`` fails instead of filling memory
    (the watch sets ``left`` again after each message)."""

    def __init__(self, sock: socket.socket):
        self._sock, self.left = sock, _MAX_RESPONSE

    def recv(self, n: int) -> bytes:
        b = self._sock.recv(n)
        self.left -= len(b)
        if self.left < 0:
            raise errors.Unavailable(f"rlhub: etcd: a watch message longer than {_MAX_RESPONSE} bytes")
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read waiting only for what is left until
    ``deadline``: a gateway that trickles its answer (a byte just within
    each read's timeout) fails the call at the deadline, not when done."""

    def __init__(self, sock: socket.socket, deadline: float, file: Any):
        super().__init__()
        self._sock, self._deadline, self._file = sock, deadline, file

    def close(self) -> None:
        # The socket's own file holds the socket open: the connection
        # closes it at once when the answer ends the connection
        # (Connection: close), before the body is read.
        if not self.closed:
            self._file.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer did not come within the call's timeout")
        self._sock.settimeout(left)
        return self._sock.recv_into(b)


class _Response(http.client.HTTPResponse):
    """An HTTP response read through a :class:`_DeadlineReader`."""

    def __init__(self, sock: socket.socket, deadline: float, **kw: Any):
        super().__init__(sock, **kw)
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline, self.fp))


_gateways: Dict[Tuple[str, ...], Gateway] = {}
_gateways_mu = threading.Lock()


def gateway(endpoints: Tuple[str, ...]) -> Gateway:
    """The process's :class:`Gateway` for ``endpoints`` (one per endpoint
    list, with :func:`default_security`)."""
    with _gateways_mu:
        g = _gateways.get(endpoints)
        if g is None:
            g = _gateways[endpoints] = Gateway(endpoints)
        return g


@dataclasses.dataclass(frozen=True)
class Service:
    """One announcement (internal/cluster.ServiceInfo)."""
    kind: str
    id: str
    addr: str
    model: str = ""
    host: str = ""
    shm: str = ""
    """A relay's shared-memory segment on ``host`` ("" when none)."""
    secondaries: Tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: bytes) -> Optional["Service"]:
        try:
            d = json.loads(raw)
            return cls(kind=str(d.get("kind", "")), id=str(d.get("id", "")), addr=str(d.get("addr", "")),
                       model=str(d.get("model", "")), host=str(d.get("host", "")), shm=str(d.get("shm", "")),
                       secondaries=tuple(str(s) for s in d.get("secondaries") or ()))
        except (ValueError, AttributeError, TypeError):
            return None


def _target(target: Any) -> Any:
    from rlhub import _channel
    t = _channel.parse_target(target) if isinstance(target, str) else target
    if not t.etcd:
        raise errors.InvalidArgument("rlhub: discovery needs an etcd://E/NAME target")
    return t


def _prefix(t: Any, kind: str) -> str:
    p = f"/rlhub/{t.cluster}/services/"
    return p + kind + "/" if kind else p


def _decode(kvs: List[Dict[str, Any]]) -> Dict[str, Service]:
    """The announcements in a range's ``kvs``; raises Unavailable when
    they are not of etcd's shape (a list of objects with base64 values)."""
    out = {}
    try:
        for kv in kvs:
            s = Service.from_json(base64.b64decode(kv.get("value", "")))
            if s is not None:
                out[kv.get("key", "")] = s
    except (AttributeError, TypeError, ValueError) as e:
        raise errors.Unavailable(f"rlhub: etcd: a malformed answer: {str(e)[:200]}") from None
    return out


def services(target: Any, kind: str = "", model: str = "", timeout: float = 3.0) -> List[Service]:
    """The live announcements of ``kind`` ("" every kind) for ``model`` (""
    any) in the cluster ``target`` names (``etcd://E/NAME``), by id."""
    t = _target(target)
    resp = gateway(t.etcd).range_prefix(_prefix(t, kind), timeout)
    ss = [s for s in _decode(resp.get("kvs") or []).values() if not model or s.model == model]
    return sorted(ss, key=lambda s: (s.kind, s.id))


def local_relay(target: Any, model: str, host: Optional[str] = None, timeout: float = 3.0) -> Optional[Service]:
    """The relay announced for ``model`` on ``host`` (default: this
    machine's, :func:`host_name`), or None."""
    return pick_relay(services(target, KIND_RELAY, model, timeout), model, host)


HOST_ENV = "RLHUB_HOST"
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def host_name() -> str:
    """The name of the machine this process runs on, as relays announce
    it and collectors look for it: ``$RLHUB_HOST`` when set, else the
    hostname (Go: ``cluster.HostName``). In Kubernetes a pod's hostname is
    the pod's own: relay and collector pods set ``RLHUB_HOST`` to the
    node's name (the downward API's ``spec.nodeName``). A value that is
    not a host name raises :class:`rlhub.errors.InvalidArgument`."""
    h = os.environ.get(HOST_ENV, "")
    if not h:
        return socket.gethostname()
    if not _HOST.fullmatch(h):
        raise errors.InvalidArgument(f"rlhub: ${HOST_ENV} ({len(h)} characters) is not a host name: "
                                     "letters, digits, '.', '-' and '_', at most 253")
    return h


def pick_relay(ss: List[Service], model: str, host: Optional[str] = None) -> Optional[Service]:
    """Of announcements ``ss`` (sorted by kind and id, as :func:`services`
    and :class:`ServiceWatch` give them), the first relay of ``model`` on
    ``host`` (default: this machine's, :func:`host_name`): :func:`local_relay`'s
    choice, for a caller that keeps the list from a watch."""
    host = host or host_name()
    return next((s for s in ss if s.kind == KIND_RELAY and s.model == model and s.host == host), None)


def collector_target(target: str, model: str, timeout: float = 3.0) -> Tuple[str, bool]:
    """Where a weight collector of ``model`` on this host connects:
    ``(relay address, True)`` when ``target`` is ``etcd://…`` and a relay
    for the model is announced on this host, else ``(target, False)`` (the
    hub, or the cluster's primary, followed). etcd not answering also gives
    the hub. A collector whose relay died asks again: once the relay's
    lease has expired, the answer is the hub."""
    from rlhub import _channel
    t = _channel.parse_target(target)
    if not t.etcd:
        return target, False
    try:
        r = local_relay(t, model, timeout=timeout)
    except errors.Unavailable:
        return target, False
    return (r.addr, True) if r is not None else (target, False)


class ServiceWatch:
    """Follows the announcements of ``kind`` in cluster ``target`` with an
    etcd watch on a thread: ``on_change`` gets the live list (by id) first
    and after every change, one call at a time. Each watch and the read
    before it go to one etcd endpoint, the first chosen at random; a failed
    watch (etcd restarting, its member silent: :meth:`Gateway.watch`) is
    opened again from a fresh list on the next endpoint after a back-off.
    :meth:`close` stops the thread and waits for it."""

    def __init__(self, target: Any, kind: str, on_change: Callable[[List[Service]], None]):
        self._t = _target(target)
        self._gw = gateway(self._t.etcd)
        self._prefix = _prefix(self._t, kind)
        self._on_change = on_change
        self._stop = threading.Event()
        self.error: Optional[BaseException] = None
        """The last failure (cleared by a working watch), for diagnostics."""
        self.opened = 0
        """Watches opened so far (1 while the first one holds)."""
        self._thread = threading.Thread(target=self._run, name=f"rlhub-etcd-watch-{kind}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff, ep = 0.05, random.randrange(len(self._gw.endpoints))
        while not self._stop.is_set():
            try:
                resp = self._gw.range_prefix(self._prefix, _WATCH_SILENCE, endpoint=ep)
                live = _decode(resp.get("kvs") or [])
                self._emit(live)
                rev = int(resp.get("header", {}).get("revision", 0))

                def on_events(evs: List[Dict[str, Any]]) -> None:
                    for ev in evs:
                        kv = ev.get("kv", {})
                        if ev.get("type") == "DELETE":
                            live.pop(kv.get("key", ""), None)
                        else:
                            s = Service.from_json(base64.b64decode(kv.get("value", "")))
                            if s is not None:
                                live[kv.get("key", "")] = s
                    self._emit(live)

                self.error = None
                backoff = 0.05
                self.opened += 1
                self._gw.watch(self._prefix, rev + 1, on_events, self._stop, endpoint=ep)
            except Exception as e:  # noqa: BLE001 - a malformed answer too: read again, on the next member
                # Not only RlhubError: an answer that does not decode (bad
                # base64, JSON of another shape) must not end the thread,
                # silently, for good.
                self.error = e if isinstance(e, errors.RlhubError) else errors.Unavailable(
                    f"rlhub: etcd: a malformed answer: {str(e)[:200]}")
                ep += 1  # the next endpoint watches next time
            if self._stop.wait(backoff):
                return
            backoff = min(2 * backoff, 1.0)

    def _emit(self, live: Dict[str, Service]) -> None:
        self._on_change(sorted(live.values(), key=lambda s: (s.kind, s.id)))

    def close(self) -> None:
        self._stop.set()
        self._gw.interrupt(self._stop)
        self._thread.join(timeout=10)


def failover_for(cluster: str, model: str, timeout: float = 3.0) -> List[Tuple[str, str, str]]:
    """The failover sources of a collector of ``model`` on this host in
    ``cluster`` (``etcd://E/NAME``), as ``(name, via, address)`` for
    :class:`rlhub._sources.SourceSpec`: the relay announced on this host
    (its segment, then its stream) when there is one, then the cluster's
    primary (followed). Without a relay, only the primary. This is one
    answer, now, on this host: a source that should find the relay where
    and when it dials is :func:`rlhub._sources.open_source` with
    ``via="failover"`` and the cluster as ``hub``."""
    specs: List[Tuple[str, str, str]] = []
    try:
        r = local_relay(cluster, model, timeout=timeout)
    except errors.Unavailable:
        r = None
    if r is not None:
        if r.shm:
            specs.append(("relay-shm", "shm", r.shm))
        specs.append(("relay", "push", r.addr))
    specs.append(("upstream", "push", cluster))
    return specs
