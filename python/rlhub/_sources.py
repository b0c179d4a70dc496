"""Weight sources named by picklable values, for code that opens its source
in another process (torchrl collector workers, Ray actors).

A source is chosen by ``via``: ``"store"`` (pull/watch the hub's store),
``"push"`` (the hub's or a relay's push stream), ``"dataplane"`` (the hub's
push fan-out on its plain-TCP data plane, :class:`rlhub.wsync.DataPlaneSource`:
each version received into buffers it reuses, and the gRPC push stream as
its fallback against a hub without it), ``"shm"`` (a relay's shared-memory
segment on this host) or ``"failover"``: a
:class:`rlhub.wsync.FailoverSource` over a list of :class:`SourceSpec`,
most preferred first, that falls over to the next when its source dies
(a relay SIGKILLed) and goes back when a more preferred one serves again.
The default failover list is the relay's segment, the relay's stream, then
the upstream hub's stream: the Go ``wsync.Failover`` order. Given only a
cluster (``hub="etcd://E/NAME"``, no relay, segment or list), the relay is
the one announced in etcd on the host where the source is opened, looked up
again at every dial (a worker on another host finds its own relay; a relay
started or restarted later, on another port or segment, is found by the
next probe), with the cluster's primary last.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, List, NamedTuple, Optional, Sequence

from rlhub import errors
from rlhub._channel import parse_target
from rlhub.wsync import DataPlaneSource, Dialer, FailoverSource, PushSource, ShmSource, Source, StoreSource

__all__ = ["SourceSpec", "VIAS", "OWN_REPORTS", "check_specs", "discovers_relay", "failover_specs", "open_source",
           "relay_dialers"]

VIAS = ("store", "push", "dataplane", "shm", "failover")
"""The values ``via`` takes."""

_SINGLE = ("store", "push", "dataplane", "shm")

OWN_REPORTS = ("push", "dataplane", "failover")
"""The vias whose source reports the version run itself (on its stream, in
its polls); a Receiver over the others reports to the hub."""


class SourceSpec(NamedTuple):
    """One dialer of a failover source, as plain data (it pickles).

    ``name`` shows as ``FailoverSource.current`` (``"relay-shm"``,
    ``"upstream"`` …); ``via`` is ``store``, ``push`` or ``shm``; ``where``
    is the address for store/push, the segment path for shm (None: the
    default ``/dev/shm/rlhub-<model>``)."""

    name: str
    via: str
    where: Optional[str] = None


def failover_specs(hub: str, *, relay: Optional[str] = None,
                   relay_shm: Optional[str] = None) -> List[SourceSpec]:
    """The usual order: the relay's segment (when ``relay_shm``), the
    relay's push stream (when ``relay``), then the upstream hub's push
    stream. At least one of ``relay`` and ``relay_shm`` is needed: without a
    relay there is nothing to fail over from."""
    if not relay and not relay_shm:
        raise ValueError("via='failover' needs a relay address or a relay's segment (or a failover list)")
    specs: List[SourceSpec] = []
    if relay_shm:
        specs.append(SourceSpec("relay-shm", "shm", relay_shm))
    if relay:
        specs.append(SourceSpec("relay", "push", relay))
    specs.append(SourceSpec("upstream", "push", hub))
    return specs


def check_specs(specs: Sequence[SourceSpec]) -> List[SourceSpec]:
    """The specs as SourceSpec values; ValueError for an empty list, an
    unknown via or a store/push spec without an address."""
    out = [SourceSpec(*s) for s in specs]
    if not out:
        raise ValueError("the failover list is empty")
    for s in out:
        if s.via not in _SINGLE:
            raise ValueError(f"failover source {s.name[:64]!r}: via must be one of {', '.join(_SINGLE)}")
        if s.via != "shm" and not s.where:
            raise ValueError(f"failover source {s.name[:64]!r}: {s.via} needs an address")
    return out


def _etcd(where: Optional[str]) -> bool:
    if not where:
        return False
    try:
        return bool(parse_target(where).etcd)
    except ValueError:
        return False


def discovers_relay(hub: Optional[str], *, relay: Optional[str] = None, shm_path: Optional[str] = None,
                    failover: Optional[Sequence[SourceSpec]] = None) -> bool:
    """Whether a ``"failover"`` source of ``hub`` finds its relay in etcd
    where it is opened: ``hub`` is ``etcd://…`` and no relay, segment or
    failover list is given."""
    return failover is None and not relay and not shm_path and _etcd(hub)


def _open_one(via: str, where: Optional[str], model: str, collector_id: str, lease: bool) -> Source:
    if via == "store":
        return StoreSource(where, model)
    if via == "push":
        return PushSource(where, model, collector_id=collector_id)
    if via == "dataplane":
        if not where:  # check_specs refuses this; open_source callers may not have run it
            raise ValueError("a dataplane source needs the hub's address")
        return DataPlaneSource(where, model, collector_id=collector_id)
    return ShmSource(where, model=model, lease=lease)


def open_source(via: str, hub: str, model: str, *, collector_id: str, shm_path: Optional[str] = None,
                lease: bool = True, relay: Optional[str] = None,
                failover: Optional[Sequence[SourceSpec]] = None, probe_every: float = 1.0,
                report_hub: Optional[str] = None) -> Source:
    """Opens the source ``via`` names (see the module doc). For
    ``"failover"``: ``failover`` when given, else :func:`failover_specs`
    of ``hub``, ``relay`` and ``shm_path``, or with ``hub`` a cluster as
    ``etcd://…`` and neither given, :func:`relay_dialers` (the relay
    announced on this host, looked up at each dial, then the primary); the failover source reports the
    version run to ``report_hub`` (default ``hub``) while it reads a segment. ``"push"`` is a
    push stream under a :class:`FailoverSource`, so it is attached again
    when the hub it is on dies: to the hub restarted on its address, or on
    a cluster (a hub list or ``etcd://``) to the new primary; on ``etcd://`` the push stream of the relay
    announced on this host is preferred (looked up at each dial). A segment is read by a
    leasing :class:`ShmSource` (each version copied straight from its slot
    into the module, then released) unless ``lease=False`` asks for the
    copying reader."""
    if via == "failover":
        if discovers_relay(hub, relay=relay, shm_path=shm_path, failover=failover):
            return FailoverSource(relay_dialers(hub, model, collector_id, lease),
                                  model=model, collector_id=collector_id, hub=report_hub or hub,
                                  probe_every=probe_every)
        specs = check_specs(failover if failover is not None else
                             failover_specs(hub, relay=relay, relay_shm=shm_path))
        dialers: List[Dialer] = [(s.name, _Dial(s, model, collector_id, lease)) for s in specs]
        return FailoverSource(dialers, model=model, collector_id=collector_id, hub=report_hub or hub,
                              probe_every=probe_every)
    if via not in _SINGLE:
        raise ValueError(f"via must be one of {', '.join(VIAS)}")
    if via == "push":
        # One push stream ends when the hub it is on dies; under a
        # FailoverSource it is attached again: to the hub restarted on its
        # address (a durable hub keeps its versions) or, on a cluster, on
        # its FollowingChannel, which by then follows the new primary
        # (docs/weight-sync.md, "Collectors on a cluster"). A failover
        # list's push specs are dialed by the outer FailoverSource already.
        # On etcd://, the stream of the relay announced on this host comes
        # first (the Go ViaPush order).
        streams: List[Dialer] = [("push", _PushDial(hub, model, collector_id))]
        if _etcd(hub):
            streams = relay_dialers(hub, model, collector_id, lease, segment=False)
        return FailoverSource(streams, model=model, collector_id=collector_id, probe_every=probe_every)
    return _open_one(via, hub if via != "shm" else shm_path, model, collector_id, lease)


class _PushDial:
    """A FailoverSource dialer of one push stream."""

    def __init__(self, where: Optional[str], model: str, collector_id: str):
        self.where, self.model, self.collector_id = where, model, collector_id

    def __call__(self) -> Source:
        return PushSource(self.where, self.model, collector_id=self.collector_id)


class _Dial:
    """A FailoverSource dialer for one spec."""

    def __init__(self, spec: SourceSpec, model: str, collector_id: str, lease: bool):
        self.spec, self.model, self.collector_id, self.lease = spec, model, collector_id, lease

    def __call__(self) -> Source:
        return _open_one(self.spec.via, self.spec.where, self.model, self.collector_id, self.lease)


class _RelayLookup:
    """The relay announced in etcd for a model on this host, known from one
    etcd watch (:class:`rlhub.discover.ServiceWatch`) that the segment's and
    the stream's dialers of one failover source share, so that a probe every
    second costs etcd nothing. The watch starts at the first lookup, in the
    process that dials (so it is that host's relay); until its first list
    arrives a lookup waits at most ``timeout``. :meth:`close` (the failover
    source's) stops it."""

    def __init__(self, cluster: str, model: str, timeout: float = 1.0):
        self.cluster, self.model, self.timeout = cluster, model, timeout
        self._mu = threading.Lock()
        self._listed = threading.Event()
        self._got: Any = None
        self._watch: Any = None
        self._closed = False

    def _take(self, ss: List[Any]) -> None:
        from rlhub import discover
        got = discover.pick_relay(ss, self.model)
        with self._mu:
            self._got = got
        self._listed.set()

    def get(self) -> Any:
        from rlhub import discover
        with self._mu:
            if self._closed:
                raise errors.Unavailable(f"the relay lookup of {self.model!r} is closed")
            if self._watch is None:
                self._watch = discover.ServiceWatch(self.cluster, discover.KIND_RELAY, self._take)
            watch = self._watch
        if not self._listed.wait(self.timeout):
            raise errors.Unavailable(f"finding the relay of {self.model!r} in etcd: no answer within "
                                     f"{self.timeout:g} s ({str(watch.error)[:200] if watch.error else 'no error yet'})")
        with self._mu:
            got = self._got
        if got is None:
            raise errors.Unavailable(
                f"no relay of {self.model!r} is announced on host {socket.gethostname()[:64]!r}")
        return got

    def close(self) -> None:
        with self._mu:
            self._closed, watch, self._watch = True, self._watch, None
        if watch is not None:
            watch.close()


class _RelayDial:
    """A FailoverSource dialer of the relay :class:`_RelayLookup` finds:
    its segment (``shm``) or its push stream."""

    def __init__(self, lookup: _RelayLookup, shm: bool, collector_id: str, lease: bool):
        self.lookup, self.shm, self.collector_id, self.lease = lookup, shm, collector_id, lease

    def __call__(self) -> Source:
        r = self.lookup.get()
        if not self.shm:
            return PushSource(r.addr, self.lookup.model, collector_id=self.collector_id)
        if not r.shm:
            raise errors.Unavailable(f"the relay {r.id[:64]!r} of {self.lookup.model!r} announces no segment")
        return ShmSource(r.shm, model=self.lookup.model, lease=self.lease)

    def close(self) -> None:
        """Stops the lookup's watch (shared: safe from each dialer)."""
        self.lookup.close()


def relay_dialers(cluster: str, model: str, collector_id: str, lease: bool = True,
                  *, segment: bool = True) -> List[Dialer]:
    """The dialers of a collector of ``model`` given only ``cluster``
    (``etcd://E/NAME``): the segment of the relay announced in etcd on this
    host (unless ``segment`` is False: ``via="push"``), that relay's push
    stream, then the cluster's primary (followed). The relay is looked up
    when dialed, in the process that dials, so it is the relay of the host
    the collector runs on, and one that appears, moves or comes back later
    is found by the next dial or probe (from one etcd watch, started at
    the first dial and stopped with the failover source)."""
    lookup = _RelayLookup(cluster, model)
    dialers: List[Dialer] = [("relay-shm", _RelayDial(lookup, True, collector_id, lease))] if segment else []
    dialers.append(("relay", _RelayDial(lookup, False, collector_id, lease)))
    dialers.append(("upstream" if segment else "push", _PushDial(cluster, model, collector_id)))
    return dialers
