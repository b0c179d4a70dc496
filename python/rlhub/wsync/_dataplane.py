"""Push fan-out on the data plane: :class:`DataPlaneSource`.

A collector attached to the hub long-polls the hub's data-plane watch
(``rlhub.v1.WeightSync/Watch``, docs/wire.md): each answer is the newest
version, written by the hub with ``writev`` straight from the store's
memory and received here with ``recv_into`` into a buffer the source
reuses. The hub learns the version the collector runs from every poll.
Against a hub without the method it attaches to the gRPC push stream
(:class:`rlhub.wsync.PushSource`) instead.

Given a cluster (``"h1:p1,h2:p2"`` or ``"etcd://E/NAME"``) it follows the
primary as the Go ``wsync.DataPlaneClient`` does (docs/weight-sync.md,
"Collectors on a cluster"): each poll dials the primary a
:class:`rlhub._channel.FollowingChannel` follows; a standby's refusal is
followed to the primary it names and any other failed poll makes the
channel look the primary up again; ``wait_newer`` keeps polling across an
election.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Dict, List, Optional, Union

import grpc
import numpy as np

from rlhub import _bulk, _channel, errors
from rlhub._proto.rlhub.v1 import store_pb2, sync_pb2
from rlhub.store import _new_life
from rlhub.tensors import parse_header
from rlhub.wsync._push import PushSource
from rlhub.wsync._source import WeightVersion

WATCH_METHOD = "rlhub.v1.WeightSync/Watch"
"""The hub's data-plane watch (header ``SyncHello``)."""

WAIT_MS = 5000
"""The longest wait the hub grants one poll (its ``DataPlaneWait``)."""

_SLACK = 10.0  # seconds added to a poll's wait for its socket deadline
ANSWER_SLACK = 1.0
"""Seconds past its ``timeout`` that ``wait_newer`` waits for the hub to
answer before it raises ``DeadlineExceeded`` (a hub that accepted the
connection and sent nothing: hung, stopped, or not a hub); and past its
1 ms poll, ``get_if_newer``. The hub answers the last poll when the
timeout ends; an answer begun by then (a version that came at the very
end) is still received whole, within the poll's ``_SLACK``."""
_FOLLOW_BACKOFF0, _FOLLOW_BACKOFF_MAX = 0.02, 0.25  # pauses after a failed poll on a cluster
_MAX_NO_DATA_PLANE = 3  # on a cluster: not-supported polls in a row before the push-stream fallback
_BUFFERS = 3  # the last two versions taken stay whole while a third is received


