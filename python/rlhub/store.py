"""Client for the ordered model store: push, pull and watch versioned models.

    with rlhub.StoreClient("127.0.0.1:7470") as store:
        store.push("policy", model.state_dict(), version=1, expect=0)
        v = store.pull("policy", framework="torch")
        for v in store.watch("policy", after=v.version, life=v.life):
            model.load_state_dict(v.tensors)
        # or, writing each version straight into the module's tensors:
        for version in store.watch_into("policy", model, after=v.version):
            ...

Pulls and watches use the hub's data plane (plain TCP on the gRPC port,
received with ``recv_into``; docs/wire.md) when the hub serves them, and
gRPC otherwise (``transport="grpc"`` forces gRPC).

State dicts travel as safetensors bytes (no pickle). A stale or
conflicting push raises ``rlhub.StaleVersion`` with the current version.

Every version names its life (``ModelVersion.life``): a model deleted and
pushed again from version 1 starts another. A watch follows lives by
default: it yields the new life's newest at once, though it is not newer
than the last version yielded (docs/weight-sync.md, "Lives").
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Tuple, TypeVar

import grpc

import numpy as np

from rlhub import _bulk, _channel, errors
from rlhub._proto.rlhub.v1 import store_pb2, store_pb2_grpc, tensor_pb2
from rlhub._transfer import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_BYTES, RawChunk, chunk_message, fast_decoder, iter_part_chunks
from rlhub.tensors import Target, TargetCache, load_bytes, parts_size, save_parts

PULL_METHOD = "rlhub.v1.ModelStore/Pull"
PUSH_METHOD = "rlhub.v1.ModelStore/Push"
WATCH_METHOD = "rlhub.v1.ModelStore/Watch"

EXPECT_ANY = object()

_T = TypeVar("_T")
_Alloc = Callable[[int], Any]
"""alloc(n): a writable buffer of at least n bytes to receive a version into."""

_WATCH_BACKOFF = (0.05, 1.0)
"""A watch's pause after a failed turn: from the first, doubling to the
second (seconds; each jittered down to half), as the channels reconnect."""

_WATCH_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Failures of a watch's turn it asks again after: the hub unreachable, or
not answering within the turn's bound (the client's ``timeout``)."""

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]


def channel(addr: str) -> grpc.Channel:
    """Opens a channel with rlhub's message-size options (TLS and token per
    ``rlhub._channel.default_security()``)."""
    return _channel.channel(addr, options=_CHANNEL_OPTIONS)


@dataclasses.dataclass
class ModelVersion:
    """One version of a model as pulled."""

    name: str
    version: int
    epoch: int
    blob: Any  # safetensors bytes; a writable bytes-like memoryview when pulled
    metadata: Dict[str, str]
    created_unix_nano: int
    skipped: int = 0
    framework: str = "numpy"
    life: int = 0
    """The version's life (docs/weight-sync.md, "Lives"): opaque, shared by
    the versions of one life of the model; a model deleted and pushed again,
    a hub restarted or another cluster primary names another. 0: unknown (a
    hub that predates lives)."""
    _tensors: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False)

    @property
    def tensors(self) -> Dict[str, Any]:
        """The state dict: numpy arrays or torch tensors, views over
        ``blob`` (``load_bytes``: a torch tensor writes the blob)."""
        if self._tensors is None:
            self._tensors = load_bytes(self.blob, framework=self.framework)
        return self._tensors


@dataclasses.dataclass
class ModelInfo:
    name: str
    version: int
    epoch: int
    bytes: int
    created_unix_nano: int
    retained: List[int]


def _info(m: store_pb2.StoreModelInfo) -> ModelInfo:
    return ModelInfo(m.name, m.version, m.epoch, m.bytes, m.created_unix_nano, list(m.retained))


