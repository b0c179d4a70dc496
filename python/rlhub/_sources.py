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
the upstream hub's stream: the Go ``wsync.Failover`` order.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

from rlhub._channel import parse_target
from rlhub.wsync import DataPlaneSource, Dialer, FailoverSource, PushSource, ShmSource, Source, StoreSource

__all__ = ["SourceSpec", "VIAS", "OWN_REPORTS", "check_specs", "failover_specs", "open_source"]

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


def _clustered(where: Optional[str]) -> bool:
    if not where:
        return False
    try:
        return parse_target(where).clustered
    except ValueError:
        return False  # PushSource reports the bad address


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
                failover: Optional[Sequence[SourceSpec]] = None, probe_every: float = 1.0) -> Source:
    """Opens the source ``via`` names (see the module doc). For
    ``"failover"``: ``failover`` when given, else :func:`failover_specs`
    of ``hub``, ``relay`` and ``shm_path``; the failover source reports the
    version run to ``hub`` while it reads a segment. ``"push"`` on a
    cluster (a hub list or ``etcd://``) is a push stream under a
    :class:`FailoverSource`, so it is attached again to the new primary
    when the one it is on dies. A segment is read by a
    leasing :class:`ShmSource` (each version copied straight from its slot
    into the module, then released) unless ``lease=False`` asks for the
    copying reader."""
    if via == "failover":
        specs = check_specs(failover if failover is not None else
                             failover_specs(hub, relay=relay, relay_shm=shm_path))
        dialers: List[Dialer] = [(s.name, _Dial(s, model, collector_id, lease)) for s in specs]
        return FailoverSource(dialers, model=model, collector_id=collector_id, hub=hub,
                              probe_every=probe_every)
    if via not in _SINGLE:
        raise ValueError(f"via must be one of {', '.join(VIAS)}")
    if via == "push" and _clustered(hub):
        # One push stream ends when the primary it is on dies; under a
        # FailoverSource it is attached again on its FollowingChannel, which
        # by then follows the new primary (docs/weight-sync.md, "Collectors
        # on a cluster"). A failover list's push specs are dialed by the
        # outer FailoverSource already.
        return FailoverSource([("push", _PushDial(hub, model, collector_id))], model=model,
                              collector_id=collector_id)
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
