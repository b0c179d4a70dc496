"""Failover over sources (the Go wsync.Failover, plus a way back). Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

from rlhub import errors
from rlhub.store import _new_life
from rlhub.store import channel as _channel
from rlhub.wsync._report import report
from rlhub.wsync._source import Source, WeightVersion

log = logging.getLogger("rlhub.wsync")

Dialer = Tuple[str, Callable[[], "Source"]]
"""A named way to open a source, e.g. ``("relay-shm", lambda: ShmSource(path))``."""


class FailoverSource:
    """A :class:`Source` over dialers in order of preference: a relay's
    shared memory, the relay's stream, the upstream hub.

    It uses the first dialer whose source works. When that source fails
    (:class:`rlhub.RlhubError` from it: the relay's stream ended, its writer
    is gone) it lets go of it and dials again, most preferred first, so a
    collector of a dead relay continues from the upstream at the version it
    runs. Like the Go ``Failover`` it also goes **back**: while it is on a
    less preferred source it probes the more preferred ones at most every
    ``probe_every`` seconds (from inside ``get_if_newer``/``wait_newer``,
    so a collector probes at the calls it makes, e.g. its rollout starts)
    and switches to the first that serves, within ``probe_timeout``, a
    version at least as new as the one the collector runs at an epoch no
    older than one handed out: a relay that has been restarted, waited
    for while it catches up, not a stale one.

    A failed source is closed only after a newer version has been taken
    from its successor (its last blob may be a leased view the caller still
    uses). ``current`` names the source in use, ``switches`` counts changes.
    :meth:`running` reports the version the collector runs: on the current
    source's stream if it has one, else with the ``Report`` RPC to ``hub``.
    Use from one thread, as a :class:`Receiver` does.

    A permanent refusal (:func:`rlhub.errors.is_permanent`: a bad request,
    a missing or wrong token) fails over like any failure, since another
    source may accept the collector. Once every dialer has refused for
    good (at its dial or from its source), with no version handed out and
    no other kind of failure in between, ``get_if_newer`` and
    ``wait_newer`` raise the refusal (the most preferred dialer's, naming
    them all) instead of retrying, so a collector with a wrong token or
    model name stops with the reason rather than waiting for ever. A
    source that is only unreachable keeps it trying.
    On a cluster (dialers whose sources are given the cluster target, e.g.
    ``PushSource("etcd://E/NAME", …)`` or a :class:`DataPlaneSource` on
    it) a source that fails when the primary dies is dialed again and
    lands on the new primary. Versions handed out only grow; one whose
    epoch is older than one handed out before (a deposed primary's, a
    stale relay's) is never handed out: its source is dropped as failed.
    ``skipped`` counts the version numbers between two versions handed out
    (so a version the new primary never had shows).

    It follows the model's lives (``follows_lives``; docs/weight-sync.md,
    "Lives"): given ``life``, it passes it to a source in use that follows
    lives (a push stream, a store source; a segment carries no life), and
    a version of another life handed out starts the versions afresh.
    """

    follows_lives = True

    def __init__(self, dialers: List[Dialer], *, model: str, collector_id: Optional[str] = None,
                 hub: Any = None, probe_every: float = 1.0, probe_timeout: float = 0.5,
                 backoff: float = 0.1):
        if not dialers:
            raise ValueError("FailoverSource needs at least one dialer")
        self.dialers = list(dialers)
        self.model = model
        self.collector_id = collector_id or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.probe_every, self.probe_timeout, self.backoff = probe_every, probe_timeout, backoff
        self._hub = _channel(hub) if isinstance(hub, str) else hub
        self._own_hub = isinstance(hub, str)
        self._cur: Optional[Source] = None
        self._idx = -1
        self._retired: List[Source] = []
        self._pending: Optional[WeightVersion] = None  # a probe's first version, served next
        self._next_probe = 0.0
        self._have = 0  # newest version handed out
        self._life = 0  # the life of the version handed out last (0: unknown)
        self._served = False  # the source in use has returned a version
        self._unserved: List[int] = []  # dialers whose sources failed before serving: tried last
        # Permanent refusals by dialer since a version was handed out or a
        # dialer failed otherwise.
        self._refused: Dict[int, BaseException] = {}
        self.current: Optional[str] = None
        self.switches = 0
        self.skipped = 0
        self._epoch = 0  # the newest epoch handed out
        self._closed = False

    @property
    def via(self) -> str:
        return getattr(self._cur, "via", "failover")

    def _dial(self, idx: int, note: bool = True) -> Optional[Source]:
        name, dial = self.dialers[idx]
        try:
            return dial()
        except (errors.RlhubError, OSError, grpc.RpcError) as e:
            log.info("rlhub: %s: cannot use %s (%s)", self.model, name, e)
            if note:
                self._note_failure(idx, e)
            return None

    def _note_failure(self, idx: int, err: BaseException) -> None:
        if errors.is_permanent(err):
            self._refused[idx] = err
        else:
            self._refused.clear()

    def _raise_if_all_refused(self) -> None:
        if len(self._refused) < len(self.dialers):
            return
        first = self._refused[0]
        why = "; ".join(f"{self.dialers[i][0]}: {self._refused[i]}" for i in range(len(self.dialers)))
        msg = f"every source of model {self.model!r} refused for good: {why}"
        named = errors.from_rpc_error(first) if isinstance(first, grpc.RpcError) else first
        if isinstance(named, errors.RlhubError):
            raise type(named)(msg, named.code) from first
        raise errors.Unavailable(msg) from first  # not reached: only these are permanent

    def _let_go(self) -> None:
        """Detaches the source in use as the Go Failover's letGoLocked: one
        that served a version is retired (the caller may still hold its
        last blob) and the one retired before it closed; one that served
        nothing is closed at once."""
        cur = self._cur
        if cur is None:
            return
        if self._served:
            for old in self._retired:
                old.close()
            self._retired = [cur]
        else:
            cur.close()

    def _use(self, idx: int, src: Source) -> None:
        self._let_go()
        self._cur, self._idx, self.current = src, idx, self.dialers[idx][0]
        self._served = False
        self.switches += 1
        self._next_probe = time.monotonic() + self.probe_every
        log.info("rlhub: %s now from %s", self.model, self.current)

    def _drop_current(self, why: Exception) -> None:
        log.warning("rlhub: %s: %s failed (%s); failing over", self.model, self.current, why)
        if self._idx >= 0:
            self._note_failure(self._idx, why)
        self._let_go()
        # A source that failed before serving anything (a dead relay's
        # leftover segment) must not keep the collector from the others.
        # Moved to the end each time it fails, so two such sources take
        # turns instead of the first starving the second.
        if self._served:
            self._unserved.clear()
        else:
            if self._idx in self._unserved:
                self._unserved.remove(self._idx)
            self._unserved.append(self._idx)
        self._cur, self._idx, self.current = None, -1, None

    def _ensure(self) -> bool:
        if self._closed:
            raise errors.Unavailable("failover source is closed")
        if self._cur is not None:
            return True
        order = [i for i in range(len(self.dialers)) if i not in self._unserved] + self._unserved
        for i in order:
            src = self._dial(i)
            if src is not None:
                self._use(i, src)
                return True
        return False

    def _probe(self, than: int) -> None:
        """Goes back to the first more preferred source that serves, within
        ``probe_timeout``, a version at least as new as ``than`` at an epoch
        no older than one handed out (the Go ``Failover``'s probe). A
        source still catching up (a restarted relay whose first version is
        older than the collector's) is waited for, not passed over at its
        first version; a stale one (an older epoch) is passed over, not
        handed to the caller as an error."""
        if self._idx <= 0 or time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + self.probe_every
        after = max(than - 1, 0)  # a version newer than this is at least than
        for i in range(self._idx):
            src = self._dial(i, note=False)
            if src is None:
                continue
            try:
                alive = getattr(src, "writer_alive", None)
                wv = src.wait_newer(after, self.probe_timeout) if alive is None or alive() else None
            except errors.RlhubError:
                wv = None
            if wv is None or wv.version < than or wv.epoch < self._epoch:
                src.close()
                continue
            self._use(i, src)
            self._pending = wv
            return

    def _took(self, wv: Optional[WeightVersion]) -> Optional[WeightVersion]:
        if wv is not None and wv.epoch < self._epoch:
            raise errors.Unavailable(f"{self.current}: version {wv.version} of {self.model!r} has epoch {wv.epoch}, "
                                     f"older than epoch {self._epoch} already handed out")
        if wv is not None and _new_life(wv.life, self._life):
            self._have = 0  # the model deleted and pushed again: its versions start afresh
        if wv is not None:
            self._epoch = wv.epoch
            self._life = wv.life
            if self._have and wv.version > self._have + 1:
                self.skipped += wv.version - self._have - 1
            self._served = True
            self._unserved.clear()
            self._refused.clear()
        if wv is not None and wv.version > self._have:
            self._have = wv.version
            for old in self._retired:  # a newer version is out: the old blobs are not needed
                old.close()
            self._retired.clear()
        return wv

    def get_if_newer(self, than: int, life: int = 0) -> Optional[WeightVersion]:
        """The newest version if newer than ``than`` (or of another life
        than ``life``) from the source in use (failing over, or going back,
        first when needed); None when nothing newer. Raises
        :class:`rlhub.Unavailable` when no dialer works."""
        for _ in range(2 * len(self.dialers) + 1):
            if not self._ensure():
                self._raise_if_all_refused()
                raise errors.Unavailable(f"no source of model {self.model!r} works")
            self._probe(than)
            if self._pending is not None:
                wv, self._pending = self._pending, None
                if wv.version > than or _new_life(wv.life, life):
                    return self._took(wv)
            try:
                src = self._in_use()
                if life and getattr(src, "follows_lives", False):
                    return self._took(src.get_if_newer(than, life=life))  # type: ignore[call-arg]
                return self._took(src.get_if_newer(than))
            except errors.RlhubError as e:
                self._drop_current(e)
                self._raise_if_all_refused()
        raise errors.Unavailable(f"every source of model {self.model!r} failed")

    def _in_use(self) -> Source:
        """The source in use (there is one after ``_ensure``)."""
        cur = self._cur
        if cur is None:
            raise errors.Unavailable(f"no source of model {self.model!r} is in use")
        return cur

    def wait_newer(self, after: int, timeout: Optional[float] = None, life: int = 0) -> Optional[WeightVersion]:
        """Waits for a version newer than ``after`` (or of another life than
        ``life``), failing over as needed; None when ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                wv = self.get_if_newer(after, life)
                if wv is not None:
                    return wv
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # Wait on the source in use, but wake up to probe preferred ones.
                step = left if left is not None else self.probe_every
                if self._idx > 0:
                    step = min(step, max(self._next_probe - time.monotonic(), 0.01))
                src = self._in_use()
                if life and getattr(src, "follows_lives", False):
                    return_wv = src.wait_newer(after, step, life=life)  # type: ignore[call-arg]
                else:
                    return_wv = src.wait_newer(after, step)
                if return_wv is not None:
                    return self._took(return_wv)
            except errors.RlhubError as e:
                if self._cur is not None:
                    served = self._served
                    self._drop_current(e)
                    self._raise_if_all_refused()
                    if served:
                        continue  # the next source at once
                    # One that never served (a dead relay's leftover
                    # segment) is not dialled again at once: the back-off
                    # below, as the Go Failover's.
                if errors.is_permanent(e) and len(self._refused) == len(self.dialers):
                    raise  # every source refused for good (get_if_newer)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                time.sleep(self.backoff if left is None else min(self.backoff, left))

    def release(self) -> None:
        """Releases what the source in use holds of the version it returned
        last (a leasing :class:`ShmSource`'s slot); a :class:`Receiver` calls
        it once the version is in the module."""
        fn = getattr(self._cur, "release", None)
        if fn is not None:
            fn()

    def running(self, version: int) -> None:
        """Reports the version the collector runs (see the class doc)."""
        fn = getattr(self._cur, "running", None)
        if fn is not None:
            fn(version)
        elif self._hub is not None:
            report(self._hub, self.collector_id, self.model, version, self.via)

    def close(self) -> None:
        """Closes every source it opened, its dialers that hold something
        (a relay lookup's etcd watch) and its hub channel. Safe twice."""
        self._closed = True
        for _, dial in self.dialers:
            close = getattr(dial, "close", None)
            if close is not None:
                close()
        for s in self._retired + ([self._cur] if self._cur is not None else []):
            s.close()
        self._retired.clear()
        self._cur = None
        if self._own_hub and self._hub is not None:
            self._hub.close()
            self._own_hub = False

    def __enter__(self) -> "FailoverSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