class StoreClient:
    """A model-store client. Thread-safe; close it (or use ``with``).

    ``timeout`` (seconds) bounds each call as a whole: finding a cluster's
    primary, the retries and a fallback from the data plane to gRPC all
    come out of it, so a call ends within about ``timeout`` however the
    hub or cluster fails. Within it a call is tried again up to
    ``retries`` times after ``Unavailable``. A watch has its own bound
    (:meth:`watch`)."""

    def __init__(self, addr: str, *, timeout: float = 60.0, retries: int = 4,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, channel_: Optional[grpc.Channel] = None,
                 transport: str = "auto", max_bytes: int = DEFAULT_MAX_BYTES):
        if transport not in ("auto", "grpc"):
            raise ValueError(f"transport {transport!r}: want 'auto' or 'grpc'")
        self.addr = addr
        self.max_bytes = max_bytes
        self._bulk = _bulk.Client() if transport == "auto" else None
        self._bulk_off_at: Optional[float] = None  # the hub answered Unimplemented then
        self._stage = np.empty(0, np.uint8)  # pull_into's receive buffer, reused
        self._stage_mu = threading.Lock()  # one pull_into at a time uses _stage and _targets
        self._targets = TargetCache()  # pull_into's last target's plan, reused while its tensors are unchanged
        self.stats = {"bulk": 0, "grpc": 0, "fallback": 0, "direct": 0, "push_bulk": 0, "push_grpc": 0}
        """Pulls and watch answers by transport; ``fallback``: data-plane attempts that went to gRPC;
        ``direct``: data-plane versions pull_into / watch_into received straight into the tensors;
        ``push_bulk`` / ``push_grpc``: pushes by transport."""
        self._own = channel_ is None
        self._channel = channel_ or channel(addr)
        if self._bulk is not None and isinstance(self._channel, _channel.FollowingChannel):
            self._channel.on_move(self._bulk.abort)  # pulls in flight on a primary that moved end there
        self._stub = store_pb2_grpc.ModelStoreStub(self._channel)
        # Push, Pull and Watch move chunks with the hand-made codec of
        # rlhub._transfer (one copy per chunk each way); same wire bytes.
        self._push = self._channel.stream_unary(
            "/rlhub.v1.ModelStore/Push", request_serializer=bytes,
            response_deserializer=store_pb2.StorePushResponse.FromString)
        self._pull = self._channel.unary_stream(
            "/rlhub.v1.ModelStore/Pull", request_serializer=store_pb2.StorePullRequest.SerializeToString,
            response_deserializer=fast_decoder(store_pb2.StorePullResponse))
        self._watch = self._channel.unary_stream(
            "/rlhub.v1.ModelStore/Watch", request_serializer=store_pb2.StoreWatchRequest.SerializeToString,
            response_deserializer=fast_decoder(store_pb2.StorePullResponse))
        self.timeout = timeout
        self.retries = retries
        self.chunk_bytes = chunk_bytes
        self._closed = False
        self._closing = threading.Event()  # set by close: a watch's back-off ends at once

    def close(self) -> None:
        """Closes the client: calls in progress in other threads (a watch
        waiting for its next version included) end with a ``CANCELLED``
        ``RlhubError``, as do calls made after. Safe to call twice."""
        self._closed = True
        self._closing.set()
        if self._bulk is not None:
            self._bulk.shutdown()  # a data-plane watch's poll in flight ends, and is not asked again
        if self._own:
            self._channel.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.RlhubError(f"StoreClient of {self.addr[:200]} is closed", grpc.StatusCode.CANCELLED)

    def __enter__(self) -> "StoreClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _deadline(self) -> float:
        """The deadline of a call made now: ``timeout`` from now."""
        return time.monotonic() + self.timeout

    def _call(self, fn: Callable[[float], _T], deadline: float) -> _T:
        """Runs fn(seconds left until deadline), retrying with backoff on
        Unavailable while the retries and the deadline last; maps errors."""
        delay = 0.05
        for attempt in range(self.retries + 1):
            self._check_open()
            try:
                return fn(max(0.001, deadline - time.monotonic()))
            except grpc.RpcError as e:
                pause = delay * (1 + random.random())
                if (e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries
                        and time.monotonic() + pause < deadline):
                    time.sleep(pause)
                    delay = min(delay * 2, 2.0)
                    continue
                raise errors.from_rpc_error(e) from None
        raise AssertionError("unreachable")

    def push(self, name: str, state_dict: Any, *, version: int, expect: Any = EXPECT_ANY,
             epoch: int = 0, metadata: Optional[Mapping[str, str]] = None, life: int = 0) -> ModelInfo:
        """Pushes a version. ``state_dict`` is a dict of numpy arrays or torch
        tensors, or safetensors bytes. ``expect`` is the version you believe is
        current (0: the model must not exist); by default it is not checked.
        ``life`` is for an optimizer host's state (``"<model>/host-state"``,
        ``rlhub.OptimizerHost``): the life of ``<model>`` its step was of; the
        hub refuses the push (``StaleVersion``) once that life has ended (the
        model deleted). 0: not checked.

        On the hub's data plane the version is sent with one ``sendmsg`` from
        the tensors' own memory (the encoded header, then each tensor's
        bytes: no blob is built); over gRPC (a hub without it) in chunks.
        ``stats["push_bulk"]`` / ``stats["push_grpc"]`` count them, refused
        ones included."""
        errors.check_version("version", version)
        errors.check_version("epoch", epoch)
        errors.check_version("life", life)
        if expect is not EXPECT_ANY:
            errors.check_version("expect", expect)
        if isinstance(state_dict, (bytes, bytearray, memoryview)):
            head, bufs = b"", [memoryview(state_dict).cast("B")]
        else:
            head, bufs = save_parts(state_dict, metadata)
        header = store_pb2.StorePushHeader(
            blob=tensor_pb2.BlobInfo(model=name, version=version, epoch=epoch, life=life,
                                     total_bytes=parts_size(head, bufs), chunk_bytes=self.chunk_bytes),
            expect=0 if expect is EXPECT_ANY else int(expect),
            expect_any=expect is EXPECT_ANY,
        )
        deadline = self._deadline()
        if self._use_bulk(deadline):
            got = self._bulk_push(header, [head, *bufs], deadline)
            if got is not None:
                return _info(got.info)
        self.stats["push_grpc"] += 1

        def requests() -> Iterator[bytes]:
            yield store_pb2.StorePushRequest(header=header).SerializeToString()
            for c in iter_part_chunks(head, bufs, self.chunk_bytes):
                yield chunk_message(c)

        resp: store_pb2.StorePushResponse = self._call(lambda left: self._push(requests(), timeout=left), deadline)
        return _info(resp.info)

    def _bulk_push(self, header: store_pb2.StorePushHeader, body: List[Any],
                   deadline: float) -> Optional[store_pb2.StorePushResponse]:
        """One data-plane push (``_bulk_try``; as over gRPC, a push whose
        connection broke may have landed, and its retry is then refused as
        not newer — unless a cluster primary committed it and could not
        acknowledge it: the same bytes again are acknowledged again there).
        None: push over gRPC instead."""
        hb = header.SerializeToString()

        def attempt(left: float) -> store_pb2.StorePushResponse:
            resp = store_pb2.StorePushResponse()
            assert self._bulk is not None  # _use_bulk() said so
            addr = self._dp_addr(deadline)
            self._bulk.call(addr, PUSH_METHOD, hb, body, resp, max(0.001, deadline - time.monotonic()))
            return resp

        try:
            got = self._bulk_try(attempt, deadline, follow=True)
        except errors.RlhubError:
            self.stats["push_bulk"] += 1  # answered (refused) there
            raise
        if got is not None:
            self.stats["push_bulk"] += 1
        return got

    def _bulk_try(self, attempt: Callable[[float], _T], deadline: float, *, follow: bool = False) -> Optional[_T]:
        """Runs one data-plane request, ``attempt(seconds left)``, retrying
        with backoff on Unavailable while the retries and ``deadline`` last.
        None: use gRPC instead — the hub does not serve the method there
        (then gRPC for ``NOT_SUPPORTED_FOR`` after an ``UNIMPLEMENTED``),
        or, with ``follow`` on a cluster, the tries all ended unavailable
        while the primary changes and time is left (a gRPC call waits for
        the next one). A standby's refusal is followed: the next try goes
        to the primary it names. On a cluster, a connect or handshake left
        unanswered makes the next try look the primary up again. An
        address that twice left one unanswered (``_bulk.NO_ANSWER_TRIES``)
        is not tried again: the retries end there."""
        delay = 0.05
        unanswered: Dict[str, int] = {}  # NoAnswer failures by address
        for n in range(self.retries + 1):
            self._check_open()
            try:
                return attempt(max(0.001, deadline - time.monotonic()))
            except _bulk.NotSupported:
                self.stats["fallback"] += 1
                return None
            except errors.RlhubError as e:
                self._check_open()  # ended by close
                if e.code == grpc.StatusCode.UNIMPLEMENTED:  # a hub without the method on its data plane
                    self._bulk_off_at = time.monotonic()
                    self.stats["fallback"] += 1
                    return None
                if e.code == grpc.StatusCode.UNAVAILABLE:
                    ref = _channel.refusal(e)
                    if ref is not None and isinstance(self._channel, _channel.FollowingChannel):
                        self._channel.offer(*ref)  # a standby: not applied; the next try goes to the primary it names
                    silent = 0
                    if isinstance(e, _bulk.NoAnswer):
                        silent = unanswered[e.addr] = unanswered.get(e.addr, 0) + 1
                        if isinstance(self._channel, _channel.FollowingChannel):
                            # A silent primary (stopped, its machine hung)
                            # leaves the gRPC connection READY, and the
                            # channel would name it again: the next try
                            # looks the primary up, and goes to a standby
                            # elected in its place.
                            self._channel.offer("", 0)
                    pause = delay * (1 + random.random())
                    if silent < _bulk.NO_ANSWER_TRIES and n < self.retries and time.monotonic() + pause < deadline:
                        time.sleep(pause)
                        delay = min(delay * 2, 2.0)
                        continue
                    if (follow and isinstance(self._channel, _channel.FollowingChannel)
                            and time.monotonic() < deadline):
                        self.stats["fallback"] += 1
                        return None
                    if silent >= _bulk.NO_ANSWER_TRIES:
                        raise _bulk.not_tried_again(e, silent) from None
                raise
        raise AssertionError("unreachable")

    # --- reads -----------------------------------------------------------

    def _dp_addr(self, deadline: float) -> str:
        """Where the data plane dials: the address, or for a cluster the
        primary it follows now, waiting until ``deadline`` for a ready one
        when none is; ``Unavailable`` naming the cluster when there is
        none by then."""
        ch = self._channel
        if not isinstance(ch, _channel.FollowingChannel):
            return self.addr
        addr = _channel.primary_addr(ch, "", max(0.001, deadline - time.monotonic()))
        if not addr:
            raise errors.from_rpc_error(ch.no_primary(grpc.StatusCode.UNAVAILABLE, not_sent=True))
        return addr

    def _use_bulk(self, deadline: float) -> bool:
        """Whether to use the data plane (see ``_dp_addr`` for a cluster
        without a primary by ``deadline``)."""
        if self._bulk is None or not self._bulk.supported(self._dp_addr(deadline)):
            return False
        off = self._bulk_off_at
        return off is None or time.monotonic() - off > _bulk.NOT_SUPPORTED_FOR

    def _bulk_read(self, method: str, header: bytes, alloc: _Alloc, deadline: float,
                   direct: Optional[_Direct] = None) -> Optional[Tuple[store_pb2.StorePullHeader, Any]]:
        """One data-plane read with retries on Unavailable; returns
        ``(StorePullHeader, buffer)`` (buffer None when not modified), or
        None when this hub does not serve it (then use gRPC). With
        ``direct`` the buffer is the ``_bulk.Direct`` it made for the
        version's header (see _blob)."""

        def attempt(left: float) -> Tuple[store_pb2.StorePullHeader, Any]:
            h = store_pb2.StorePullHeader()

            def take(hb: bytes, n: int) -> Any:
                h.ParseFromString(hb)
                if h.not_modified:
                    if n:
                        raise errors.InvalidArgument(f"a not-modified answer with {n} body bytes")
                    return bytearray(0)
                if n != h.blob.total_bytes:
                    raise errors.InvalidArgument(f"data frame of {n} bytes for a {h.blob.total_bytes}-byte version")
                if n > self.max_bytes:
                    raise errors.QueueFull(f"version of {n} bytes exceeds the client's max_bytes {self.max_bytes}")
                return direct(h, n) if direct is not None else alloc(n)

            assert self._bulk is not None  # _use_bulk() said so
            addr = self._dp_addr(deadline)
            hb, buf = self._bulk.fetch(addr, method, header, take, max(0.001, deadline - time.monotonic()))
            if hb is None:
                raise errors.RlhubError(f"bulk: {method} answered without a data frame")
            return h, buf

        got = self._bulk_try(attempt, deadline)
        if got is None:
            return None
        h, buf = got
        self.stats["bulk"] += 1
        return h, (None if h.not_modified else buf)

    def _read_version(self, it: Iterator[Any], framework: str, alloc: Optional[_Alloc] = None,
                      nm: Optional[List[tensor_pb2.BlobInfo]] = None) -> Optional[ModelVersion]:
        """Reads one header + its chunks from a pull/watch stream into
        ``alloc(n)`` (default: a fresh buffer of exactly n bytes); None for
        "not modified", whose header's blob (the hub's newest) is appended
        to ``nm``."""
        first = next(it, None)
        if first is None:
            return None
        if isinstance(first, RawChunk) or not first.HasField("header"):
            raise errors.InvalidArgument("stream did not start with a header")
        h = first.header
        if h.not_modified:
            if nm is not None:
                nm.append(h.blob)
            return None
        total = h.blob.total_bytes
        if total > self.max_bytes:
            raise errors.QueueFull(f"version of {total} bytes exceeds the client's max_bytes {self.max_bytes}")
        # np.empty, not bytearray(n): a bytearray is zero-filled first, one
        # more pass over fresh pages that costs as much as receiving them.
        buf = (memoryview(alloc(total)) if alloc is not None else np.empty(total, np.uint8).data).cast("B")
        got = 0
        while got < total:
            msg = next(it, None)
            if msg is None:
                raise errors.InvalidArgument(f"stream ended after {got} of {total} bytes")
            if not isinstance(msg, RawChunk):
                if not msg.HasField("chunk"):
                    raise errors.InvalidArgument(f"a header arrived after {got} of {total} bytes")
                msg = msg.chunk
            n = len(msg.data)
            if got + n > total:
                raise errors.InvalidArgument(f"chunks overrun the announced {total} bytes")
            buf[got:got + n] = msg.data
            got += n
        self.stats["grpc"] += 1
        return ModelVersion(h.blob.model, h.blob.version, h.blob.epoch, buf[:total], dict(h.metadata),
                            h.created_unix_nano, h.skipped, framework, h.blob.life)

    @staticmethod
    def _version(h: store_pb2.StorePullHeader, buf: Any, framework: str) -> ModelVersion:
        return ModelVersion(h.blob.model, h.blob.version, h.blob.epoch, buf, dict(h.metadata),
                            h.created_unix_nano, h.skipped, framework, h.blob.life)

    @staticmethod
    def _blob(h: store_pb2.StorePullHeader, buf: Any) -> Optional[memoryview]:
        """The version's bytes in a data-plane read's buffer; None when a
        ``_bulk.Direct`` took them straight into its target."""
        if isinstance(buf, _bulk.Direct):
            if buf.direct:
                return None
            buf = buf.stage(h.blob.total_bytes)
        return memoryview(buf).cast("B")[:h.blob.total_bytes]

    def _pull_raw(self, name: str, version: int, if_newer_than: Optional[int], framework: str,
                  alloc: Optional[_Alloc] = None, direct: Optional[_Direct] = None,
                  nm: Optional[List[tensor_pb2.BlobInfo]] = None) -> Optional[ModelVersion]:
        """A pull; with ``direct``, over the data plane, a version its
        ``_bulk.Direct`` wrote into the target has blob None. A "not
        modified" answer's blob is appended to ``nm``."""
        req = store_pb2.StorePullRequest(model=name, version=version, chunk_bytes=self.chunk_bytes)
        if if_newer_than is not None:
            req.if_newer_than = if_newer_than
        deadline = self._deadline()
        if self._use_bulk(deadline):
            got = self._bulk_read(PULL_METHOD, req.SerializeToString(),
                                  alloc or (lambda n: np.empty(n, np.uint8)), deadline, direct)
            if got is not None:
                h, buf = got
                if buf is None:
                    if nm is not None:
                        nm.append(h.blob)
                    return None
                return self._version(h, self._blob(h, buf), framework)

        def do(left: float) -> Optional[ModelVersion]:
            it = iter(self._pull(req, timeout=left))
            return self._read_version(it, framework, alloc, nm)

        return self._call(do, deadline)

    def pull(self, name: str, version: int = 0, *, if_newer_than: Optional[int] = None,
             framework: str = "numpy", life: int = 0) -> Optional[ModelVersion]:
        """Pulls the newest version (or an exact one). With ``if_newer_than``
        returns None when the newest is not newer ("not modified"). The
        version's ``blob`` is a fresh buffer the caller owns.

        ``life``, with ``if_newer_than`` and the newest asked for, is the
        life of version ``if_newer_than`` (its ``ModelVersion.life``): the
        newest is then also returned when it is of another life, though not
        newer (the model deleted and pushed again; docs/weight-sync.md,
        "Lives"). The hub's "not modified" names its newest; when that is of
        another life — or, from a data plane that does not name its life,
        older than ``if_newer_than`` — the newest is pulled again and
        returned if its life is known and not ``life``. 0: versions only
        grow."""
        errors.check_version("version", version)
        errors.check_version("life", life)
        if if_newer_than is not None:
            errors.check_version("if_newer_than", if_newer_than)
        if not life or if_newer_than is None or version:
            return self._pull_raw(name, version, if_newer_than, framework)
        nm: List[tensor_pb2.BlobInfo] = []
        got = self._pull_raw(name, 0, if_newer_than, framework, nm=nm)
        if got is not None or not nm:
            return got
        newest = nm[0]
        if newest.life == life or (newest.life == 0 and newest.version >= if_newer_than):
            return None  # the same life (or nothing says otherwise): not modified
        got = self._pull_raw(name, 0, None, framework)
        return got if got is not None and _new_life(got.life, life) else None

    def watch(self, name: str, after: int = 0, *, framework: str = "numpy",
              timeout: Optional[float] = None, life: int = 0,
              follow_lives: bool = True) -> Iterator[ModelVersion]:
        """Yields each new version as it lands (skipping to the newest when
        the reader is slow; over gRPC ``ModelVersion.skipped`` says how
        many, over the data plane it is 0).

        It follows the model's lives (docs/weight-sync.md, "Lives"): once
        the model is deleted and pushed again, it yields the new life's
        newest at once, though that is not newer than the last version
        yielded (``ModelVersion.life`` changes); within a life versions only
        grow. ``life`` is the life of version ``after`` (0: unknown, the
        first version yielded is newer than ``after``). A hub restart or a
        cluster failover keeps the lives (a hub with ``--data``), so the
        watch goes on from the version it yielded. ``follow_lives=False``
        keeps the old rule (only newer versions: a deleted model's
        followers wait for the new model to pass them), as does a hub that
        predates lives.

        A watch is long-lived: it outlasts the hub it reads from. When the
        hub is unreachable (stopped, killed, restarting: ``Unavailable``)
        or does not answer within the client's ``timeout``, or a cluster
        has no primary or is moving it, the watch asks again
        after the last version it yielded, backing off from 50 ms to 1 s,
        for as long as it takes: until the hub answers again (it then goes
        on from there, missing no version the hub kept), ``timeout``
        seconds from the start of the watch pass (``DeadlineExceeded``,
        naming the last failure), or :meth:`close` is called (``CANCELLED``).
        ``retries`` does not bound it. Any other error ends the watch at
        once: ``NotFound``, ``PermissionDenied``, ``Unauthenticated``,
        ``InvalidArgument``... (a retry could not change them). Each
        data-plane poll or stream opening is bounded by the client's
        ``timeout``."""
        errors.check_version("after", after)
        errors.check_version("life", life)
        yield from self._watch_raw(name, after, framework, timeout, None, life=life if follow_lives else None)

    def _watch_raw(self, name: str, after: int, framework: str, timeout: Optional[float],
                   alloc: Optional[_Alloc], direct: Optional[_Direct] = None,
                   life: Optional[int] = None) -> Iterator[ModelVersion]:
        """The watch (see :meth:`watch`): each turn is one data-plane poll,
        or one gRPC stream read until it breaks; an ``Unavailable`` turn is
        tried again after a back-off, anything else is raised. ``life``
        (not None: follow lives) is the life of ``after``; each turn asks
        after the last version yielded and its life."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, last = _WATCH_BACKOFF[0], None  # last: the latest Unavailable, for the final error
        while True:
            self._check_open()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.DeadlineExceeded(f"watch of {name[:200]!r}: deadline exceeded"
                                              + (f" (last: {str(last)[:500]})" if last is not None else ""))
            turn = now + self.timeout if deadline is None else min(deadline, now + self.timeout)
            gen = self._watch_turn(name, after, life, framework, turn, deadline, alloc, direct)
            try:
                while True:
                    try:
                        v = next(gen)
                    except StopIteration as stop:
                        if stop.value:
                            return  # the hub ended the stream
                        delay, last = _WATCH_BACKOFF[0], None  # answered (maybe "nothing new")
                        break
                    delay, last = _WATCH_BACKOFF[0], None
                    after = v.version
                    if life is not None:
                        life = v.life
                    yield v
            except errors.RlhubError as e:
                self._check_open()  # ended by close
                if e.code not in _WATCH_TRANSIENT:
                    raise
                last = e  # the next turn raises DeadlineExceeded naming it if the watch's deadline passed
                pause = delay * (0.5 + 0.5 * random.random())
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                self._closing.wait(pause)
                delay = min(2 * delay, _WATCH_BACKOFF[1])
            except ValueError:  # its channel was closed (by close(): CANCELLED)
                self._check_open()
                raise
            finally:
                gen.close()  # a stream it has open is cancelled now, not when collected

    def _watch_turn(self, name: str, after: int, life: Optional[int], framework: str, turn: float,
                    deadline: Optional[float], alloc: Optional[_Alloc],
                    direct: Optional[_Direct]) -> Generator[ModelVersion, None, bool]:
        """One turn of a watch: a data-plane poll bounded by ``turn``
        (yields its version, if one came), or, on a hub that does not
        serve it there, one gRPC stream (bounded by ``deadline``) read
        until it ends; returns True when the hub ended that stream
        cleanly. Failures are raised as rlhub errors; a version cut midway
        was only in the receive buffer and comes again whole."""
        follow, at = life is not None, life or 0  # unset (the old rule) when not following
        if self._use_bulk(turn):
            req = store_pb2.StoreWatchRequest(model=name, after=after, follow_lives=follow, life=at)
            got = self._bulk_read(WATCH_METHOD, req.SerializeToString(),
                                  alloc or (lambda n: np.empty(n, np.uint8)), turn, direct)
            if got is not None:
                h, buf = got
                if buf is not None:  # else nothing new within the server's poll: the next turn asks again
                    yield self._version(h, self._blob(h, buf), framework)
                return False
            # the hub has no data-plane watch: gRPC below
        try:
            call = self._watch(store_pb2.StoreWatchRequest(model=name, after=after, chunk_bytes=self.chunk_bytes,
                                                         follow_lives=follow, life=at),
                               timeout=None if deadline is None else max(deadline - time.monotonic(), 0.001))
        except grpc.RpcError as e:  # a cluster without a ready primary
            raise errors.from_rpc_error(e) from None
        it = iter(call)
        try:
            while True:
                try:
                    mv = self._read_version(it, framework, alloc)
                except grpc.RpcError as e:
                    raise errors.from_rpc_error(e) from None
                if mv is None:
                    return True  # the hub ended the stream: so does the watch
                yield mv
        finally:
            call.cancel()

    # --- in place -----------------------------------------------------------

    def _stage_alloc(self, n: int) -> np.ndarray:
        """The reused receive buffer, grown (once) to at least n bytes."""
        if self._stage.nbytes < n:
            self._stage = np.empty(n, np.uint8)
        return self._stage

    def pull_into(self, name: str, target: Any, *, version: int = 0,
                  if_newer_than: Optional[int] = None) -> Optional[int]:
        """Pulls a version (the newest, an exact one, or with
        ``if_newer_than`` only a newer one) and writes it straight into
        ``target``'s tensors: an ``nn.Module`` (its ``state_dict()``) or a
        dict of torch tensors / writable numpy arrays. Returns the version
        written, or None when not modified.

        The version must have exactly the target's names, dtypes and shapes;
        otherwise ``InvalidArgument`` says which differ and nothing is
        written. A target tensor that cannot be written whole in place (on
        the meta device, sparse, expanded) raises ``ValueError`` before
        anything is asked of the hub. The bytes are received into a buffer
        this client keeps and reuses, checked whole, then copied into the
        tensors: a transfer that breaks midway changes nothing, and no
        version allocates memory of the model's size. Calls on one client share that buffer and run
        one at a time (``watch_into`` has its own). Over the data plane,
        once the whole version (and the start of the hub's final answer)
        is in the socket's receive queue, it is received straight into the
        tensors instead, skipping the copy: the reads then cannot stop
        midway (``_bulk.Direct``).

        The plan of the target's tensors (their byte views) is kept from
        one call to the next and rebuilt when a tensor was replaced,
        reallocated or reshaped (``tensors.TargetCache``).

        As with ``load_state_dict``, autograd sees the write as an in-place
        change of the tensors (their version counters are bumped): a graph
        that saved the old values refuses ``backward``."""
        errors.check_version("version", version)
        if if_newer_than is not None:
            errors.check_version("if_newer_than", if_newer_than)
        with self._stage_mu:
            t = self._targets.get(target)
            v = self._pull_raw(name, version, if_newer_than, "numpy", self._stage_alloc,
                               _into(lambda: t, name, self._stage_alloc))
            if v is None:
                return None
            if v.blob is not None:
                t.write(v.blob, what=f"model {name!r} version {v.version}")
            else:
                t.written()
                self.stats["direct"] += 1
            return v.version

    def watch_into(self, name: str, target: Any, after: int = 0, *,
                   timeout: Optional[float] = None, life: int = 0, follow_lives: bool = True) -> Iterator[int]:
        """Like :meth:`watch`, but writes each new version into ``target``
        (as :meth:`pull_into`) before yielding its number (following lives
        as :meth:`watch` does: after a model is deleted and pushed again the
        number yielded goes back to the new life's). A version that
        does not fit the target raises ``InvalidArgument`` (target
        unchanged) and ends the watch. Each version is written into the
        target's tensors as they are when it arrives (a tensor replaced or
        reshaped during the watch is seen, as by ``pull_into``)."""
        errors.check_version("after", after)
        errors.check_version("life", life)
        targets = TargetCache()  # this watch's own
        targets.get(target)  # a target that is no tensors is refused before any version
        stage = [np.empty(0, np.uint8)]  # this watch's own receive buffer, reused

        def alloc(n: int) -> np.ndarray:
            if stage[0].nbytes < n:
                stage[0] = np.empty(n, np.uint8)
            return stage[0]

        into: List[Target] = []  # the target a data-plane version was received into directly

        def current() -> Target:
            into[:] = [targets.get(target)]
            return into[0]

        for v in self._watch_raw(name, after, "numpy", timeout, alloc, _into(current, name, alloc),
                                 life=life if follow_lives else None):
            if v.blob is not None:
                targets.get(target).write(v.blob, what=f"model {name!r} version {v.version}")
            else:
                into[0].written()
                self.stats["direct"] += 1
            yield v.version

    def list(self, *, page_size: int = 0) -> List[ModelInfo]:
        """Every model, sorted by name. The hub answers a page at a time
        (at most ``page_size`` models, and about 2 MiB; 0 means the hub's
        default, 1000, which is also its most): this asks page after page,
        each retried on its own, all within one ``timeout``. A hub whose
        pages do not move forward raises ``RlhubError`` instead of looping;
        a hub that predates paging answers with a single page."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or not 0 <= page_size < 1 << 32:
            raise errors.InvalidArgument(f"page_size must be a whole number from 0 to 2**32-1, not {repr(page_size)[:24]}")
        deadline = self._deadline()
        out: List[ModelInfo] = []
        token = ""
        while True:
            req = store_pb2.StoreListRequest(page_size=page_size, page_token=token)
            resp: store_pb2.StoreListResponse = self._call(
                lambda left: self._stub.List(req, timeout=left), deadline)
            if resp.models and out and resp.models[0].name <= out[-1].name:
                raise errors.RlhubError(
                    f"protocol: List page starting at {resp.models[0].name[:200]!r} does not follow {out[-1].name[:200]!r}")
            out.extend(_info(m) for m in resp.models)
            nxt = resp.next_page_token
            if not nxt:
                return out
            if nxt == token or not resp.models:
                raise errors.RlhubError(f"protocol: List page of {len(resp.models)} models does not advance its page token")
            token = nxt


def _new_life(got: int, life: int) -> bool:
    """Whether a version of life ``got`` is of another life than ``life``,
    both known (not 0): the model deleted and pushed again, whose versions
    start afresh (docs/weight-sync.md, "Lives")."""
    return got != 0 and life != 0 and got != life


_Direct = Callable[[store_pb2.StorePullHeader, int], _bulk.Direct]
"""direct(version's header, n): the destination of a data-plane version."""


def _into(target: Callable[[], Target], name: str, stage: Callable[[int], Any]) -> _Direct:
    """A data-plane version's destination for pull_into / watch_into:
    straight into the tensors of target() (asked when the version
    arrives), else staged in stage(n) and written after."""
    def direct(h: store_pb2.StorePullHeader, n: int) -> _bulk.Direct:
        what = f"model {name!r} version {h.blob.version}"
        t = target()
        return _bulk.Direct(lambda take, k: t.plan(take, k, what=what), stage)

    return direct
