"""rlhub weight sync inside TorchRL collectors (torchrl 0.14).

Two ways in, both over :mod:`rlhub.wsync` (store pull, push stream, the
push fan-out on the hub's data plane, or a relay's shared memory):

**The scheme** (torchrl's current API). :class:`RlhubWeightSyncScheme` is a
``torchrl.weight_update.WeightSyncScheme``. Its *sender* side, on the
trainer, pushes each new version to the hub's model store; its *receivers*,
in a ``Collector`` or in each worker of a ``MultiSyncCollector`` /
``MultiAsyncCollector``, take the newest version from rlhub at the start of
every rollout (the collector's ``pre_collect_hook``, in the collector's own
thread) and so never change weights in the middle of a batch::

    from torchrl.collectors import Collector, MultiSyncCollector
    from rlhub.torchrl import RlhubWeightSyncScheme

    scheme = RlhubWeightSyncScheme("127.0.0.1:7470", "policy", via="push",
                                   strip_prefix="module.")   # collector names -> hub names
    # one process:
    col = Collector(env, policy, frames_per_batch=64, total_frames=-1,
                    track_policy_version=True, weight_recv_schemes={"policy": scheme})
    # or workers (the scheme is copied to each; the parent is the sender):
    col = MultiSyncCollector([make_env] * 2, policy, frames_per_batch=64, total_frames=-1,
                             track_policy_version=True, weight_sync_schemes={"policy": scheme})
    for batch in col:
        batch["next", "policy_version"]    # the rlhub version that chose each action
        ...
        col.update_policy_weights_(trained_policy)   # MultiSync: push a new version (optional)

**Failover.** ``via="failover"`` with ``relay=`` (the relay's address)
and/or ``shm_path=`` (its segment) gives each receiver a
:class:`rlhub.wsync.FailoverSource`: relay segment, relay stream, then the
upstream ``hub``. A receiver whose relay dies takes the next rollout's
version from the upstream and goes back to the relay once it serves again
(checked at most every ``probe_every`` seconds, at rollout starts). Given
only ``cluster="etcd://E/NAME"``, each worker looks its own host's relay up
in etcd at every dial and probe.

**The version stamp.** With ``track_policy_version=True`` the collector's
``PolicyVersion`` transform writes ``("next", "policy_version")`` into every
frame; the receiver sets it to the *rlhub* version the policy runs (not
torchrl's own 0, 1, 2 …), so samples join ``rlhub sync status`` and the
lag table. (The root ``policy_version`` of a batch's first frame is carried
over from the previous step by torchrl; read the ``next`` one.)

**The legacy updater.** :class:`RlhubWeightUpdater` is a real
``WeightUpdaterBase`` subclass for code written against the older API
(``weight_updater=``; torchrl 0.14 warns that this API is deprecated). The
collector calls it from ``update_policy_weights_()``; it applies the newest
rlhub version if newer. It stamps batches through
:meth:`RlhubWeightUpdater.version_transform`, an env transform that writes
``("next", "policy_version")`` from a shared-memory counter the updater
sets, so it works in ``MultiSyncCollector`` workers too.

**Names.** A trainer usually pushes its inner network's ``state_dict()``
(``0.weight``), while a collector's policy is a ``TensorDictModule`` around
it (``module.0.weight``). ``strip_prefix`` removes a prefix from the
collector's names to get the hub's, ``add_prefix`` then prepends one, and
``name_map`` (a callable: collector name -> hub name, or None to leave a
tensor out) does anything else. The same mapping is applied when the scheme
sends.

Importing this module imports torchrl and tensordict; ``rlhub`` itself does
not need them. Import order does not matter: everything here is a real
subclass of torchrl's classes.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import warnings
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from tensordict import TensorDictBase  # type: ignore[import-untyped]
from torchrl.collectors import WeightUpdaterBase  # type: ignore[import-untyped]
from torchrl.envs.transforms import Transform  # type: ignore[import-untyped]
from torchrl.weight_update import WeightSyncScheme  # type: ignore[import-untyped]

from rlhub import errors
from rlhub._sources import OWN_REPORTS, VIAS, SourceSpec, check_specs, discovers_relay, failover_specs, open_source
from rlhub.store import StoreClient
from rlhub.tensors import save_bytes
from rlhub.wsync import Receiver, Source, WeightVersion, copy_into

log = logging.getLogger("rlhub.torchrl")

__all__ = ["RlhubWeightSyncScheme", "RlhubWeightUpdater", "RlhubVersionTransform", "NameMap",
           "PrefixMap", "make_name_map", "make_source", "VIAS", "SourceSpec", "failover_specs"]

NameMap = Callable[[str], Optional[str]]
"""Maps a collector-side tensor name to the hub's name (None: not synced)."""