class DataPlaneSource:
    """A collector following a hub over the data plane (the Go
    ``wsync.DataPlaneClient``).

    ``wait_newer`` long-polls; each version is received with ``recv_into``
    into one of three buffers the source reuses, and returned only once the
    hub's final status was OK and its header parsed: a connection that
    breaks mid-version raises :class:`rlhub.Unavailable` and returns
    nothing. A version's ``blob`` stays valid until two newer versions have
    been taken from the source (a :class:`rlhub.wsync.Receiver` copies each
    into its module, so that is enough); copy it to keep it longer.

    The hub records the version in every poll as the collector's report
    (via ``push-dp``), so :meth:`running` only matters on the fallback
    stream. ``stats``: ``polls``, ``versions``, ``skipped`` (version numbers
    between the one asked after and the one delivered: newer ones landed
    meanwhile; the hub reports them, the fallback stream's are counted here) and
    ``fallback`` (1 once on the push stream), ``follows`` (failed polls
    after which a cluster's primary was followed again). Use from one
    thread.

    On a cluster target, versions delivered only grow (each poll asks for
    one newer than the collector runs), a version whose epoch is older than
    one already delivered (a deposed primary's) is refused and the primary
    looked up again, and the versions a new primary never had show in
    ``stats["skipped"]``. ``wait_newer`` keeps polling through
    ``Unavailable``/``DeadlineExceeded`` there (a dead, hung or standby hub)
    and raises any other error; ``get_if_newer`` raises the poll's error
    after reporting it to the channel.

    By default it follows the model's lives (docs/weight-sync.md, "Lives"):
    each poll names the life of the version it asks after
    (``SyncHello.follow_lives``), and once the model is deleted and pushed
    again the hub answers with the new life's newest at once, though it is
    not newer; ``get_if_newer`` and ``wait_newer`` given ``life`` (as a
    :class:`Receiver` passes it) return it. A new life is taken only at an
    epoch no older than the newest delivered. ``follow_lives=False`` keeps
    the old rule (only newer versions), as does a hub that predates lives.
    """

    via = "push-dp"

    def __init__(self, addr: str, model: str, *, collector_id: Optional[str] = None, start: int = 0,
                 max_bytes: int = 4 << 30, fallback: bool = True,
                 bulk_client: Optional[_bulk.Client] = None, channel_: Optional[grpc.Channel] = None,
                 follow_lives: bool = True):
        self.follows_lives = follow_lives
        if not model or not addr:
            raise ValueError("DataPlaneSource needs an address and a model")
        errors.check_version("start", start)
        self.addr = addr
        # A cluster: the channel that follows its primary (given, or ours).
        self._follow: Optional[_channel.FollowingChannel] = None
        self._own_follow = False
        if isinstance(channel_, _channel.FollowingChannel):
            self._follow = channel_
        elif _channel.parse_target(addr).clustered:
            ch = _channel.channel(addr)
            assert isinstance(ch, _channel.FollowingChannel)
            self._follow, self._own_follow = ch, True
        self._epoch = 0  # the newest epoch delivered
        self._no_dp = 0  # not-supported polls in a row on a cluster
        self.model = model
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._start = start
        self._max_bytes = max_bytes
        self._allow_fallback = fallback
        self._own_bulk = bulk_client is None
        self._bulk = bulk_client or _bulk.Client()
        if self._follow is not None:
            self._follow.on_move(self._bulk.abort)  # a poll held by a primary that moved ends there
        self._bufs: List[Optional[np.ndarray]] = [None] * _BUFFERS
        self._taken = [-1, -1]  # indices of the last two versions taken, newest last
        self._fallback: Optional[PushSource] = None  # once the hub lacked the method
        self._closed = False
        self.stats: Dict[str, int] = {"polls": 0, "versions": 0, "skipped": 0, "fallback": 0, "follows": 0}

    @property
    def transport(self) -> str:
        """``"dataplane"``, or ``"grpc"`` once on the push stream."""
        return "grpc" if self._fallback is not None else "dataplane"

    def _free(self) -> int:
        return next(i for i in range(_BUFFERS) if i not in self._taken)

    def _poll(self, after: int, wait_ms: int, life: int = 0,
              answer_by: Optional[float] = None) -> Union[WeightVersion, None, str]:
        """One poll: a WeightVersion newer than ``after`` (or, following
        lives, of another life than ``life``), None ("not modified"), or the
        string "fallback" when the hub lacks the method. ``answer_by`` (a
        ``time.monotonic()`` time) bounds the connection and the wait for
        the answer to begin; the answer then has the poll's ``_SLACK``."""
        if self._closed:
            raise errors.Unavailable("data-plane source is closed")
        life = life if self.follows_lives else 0
        hello = sync_pb2.SyncHello(collector_id=self.collector_id, model=self.model, version=after,
                                   wait_ms=wait_ms, follow_lives=self.follows_lives,
                                   life=life).SerializeToString()
        h = store_pb2.StorePullHeader()
        idx = self._free()
        where = self.addr
        if self._follow is not None:  # a cluster: its primary now
            # Waiting for a ready primary no longer than the poll would.
            where = _channel.primary_addr(self._follow, "", max(0.05, min(_channel.RESOLVE_TIMEOUT, wait_ms / 1000)))
            if not where:
                e = errors.Unavailable(f"cluster {self.addr[:200]}: no primary known yet")
                self._followed(e)
                raise e

        def alloc(hb: bytes, n: int) -> Any:
            h.ParseFromString(hb)
            if h.not_modified:
                if n:
                    raise errors.InvalidArgument(f"a not-modified answer with {n} body bytes")
                return bytearray(0)
            b = h.blob
            if b.model != self.model:
                raise errors.InvalidArgument(f"hub sent model {b.model[:100]!r} for {self.model!r}")
            if n != b.total_bytes:
                raise errors.InvalidArgument(f"hub sent {n} bytes for a {b.total_bytes}-byte version")
            if n > self._max_bytes:
                raise errors.QueueFull(f"version of {n} bytes exceeds max_bytes {self._max_bytes}")
            if b.version <= after and not _new_life(b.life, life):
                raise errors.InvalidArgument(f"hub sent version {b.version} after {after}")
            if b.epoch < self._epoch:
                raise errors.Unavailable(f"{where} sent version {b.version} of epoch {b.epoch}, older than epoch "
                                         f"{self._epoch} already delivered (a deposed primary)")
            buf = self._bufs[idx]
            if buf is None or buf.nbytes < n:
                self._bufs[idx] = None  # the model grew: let the old one go first
                # np.empty: no zero-filling pass before recv_into overwrites it.
                buf = self._bufs[idx] = np.empty(n, np.uint8)
            return buf

        self.stats["polls"] += 1
        try:
            within = None if answer_by is None else max(answer_by - time.monotonic(), 0.0)
            hb, buf = self._bulk.fetch(where, WATCH_METHOD, hello, alloc, wait_ms / 1000 + _SLACK,
                                       answer_within=within)
        except _bulk.NotSupported as e:
            if self._follow is None:
                return "fallback"
            # A cluster: a hub that hangs up on the handshake may be a dying
            # primary (SIGKILL resets the connections it had not accepted);
            # only _MAX_NO_DATA_PLANE in a row mean the primary has none.
            self._no_dp += 1
            if self._no_dp >= _MAX_NO_DATA_PLANE:
                return "fallback"
            u = errors.Unavailable(f"{where}: {e}")
            self._followed(u)
            raise u from None
        except errors.RlhubError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                return "fallback"
            if self._follow is not None and self._followable(e):
                self._followed(e)
            raise
        if hb is None:
            raise errors.RlhubError(f"bulk: {WATCH_METHOD} answered without a data frame")
        if h.not_modified:
            return None
        n = h.blob.total_bytes
        blob = memoryview(buf).cast("B")[:n]
        try:
            parse_header(blob)
        except ValueError as e:
            raise errors.InvalidArgument(f"version {h.blob.version} from {self.addr}: {e}") from None
        self._taken = [self._taken[1], idx]
        self._epoch = max(self._epoch, h.blob.epoch)
        self._no_dp = 0
        self.stats["versions"] += 1
        self.stats["skipped"] += h.skipped
        return WeightVersion(h.blob.model, h.blob.version, h.blob.epoch, blob, self.via, life=h.blob.life)

    @staticmethod
    def _followable(e: errors.RlhubError) -> bool:
        """A failure a cluster's primary is followed across: the hub is
        gone, hangs, or is a standby."""
        return e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    def _followed(self, e: errors.RlhubError) -> None:
        """Tells the following channel what a failed poll saw: a standby's
        refusal names the primary; anything else asks for a lookup."""
        assert self._follow is not None
        r = _channel.refusal(e.message)
        self._follow.offer(*(r if r is not None else ("", 0)))
        self.stats["follows"] += 1

    def _admit(self, wv: Optional[WeightVersion], after: int, life: int = 0) -> Optional[WeightVersion]:
        """A fallback stream's version taken after ``after`` (of life
        ``life``), unless its epoch is older than one delivered; counts what
        it skipped (the data plane's skips come from the hub), none across
        lives: a new life's versions start afresh."""
        if wv is not None:
            if wv.epoch < self._epoch:
                raise errors.Unavailable(f"version {wv.version} of epoch {wv.epoch} is older than epoch "
                                         f"{self._epoch} already delivered (a deposed primary)")
            self._epoch = wv.epoch
            if after and wv.version > after + 1 and not _new_life(wv.life, life):
                self.stats["skipped"] += wv.version - after - 1
        return wv

    def _drop_fallback(self) -> None:
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def _use_fallback(self, after: int, life: int = 0) -> PushSource:
        if not self._allow_fallback:
            raise errors.Unavailable(f"{self.addr} serves no data-plane watch (fallback off)")
        self._fallback = PushSource(self.addr, self.model, collector_id=self.collector_id, start=after,
                                    max_bytes=self._max_bytes, channel_=self._follow,
                                    follow_lives=self.follows_lives, start_life=life)
        self.stats["fallback"] = 1
        return self._fallback

    def get_if_newer(self, than: int, life: int = 0) -> Any:
        """The newest version if newer than ``than`` (or, following lives,
        of another life than ``life``; a 1 ms poll), else None.

        It does not wait on a hub that does not answer: one that accepts
        the connection and has not begun its answer :data:`ANSWER_SLACK`
        after the poll raises :class:`rlhub.DeadlineExceeded` saying the
        hub sent nothing (not after the 10 s handshake bound)."""
        errors.check_version("than", than)
        errors.check_version("life", life)
        if self._fallback is not None:
            try:
                return self._admit(self._fallback.get_if_newer(than, life=life), than, life)
            except errors.RlhubError as e:
                if self._follow is not None and self._followable(e):
                    self._drop_fallback()  # attached again, to the new primary, next time
                raise
        got = self._poll(than, 1, life, time.monotonic() + 0.001 + ANSWER_SLACK)
        if isinstance(got, str):
            return self._use_fallback(than, life).get_if_newer(than, life=life)
        return got

    def wait_newer(self, after: int, timeout: Optional[float] = None, life: int = 0) -> Any:
        """Long-polls until a version newer than ``after`` (or, following
        lives, of another life than ``life``) arrives (None when
        ``timeout`` seconds pass first).

        With a ``timeout`` it returns or raises within ``timeout`` plus
        :data:`ANSWER_SLACK` (and the time to receive a version whose
        answer began by then): a hub that accepts the connection and
        sends nothing raises :class:`rlhub.DeadlineExceeded` then (on a
        cluster, which polls on through it, None)."""
        errors.check_version("after", after)
        errors.check_version("life", life)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FOLLOW_BACKOFF0
        while True:
            try:
                if self._fallback is not None:
                    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                    return self._admit(self._fallback.wait_newer(after, left, life=life), after, life)
                wait_ms = WAIT_MS
                if deadline is not None:
                    wait_ms = int(min(max(deadline - time.monotonic(), 0.001), WAIT_MS / 1000) * 1000) or 1
                got = self._poll(after, wait_ms, life, None if deadline is None else deadline + ANSWER_SLACK)
            except errors.RlhubError as e:
                if self._follow is None or self._closed or not self._followable(e):
                    raise
                # A cluster: the primary died, refused, or is being elected.
                self._drop_fallback()
                if deadline is not None and time.monotonic() + pause >= deadline:
                    return None
                time.sleep(pause)
                pause = min(2 * pause, _FOLLOW_BACKOFF_MAX)
                continue
            pause = _FOLLOW_BACKOFF0
            if isinstance(got, str):
                self._use_fallback(after, life)
                continue
            if got is not None:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def running(self, version: int) -> None:
        """On the data plane the next poll reports ``version``; on the
        fallback stream it is sent."""
        if self._fallback is not None:
            self._fallback.running(version)

    def close(self) -> None:
        """Closes the connections (and the fallback stream). Safe to call twice."""
        self._closed = True
        if self._fallback is not None:
            self._fallback.close()
        if self._own_bulk:
            self._bulk.close()
        if self._own_follow and self._follow is not None:
            self._follow.close()
            self._own_follow = False

    def __enter__(self) -> "DataPlaneSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
