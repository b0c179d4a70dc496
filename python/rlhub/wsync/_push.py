"""The push fan-out's collector side (WeightSync.Attach). Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from typing import Any, Iterator, Optional

import grpc

from rlhub import errors
from rlhub._proto.rlhub.v1 import sync_pb2
from rlhub._transfer import Assembler, RawChunk, fast_decoder
from rlhub.store import _new_life
from rlhub.store import channel as _channel
from rlhub.tensors import parse_header
from rlhub.wsync._source import WeightVersion

ANSWER_WITHIN = 10.0
"""Seconds a push stream's hub has to answer a health check before the
source ends (:class:`PushSource`'s ``answer_within``)."""


def _raw(b: bytes) -> bytes:
    return b


class PushSource:
    """A collector attached to the hub's (or a relay's) push stream.

    A background thread assembles each version the server sends and keeps
    the newest (a slow reader skips versions, as the server does).
    :meth:`running` reports the version the collector runs on the same
    stream; a :class:`Receiver` calls it after each apply. The source does
    not reconnect: once the stream has ended and the newest version has been
    taken, the source raises :class:`rlhub.Unavailable`.

    By default it follows the model's lives (``SyncHello.follow_lives``;
    docs/weight-sync.md, "Lives"): once the model is deleted and pushed
    again the hub sends the new life's newest at once, which replaces the
    newest kept here though it is not newer, and ``get_if_newer`` /
    ``wait_newer`` given ``life`` (the life of the version the caller runs,
    as a :class:`Receiver` passes it) return it. ``start_life`` is the life
    of ``start``. ``follow_lives=False`` keeps the old rule (only newer
    versions), as does a hub that predates lives (it ignores the request).

    The stream has no first message from the server, so a hub that is hung
    (SIGSTOPped, wedged) would look like one with nothing new until
    keepalive gave up. Before reading the stream the source asks the same
    channel for a health check: any answer, a refusal too, shows the hub
    alive; none within ``answer_within`` seconds (default
    :data:`ANSWER_WITHIN`, None skips the check) ends the source with
    :class:`rlhub.Unavailable` saying the hub sent nothing, which
    ``get_if_newer`` / ``wait_newer`` raise (and a :class:`FailoverSource`
    moves on). As the Go client's ``ClientConfig.AnswerWithin``.
    """

    via = "push"

    def __init__(self, addr: Optional[str], model: str, *, collector_id: Optional[str] = None,
                 start: int = 0, chunk_bytes: int = 0, channel_: Optional[grpc.Channel] = None,
                 max_bytes: int = 4 << 30, follow_lives: bool = True, start_life: int = 0,
                 answer_within: Optional[float] = ANSWER_WITHIN):
        if not model:
            raise ValueError("PushSource needs a model")
        errors.check_version("start", start)  # before a channel or thread exists
        errors.check_version("start_life", start_life)
        if answer_within is not None and not answer_within > 0:
            raise ValueError(f"answer_within must be positive seconds or None, got {answer_within!r}")
        self._answer_within = answer_within
        self.model = model
        self.follows_lives = follow_lives
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._own = channel_ is None
        if channel_ is None:
            if not addr:
                raise ValueError("PushSource needs an address or a channel")
            channel_ = _channel(addr)
        self._channel = channel_
        self._max_bytes = max_bytes
        self._out: "queue.Queue[Optional[sync_pb2.SyncClientMessage]]" = queue.Queue()
        self._out.put(sync_pb2.SyncClientMessage(hello=sync_pb2.SyncHello(
            collector_id=self.collector_id, model=model, version=start, chunk_bytes=chunk_bytes,
            follow_lives=follow_lives, life=start_life if follow_lives else 0)))
        self._cond = threading.Condition()
        self._newest: Optional[WeightVersion] = None  # guarded by _cond
        self._ended: Optional[errors.RlhubError] = None  # guarded by _cond
        self._closing = False  # guarded by _cond
        self._check: Optional["grpc.Future[bytes]"] = None  # the health check in flight; guarded by _cond
        attach = self._channel.stream_stream(  # chunks decoded without protobuf copies
            "/rlhub.v1.WeightSync/Attach", request_serializer=sync_pb2.SyncClientMessage.SerializeToString,
            response_deserializer=fast_decoder(sync_pb2.SyncServerMessage))
        self._call = attach(self._requests())
        self._thread = threading.Thread(target=self._receive, name=f"rlhub-push-{model}", daemon=True)
        self._thread.start()

    def _requests(self) -> Iterator[sync_pb2.SyncClientMessage]:
        while True:
            m = self._out.get()
            if m is None:
                return
            yield m

    def _answers(self) -> None:
        """Returns once the hub answered a health check (any status but
        no answer), raises Unavailable when it sent nothing within
        answer_within or the source was closed."""
        if self._answer_within is None:
            return
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check",
                                          request_serializer=_raw, response_deserializer=_raw)
        with self._cond:
            if self._closing:
                raise errors.Unavailable(f"push stream of {self.model!r} closed")
            fut = check.future(b"", timeout=self._answer_within)  # an empty HealthCheckRequest
            self._check = fut
        try:
            fut.result()
        except grpc.FutureCancelledError:
            raise errors.Unavailable(f"push stream of {self.model!r} closed") from None
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise errors.Unavailable(
                    f"push stream of {self.model!r}: the hub sent nothing within {self._answer_within:g} s "
                    "(answer_within): it is hung or stopped") from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise errors.from_rpc_error(e) from None
            # Any other status (Unimplemented, Unauthenticated, ...) is an
            # answer: the stream's own call says what it has to.

    def _receive(self) -> None:
        err: errors.RlhubError
        try:
            self._answers()
            it = iter(self._call)
            for msg in it:
                if isinstance(msg, RawChunk) or not msg.HasField("info"):
                    raise errors.InvalidArgument("push stream: chunk without a version info")
                info = msg.info
                if info.model != self.model:
                    raise errors.InvalidArgument(f"push stream sent model {info.model!r} on the stream of {self.model!r}")
                asm = Assembler(info.total_bytes, self._max_bytes)
                got = 0
                while got < info.total_bytes:
                    c = next(it, None)
                    if c is not None and not isinstance(c, RawChunk):
                        c = c.chunk if c.HasField("chunk") else None
                    if c is None:
                        raise errors.InvalidArgument(
                            f"push stream: version {info.version} ended after {got} of {info.total_bytes} bytes")
                    asm.write(c.data)
                    got += len(c.data)
                blob = asm.finish()
                try:
                    parse_header(memoryview(blob))
                except ValueError as e:
                    raise errors.InvalidArgument(f"push stream version {info.version}: {e}") from None
                wv = WeightVersion(info.model, info.version, info.epoch, blob, self.via, life=info.life)
                with self._cond:
                    if (self._newest is None or wv.version > self._newest.version
                            or (self.follows_lives and _new_life(wv.life, self._newest.life))):
                        self._newest = wv  # newer, or the newest of a model deleted and pushed again
                    self._cond.notify_all()
            err = errors.Unavailable(f"push stream of {self.model!r} ended")
        except grpc.RpcError as e:
            err = errors.from_rpc_error(e)
            if isinstance(err, errors.RlhubError) and e.code() == grpc.StatusCode.CANCELLED:
                err = errors.Unavailable(f"push stream of {self.model!r} closed")
        except errors.RlhubError as e:
            err = e
            self._call.cancel()
        except ValueError as e:  # the Assembler's limits
            err = errors.InvalidArgument(f"push stream: {e}")
            self._call.cancel()
        with self._cond:
            self._ended = err
            self._cond.notify_all()

    def _take(self, than: int, life: int) -> Optional[WeightVersion]:
        # Called with _cond held.
        n = self._newest
        if n is not None and (n.version > than or (self.follows_lives and _new_life(n.life, life))):
            return n
        if self._ended is not None:
            raise type(self._ended)(f"{self._ended.message}", self._ended.code)
        return None

    def get_if_newer(self, than: int, life: int = 0) -> Optional[WeightVersion]:
        """The newest received version if newer than ``than`` (or, following
        lives, of another life than ``life``), else None."""
        with self._cond:
            return self._take(than, life)

    def wait_newer(self, after: int, timeout: Optional[float] = None, life: int = 0) -> Optional[WeightVersion]:
        """Blocks until a version newer than ``after`` (or, following lives,
        of another life than ``life``) has arrived."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                wv = self._take(after, life)
                if wv is not None:
                    return wv
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def running(self, version: int) -> None:
        """Reports on the stream that the collector now runs ``version``."""
        errors.check_version("version", version)
        self._out.put(sync_pb2.SyncClientMessage(running=sync_pb2.SyncRunning(version=version)))

    def close(self) -> None:
        """Ends the stream and waits for the receive thread. Safe to call twice."""
        with self._cond:
            self._closing = True
            if self._check is not None:
                self._check.cancel()
        self._out.put(None)
        self._call.cancel()
        self._thread.join()
        if self._own:
            self._channel.close()
            self._own = False

    def __enter__(self) -> "PushSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