class PrefixMap:
    """Collector name -> hub name: drop ``strip`` (names without it are
    left out), then prepend ``add``. Picklable, as schemes cross into
    collector workers."""

    def __init__(self, strip: str = "", add: str = ""):
        self.strip, self.add = strip, add

    def __call__(self, name: str) -> Optional[str]:
        if self.strip:
            if not name.startswith(self.strip):
                return None
            name = name[len(self.strip):]
        return self.add + name


def make_name_map(strip_prefix: str = "", add_prefix: str = "",
                  name_map: Optional[NameMap] = None) -> NameMap:
    """The collector-name -> hub-name function: ``name_map`` when given
    (it must pickle for multi-process collectors), else a
    :class:`PrefixMap`."""
    if name_map is not None:
        if strip_prefix or add_prefix:
            raise ValueError("give name_map or strip_prefix/add_prefix, not both")
        return name_map
    return PrefixMap(strip_prefix, add_prefix)


def make_source(via: str, hub: str, model: str, *, collector_id: str,
                shm_path: Optional[str] = None, lease: bool = True, relay: Optional[str] = None,
                failover: Optional[Sequence[SourceSpec]] = None, probe_every: float = 1.0,
                report_hub: Optional[str] = None) -> Source:
    """An rlhub source: ``store`` (pull/watch), ``push`` (the hub's or a
    relay's push stream at ``hub``), ``shm`` (a relay's segment on this
    host; default path ``/dev/shm/rlhub-<model>``) or ``failover``: the
    relay's segment (``shm_path``) and stream (``relay``), then the
    upstream ``hub``, or the ``failover`` list, or with ``hub`` an
    ``etcd://`` cluster and none of those the relay announced on this host
    (looked up at each dial), as a :class:`rlhub.wsync.FailoverSource`
    that reports to ``report_hub`` (default ``hub``) from a segment."""
    return open_source(via, hub, model, collector_id=collector_id, shm_path=shm_path, lease=lease,
                       relay=relay, failover=failover, probe_every=probe_every, report_hub=report_hub)


class _MappedTarget:
    """What a :class:`Receiver` copies into: the module's tensors under
    their hub names, looked up at every apply (the module may be replaced,
    as torchrl's workers do with a policy moved to its device)."""

    def __init__(self, module: Callable[[], Any], names: NameMap, device: Callable[[], Any]):
        self._module = module
        self._names = names
        self._device = device

    def state_dict(self, keep_vars: bool = True) -> Dict[str, torch.Tensor]:
        m = self._module()
        if m is None:
            raise errors.InvalidArgument("rlhub.torchrl: the collector has no policy to apply weights to")
        sd = m.state_dict(keep_vars=True)
        if any(t.is_meta for t in sd.values()):
            # torchrl sends workers a stateless (meta) policy and expects
            # the scheme to give it weights: allocate them, then copy.
            m.to_empty(device=self._device() or "cpu")
            sd = m.state_dict(keep_vars=True)
        return _map_names(sd, self._names)


def _map_names(sd: Mapping[str, Any], names: NameMap) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for local, t in sd.items():
        hub = names(local)
        if hub is None:
            continue
        if hub in out:
            raise ValueError(f"rlhub.torchrl: two tensors map to the hub name {hub!r}")
        out[hub] = t
    return out


def _local_weights(w: Any) -> Dict[str, torch.Tensor]:
    """A flat name -> tensor dict from a module, a TensorDict or a dict."""
    if isinstance(w, TensorDictBase):
        w = w.flatten_keys(".").to_dict()
    elif isinstance(w, torch.nn.Module):
        w = w.state_dict()
    if not isinstance(w, Mapping):
        raise TypeError(f"rlhub.torchrl: cannot take weights from a {type(w).__name__}")
    return {k: (v.data if isinstance(v, torch.nn.Parameter) else v) for k, v in w.items()}


def _set_tracker(collector: Any, version: int) -> bool:
    tracker = getattr(collector, "policy_version_tracker", None)
    if tracker is None or not hasattr(tracker, "version"):
        return False
    tracker.version = int(version)
    return True


class _NoTransport:
    """rlhub carries the weights; torchrl's transport slot stays empty."""

    def send_weights(self, weights: Any) -> None:  # pragma: no cover - never called
        raise RuntimeError("rlhub.torchrl: weights travel through rlhub, not a torchrl transport")

    def receive_weights(self, *args: Any, **kwargs: Any) -> None:
        return None

    def setup_connection_and_weights_on_sender(self) -> None:
        return None

    def setup_connection_and_weights_on_receiver(self, **kwargs: Any) -> None:
        return None


class RlhubWeightSyncScheme(WeightSyncScheme):  # type: ignore[misc]  # torchrl ships no types
    """One model's weights through rlhub, as a torchrl ``WeightSyncScheme``.

    Args:
        hub: the hub's address (the store for the sender and ``via="store"``;
            the push stream for ``via="push"``, a relay's address works
            too). Reports of the version each receiver runs go here.
        model: the model's name in rlhub.
        via: how receivers get versions: ``"store"``, ``"push"``,
            ``"dataplane"`` (the hub's push fan-out on its data plane, the
            push stream as fallback: :class:`rlhub.wsync.DataPlaneSource`;
            the hub learns the version a receiver runs from its next poll,
            i.e. at the next rollout start),
            ``"shm"`` (a relay's segment on the receiver's host) or
            ``"failover"`` (a relay's segment and/or stream, falling over to
            the upstream ``hub`` when the relay dies and going back when it
            serves again: :class:`rlhub.wsync.FailoverSource`).
        shm_path: the segment for ``via="shm"`` or ``"failover"`` (default
            for shm ``/dev/shm/rlhub-<model>``).
        lease: a segment is read by leasing its slots (the default: each
            version copied straight from the slot into the module, CRC in
            the same pass, then released; a relay's automatic segment
            holds up to 8 lease entries, and a receiver without a free
            entry copies, saying why); ``False`` asks for the copying
            reader (two copies per receiver, memcpy-bound).
        relay: the relay's address for ``via="failover"``.
        failover: for ``via="failover"``, the sources in order of
            preference (:class:`SourceSpec`, plain data that pickles into
            workers) instead of relay segment, relay stream, ``hub``.
        probe_every: how often, in seconds, a failover receiver on a less
            preferred source tries the more preferred ones again.
        collector_id: the id receivers report under; worker ``i`` reports
            as ``<collector_id>-<i>``. Default ``torchrl-<pid>-<random>``.
        strip_prefix, add_prefix, name_map: see the module doc.
        strict: every hub tensor must have a collector tensor and the
            reverse (after mapping); off, names on one side only are left.
        initial_timeout: how long a receiver waits, when it connects, for
            the model's first version (its policy has no weights before).
        report_hub: where the receivers report, when not ``hub`` (a push
            stream reports on the stream itself).
        cluster: a cluster as ``etcd://E/NAME``: ``hub`` defaults to it (the
            primary, followed), and ``via="failover"`` without ``relay``,
            ``shm_path`` or ``failover`` has each worker find the relay
            announced in etcd on the worker's own host (its segment, then
            its stream), falling back to the primary when there is none; the
            lookup is made again at every dial and probe, so a relay started
            after the workers, or restarted elsewhere, is found
            (:func:`rlhub._sources.relay_dialers`).

    The sender (``init_on_sender``: a ``MultiSyncCollector`` does it, or call
    ``scheme.init_on_sender(model=policy)`` yourself on a trainer) pushes
    with :meth:`send`: version = newest + 1, compare-and-set, so two
    trainers cannot overwrite each other (:class:`rlhub.StaleVersion`).
    Receivers apply the newest version at each rollout's start (and in
    :meth:`receive`), stamp it into the collector's ``PolicyVersion``
    tracker, and report it to the hub.
    """

    def __init__(self, hub: str, model: str, *, via: str = "store", shm_path: Optional[str] = None,
                 lease: bool = True, collector_id: Optional[str] = None, strip_prefix: str = "",
                 add_prefix: str = "", name_map: Optional[NameMap] = None, strict: bool = True,
                 initial_timeout: float = 60.0, report_hub: Optional[str] = None,
                 relay: Optional[str] = None, failover: Optional[Sequence[SourceSpec]] = None,
                 probe_every: float = 1.0, cluster: Optional[str] = None):
        super().__init__()  # torchrl's strategy is unused: rlhub copies the tensors
        if via not in VIAS:
            raise ValueError(f"via must be one of {', '.join(VIAS)}")
        if not model:
            raise ValueError("RlhubWeightSyncScheme needs a model name")
        hub = hub or cluster or ""
        self.hub, self.rlhub_model, self.via = hub, model, via
        self.shm_path, self.lease = shm_path, lease
        self.relay, self.probe_every = relay, probe_every
        self.failover: Optional[List[SourceSpec]] = None
        # Given only a cluster, each worker finds the relay of its own host
        # in etcd when it opens its source (and at every dial after), not
        # the parent once for all of them.
        self.discovers_relay = via == "failover" and discovers_relay(
            hub, relay=relay, shm_path=shm_path, failover=failover)
        if via == "failover" and not self.discovers_relay:  # checked here, in the parent, not in each worker
            self.failover = check_specs(failover) if failover is not None else \
                failover_specs(hub, relay=relay, relay_shm=shm_path)
        self.collector_id = collector_id or f"torchrl-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.names = make_name_map(strip_prefix, add_prefix, name_map)
        self.strict = strict
        self.initial_timeout = initial_timeout
        self.report_hub = report_hub or hub
        self._init_runtime()

    def _init_runtime(self) -> None:
        # Process-local state, never pickled (see __getstate__).
        self._receiver: Optional[Receiver] = None
        self._store: Optional[StoreClient] = None
        self._sent_version = 0
        self._send_lock = threading.Lock()
        self._hooked: Optional[weakref.ReferenceType[Any]] = None
        self._applied_to: Optional[weakref.ReferenceType[Any]] = None
        self.last_sent: Optional[int] = None

    def __getstate__(self) -> Dict[str, Any]:
        state: Dict[str, Any] = super().__getstate__()
        for k in ("_receiver", "_store", "_send_lock", "_hooked", "_applied_to"):
            state.pop(k, None)
        state["_sent_version"] = 0
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self._init_runtime()

    # torchrl may initialise and connect a worker's receiver before the
    # worker's collector exists, and set the collector as the context later:
    # hook its rollouts (and stamp the version) whenever it arrives.
    @property
    def context(self) -> Any:
        return WeightSyncScheme.context.fget(self)

    @context.setter
    def context(self, context: Any) -> None:
        WeightSyncScheme.context.fset(self, context)
        if context is not None and self.synchronized_on_receiver:
            self._hook(context)
            if self.version:
                _set_tracker(context, self.version)

    def create_transport(self, **kwargs: Any) -> Any:
        return _NoTransport()

    # ---------------------------------------------------------------- sender

    def _init_on_sender_impl(self, *args: Any, model_id: Optional[str] = None, context: Any = None,
                             model: Any = None, **kwargs: Any) -> None:
        self.model_id = model_id or "policy"
        if context is not None:
            self.context = context
        if model is not None:
            self.model = model

    def _setup_connection_and_weights_on_sender_impl(self, *, worker_idx: Optional[int] = None,
                                                     weights: Any = None) -> None:
        """Nothing to wire: receivers reach rlhub themselves. ``weights``
        given to ``connect`` are pushed as a version."""
        if weights is not None:
            self.send(weights)

    def _store_client(self) -> StoreClient:
        if self._store is None:
            self._store = StoreClient(self.hub)
        return self._store

    def send(self, weights: Any = None, worker_ids: Any = None) -> None:
        """Pushes ``weights`` (a module, TensorDict or state dict; default:
        the context's policy) as the next version; the version is in
        :attr:`last_sent`. Receivers pick it up at their next rollout:
        ``worker_ids`` cannot address single workers (every receiver follows
        the same model)."""
        if worker_ids is not None:
            raise ValueError("rlhub.torchrl: every receiver follows the model; worker_ids cannot select some")
        self.push(weights)

    def push(self, weights: Any = None) -> int:
        """:meth:`send`, returning the version pushed."""
        if not self.initialized_on_sender:
            raise RuntimeError("rlhub.torchrl: call init_on_sender (or give the scheme to a collector) first")
        if weights is None:
            weights = self.model
            if weights is None:
                raise ValueError("rlhub.torchrl: no weights given and no model to take them from")
        sd = _map_names(_local_weights(weights), self.names)
        blob = save_bytes({k: v.detach().cpu().contiguous() for k, v in sd.items()})
        with self._send_lock:
            store = self._store_client()
            if self._sent_version == 0:
                infos = [m for m in store.list() if m.name == self.rlhub_model]
                self._sent_version = infos[0].version if infos else 0
            v = self._sent_version + 1
            try:
                store.push(self.rlhub_model, blob, version=v, expect=self._sent_version)
            except errors.StaleVersion:
                self._sent_version = 0  # another writer moved on: re-read the newest next time
                raise
            self._sent_version = v
            self.last_sent = v
        return v

    # -------------------------------------------------------------- receiver

    def _init_on_receiver_impl(self, model_id: str, context: Any = None, **kwargs: Any) -> None:
        self.model_id = model_id
        self.context = context
        if kwargs.get("model") is not None:
            self.model = kwargs["model"]
        if kwargs.get("worker_idx") is not None:
            self.worker_idx = kwargs["worker_idx"]

    def _setup_connection_and_weights_on_receiver_impl(self, *, worker_idx: Optional[int] = None) -> None:
        """Opens the rlhub source, applies the first version (waiting up to
        ``initial_timeout`` for one) and hooks the collector's rollouts."""
        if worker_idx is not None:
            self._worker_idx = worker_idx
        self._open_receiver()
        if self.receive(timeout=self.initial_timeout) is None and self.version == 0:
            raise errors.Unavailable(
                f"rlhub.torchrl: no version of model {self.rlhub_model!r} within {self.initial_timeout} s")
        self._hook(self.context)

    def _open_receiver(self) -> Receiver:
        if self._receiver is None:
            cid = self.collector_id if self._worker_idx is None else f"{self.collector_id}-{self._worker_idx}"
            # (A failover source reports to report_hub from a segment; a
            # discovering one looks this worker's relay up in etcd itself.)
            src = make_source(self.via, self.hub, self.rlhub_model, collector_id=cid, shm_path=self.shm_path,
                              lease=self.lease, failover=self.failover, probe_every=self.probe_every,
                              report_hub=self.report_hub)
            target = _MappedTarget(self._current_model, self.names, self._device)
            # A push stream, a data-plane source or a failover source
            # reports on its own.
            own_reports = self.via in OWN_REPORTS
            self._receiver = Receiver(target, src, collector_id=cid, model=self.rlhub_model,
                                      hub=None if own_reports else self.report_hub, strict=self.strict)
        return self._receiver

    def _current_model(self) -> Any:
        try:
            return self.model
        except AttributeError:
            return None

    def _device(self) -> Any:
        ctx = self.context
        return getattr(ctx, "policy_device", None) if ctx is not None else None

    def _hook(self, collector: Any) -> None:
        """Chains :meth:`_before_rollout` in front of the collector's
        ``pre_collect_hook``, once."""
        if collector is None or not hasattr(collector, "pre_collect_hook"):
            return
        if self._hooked is not None and self._hooked() is collector:
            return
        previous = collector.pre_collect_hook
        me = weakref.ref(self)

        def before_rollout() -> None:
            s = me()
            if s is not None:
                s._before_rollout()
            if previous is not None:
                previous()

        collector.pre_collect_hook = before_rollout
        self._hooked = weakref.ref(collector)

    def _before_rollout(self) -> None:
        self.receive()

    @property
    def version(self) -> int:
        """The rlhub version the receiver's policy runs (0: none yet)."""
        return self._receiver.version if self._receiver is not None else 0

    def receive(self, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Applies the newest rlhub version if it is newer (waiting up to
        ``timeout`` for one when given), stamps it into the collector's
        ``PolicyVersion`` tracker and returns it; None when nothing newer."""
        if not self.initialized_on_receiver:
            raise RuntimeError("rlhub.torchrl: receive() needs init_on_receiver first")
        r = self._open_receiver()
        model = self._current_model()
        if model is not None and (self._applied_to is None or self._applied_to() is not model):
            # A new policy object (torchrl moved it to its device): give it
            # the current version from scratch.
            r.version = 0
        wv = r.get(timeout)  # newer, or of another life (Receiver.follow_lives)
        applied = r.apply(wv)
        if applied and model is not None:
            self._applied_to = weakref.ref(model)
        if r.version:
            _set_tracker(self.context, r.version)
        return wv if applied else None

    def shutdown(self) -> None:
        super().shutdown()
        r, self._receiver = getattr(self, "_receiver", None), None
        if r is not None:
            r.close()
        s, self._store = getattr(self, "_store", None), None
        if s is not None:
            s.close()


# ---------------------------------------------------------------------------
# The legacy API

def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SharedCounter:
    """One int64 in a file under /dev/shm, shared by every process that
    unpickles it (torchrl may cloudpickle env factories, which would copy a
    shared torch tensor by value). The creator unlinks the file on close,
    or, when close is never called (a collector shut down without closing
    its weight updater), once the creator's counter is garbage or its
    process exits: /dev/shm is not left a file per run."""

    def __init__(self, path: Optional[str] = None):
        self._owner = path is None
        self.path = path or f"/dev/shm/rlhub-torchrl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._unlink: Optional["weakref.finalize[[str], SharedCounter]"] = None
        if self._owner:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, 8)
            finally:
                os.close(fd)
            self._unlink = weakref.finalize(self, _unlink_quietly, self.path)
        self._arr: Any = None

    def _map(self) -> Any:
        if self._arr is None:
            import numpy as np

            self._arr = np.memmap(self.path, dtype=np.int64, mode="r+", shape=(1,))
        return self._arr

    def get(self) -> int:
        return int(self._map()[0])

    def set(self, v: int) -> None:
        self._map()[0] = v

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.path, self._owner, self._arr, self._unlink = state["path"], False, None, None

    def close(self) -> None:
        if self._owner:
            self._owner = False
            if self._unlink is not None:
                self._unlink()  # once: a finalize runs its function at most once


class RlhubVersionTransform(Transform):  # type: ignore[misc]
    """Writes ``policy_version`` (int64) into every step from a counter in
    shared memory, which a :class:`RlhubWeightUpdater` sets to the rlhub
    version it applied. Made by :meth:`RlhubWeightUpdater.version_transform`;
    it crosses into collector workers with the env (a :class:`SharedCounter`)."""

    def __init__(self, counter: SharedCounter, key: str = "policy_version"):
        super().__init__(in_keys=[], out_keys=[key])
        self.counter = counter
        self.key = key

    def _stamp(self, td: TensorDictBase) -> TensorDictBase:
        kw: Dict[str, Any] = {"dtype": torch.int64}
        if td.device is not None:
            kw["device"] = td.device
        td.set(self.key, torch.full(td.shape, self.counter.get(), **kw))
        return td

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._stamp(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._stamp(tensordict_reset)

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        from torchrl.data import Unbounded  # type: ignore[import-untyped]

        observation_spec[self.key] = Unbounded(shape=observation_spec.shape, dtype=torch.int64,
                                               device=observation_spec.device)
        return observation_spec


with warnings.catch_warnings():
    # torchrl 0.14 warns at every WeightUpdaterBase subclass's creation; this
    # one exists on purpose, for code on the older API, and should not warn
    # whoever merely imports rlhub.torchrl.
    warnings.simplefilter("ignore", DeprecationWarning)

    class RlhubWeightUpdater(WeightUpdaterBase):  # type: ignore[misc]
        """rlhub as a torchrl ``WeightUpdaterBase`` (the older API).

            updater = RlhubWeightUpdater(source=ws.StoreSource(hub, "policy"), hub=hub,
                                         collector_id="actor-0", strip_prefix="module.")
            env = TransformedEnv(GymEnv("CartPole-v1"), updater.version_transform())
            col = Collector(env, policy, ..., weight_updater=updater)
            col.update_policy_weights_()   # the newest rlhub version, if newer

        Called with no weights it applies the newest rlhub version if
        newer; with weights (a module, a TensorDict or a state dict) it
        copies those. The target is ``policy`` when given, else the
        registered collector's policy; for a multi-process collector, the
        shared weights its workers run. ``last_update`` tells whether the
        last call changed the policy.
        """

        def __init__(self, receiver: Optional[Receiver] = None, *, source: Optional[Source] = None,
                     policy: Any = None, hub: Any = None, collector_id: Optional[str] = None,
                     model: Optional[str] = None, timeout: Optional[float] = None,
                     strip_prefix: str = "", add_prefix: str = "", name_map: Optional[NameMap] = None,
                     strict: bool = True):
            self.names = make_name_map(strip_prefix, add_prefix, name_map)
            self._policy = policy
            if receiver is None:
                if source is None:
                    raise ValueError("RlhubWeightUpdater needs a receiver or a source")
                receiver = Receiver(None, source, collector_id=collector_id, model=model, hub=hub,
                                    strict=strict)
            self.receiver = receiver
            self.receiver.target = _LegacyTarget(self)
            self.timeout = timeout
            self.last_update = False
            self._collector_wrs: Optional[List[weakref.ReferenceType[Any]]] = None
            self._post_hooks: Optional[List[Callable[[], None]]] = None
            self._counter = SharedCounter()

        @property
        def version(self) -> int:
            """The rlhub version the policy runs."""
            return self.receiver.version

        def version_transform(self, key: str = "policy_version") -> RlhubVersionTransform:
            """An env transform that stamps :attr:`version` into each step."""
            return RlhubVersionTransform(self._counter, key)

        def _targets(self) -> Dict[str, Any]:
            if self._policy is not None:
                return _map_names(self._policy.state_dict(keep_vars=True), self.names)
            col = self.collector if self._collector_wrs else None
            if col is None:
                raise errors.InvalidArgument("RlhubWeightUpdater: no policy given and no collector registered")
            shared = getattr(col, "_policy_weights_dict", None)
            if shared:
                # A multi-process collector on the legacy path: its workers'
                # policies run on these shared tensors (torchrl's own
                # MultiProcessedWeightUpdater writes them the same way).
                out: Dict[str, Any] = {}
                for td in shared.values():
                    for k, t in _map_names(dict(td.flatten_keys(".").items()), self.names).items():
                        out.setdefault(k, []).append(t)
                return {k: _Fanout(v) if len(v) > 1 else v[0] for k, v in out.items()}
            return _map_names(col.policy.state_dict(keep_vars=True), self.names)

        def _get_server_weights(self) -> Optional[WeightVersion]:
            return self.receiver.get(self.timeout)  # newer, or of another life (Receiver.follow_lives)

        def _maybe_map_weights(self, server_weights: Any) -> Any:
            return server_weights

        def all_worker_ids(self) -> None:
            """The target is local (or shared with every worker): one sync."""
            return None

        def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any = None) -> None:
            if server_weights is None:
                self.last_update = False
                return
            if isinstance(server_weights, WeightVersion):
                self.last_update = self.receiver.apply(server_weights)
                self._counter.set(self.receiver.version)
                return
            sd = _map_names(_local_weights(server_weights), self.names)
            copy_into(self._targets(), bytearray(save_bytes(
                {k: v.detach().cpu().contiguous() for k, v in sd.items()})), strict=self.receiver.strict)
            self.last_update = True

        def increment_version(self) -> None:
            """rlhub versions come from the hub: nothing to count here."""

        def close(self) -> None:
            self.receiver.close()
            self._counter.close()


class _LegacyTarget:
    def __init__(self, up: "RlhubWeightUpdater"):
        self._up = weakref.ref(up)

    def state_dict(self, keep_vars: bool = True) -> Dict[str, Any]:
        up = self._up()
        if up is None:
            raise errors.Unavailable("RlhubWeightUpdater is gone")
        return up._targets()


class _Fanout:
    """Several tensors (one per device) that receive the same copy. A
    writer's check of its target (rlhub.tensors.unwritable) checks every
    one of them (fanned_out)."""

    def __init__(self, ts: List[torch.Tensor]):
        self._ts = ts
        self.shape, self.dtype, self.device = ts[0].shape, ts[0].dtype, ts[0].device

    def fanned_out(self) -> List[torch.Tensor]:
        return list(self._ts)

    def is_contiguous(self) -> bool:
        return False

    def copy_(self, src: torch.Tensor) -> None:
        for t in self._ts:
            t.copy_(src)
