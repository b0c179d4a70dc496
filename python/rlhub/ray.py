"""Ray actors that take their weights from rlhub, not from Ray's object store.

torchrl's ``RayWeightUpdater`` ``ray.put``\\ s the whole state dict and calls
``update_policy_weights_.remote(weights)`` on every remote collector: the
weights cross Ray's object store once per update. :class:`RlhubRayWeightUpdater`
has the same shape (``push_weights``/``__call__``, ``all_worker_ids``,
``max_interval``, post-hooks) but pushes a *version* to the rlhub hub and
sends each actor only "sync to the newest"; the actors pull from rlhub
(store, push stream, or a relay's shared memory on their host) and report
the version they run, so the lag shows in ``rlhub sync status``::

    import ray, rlhub.ray as rr

    ray.init(address=...)
    actors = rr.start_receivers(4, RolloutActor, hub="10.0.0.1:7470", model="policy",
                                make_module=make_policy, via="push")
    up = rr.RlhubRayWeightUpdater(actors, hub="10.0.0.1:7470", model="policy")
    up.push_weights(trained_policy)          # version v+1 in rlhub; actors sync to it
    ray.get([a.version.remote() for a in actors])   # [v+1, v+1, ...]

* :class:`ReceiverActor` is the base for collector or learner actors: it
  builds its module with ``make_module()`` and keeps it at the newest rlhub
  version (:meth:`ReceiverActor.sync`); subclass it and act with
  ``self.module``. Decorate the subclass with nothing: :func:`start_receivers`
  makes it a Ray actor.
* :class:`ARSWorkerActor` is :class:`rlhub.ARSWorker` as an actor:
  :func:`start_ars_workers` starts ``n`` of them serving a hub's ARS run
  (Ray places them on any node), and :func:`stop_ars_workers` stops them
  and returns their statistics.

Importing this module imports ``ray``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray

from rlhub import errors
from rlhub._sources import OWN_REPORTS, SourceSpec, failover_specs, open_source
from rlhub.store import StoreClient
from rlhub.tensors import save_bytes
from rlhub.wsync import Receiver, Source

__all__ = ["ReceiverActor", "ARSWorkerActor", "RlhubRayWeightUpdater", "start_receivers",
           "start_ars_workers", "stop_ars_workers", "source_for", "SourceSpec", "failover_specs"]


def source_for(via: str, hub: str, model: str, collector_id: str, shm_path: Optional[str] = None, *,
               relay: Optional[str] = None, failover: Optional[Sequence[SourceSpec]] = None,
               probe_every: float = 1.0, lease: bool = True, report_hub: Optional[str] = None) -> Source:
    """An rlhub source inside an actor: ``store``, ``push``, ``dataplane``
    (the hub's push fan-out on its data plane, gRPC push stream as the
    fallback), ``shm`` or
    ``failover`` (the relay's segment ``shm_path`` and stream ``relay``,
    then the upstream ``hub``; or the ``failover`` list; or, with ``hub``
    an ``etcd://`` cluster and none of those, the relay announced on the
    actor's node, looked up at each dial). A segment is leased
    (``lease=False``: the copying reader)."""
    return open_source(via, hub, model, collector_id=collector_id, shm_path=shm_path, relay=relay,
                       failover=failover, probe_every=probe_every, lease=lease, report_hub=report_hub)


class ReceiverActor:
    """A Ray actor's module, kept at the newest rlhub version.

    Args:
        hub: the hub (or, for ``via="push"``, a relay) address.
        model: the model's name in rlhub.
        make_module: builds the ``torch.nn.Module`` (or dict of tensors)
            the weights are copied into; it must pickle (Ray ships it).
        via: ``store``, ``push``, ``dataplane`` (the hub's push fan-out on
            its data plane: :class:`rlhub.wsync.DataPlaneSource`, which
            falls back to the push stream), ``shm`` (a relay's segment on the
            actor's node, ``shm_path``) or ``failover`` (that segment and/or
            the stream of the relay at ``relay``, falling over to ``hub``
            when the relay dies and back when it returns; ``failover``, a
            list of :class:`SourceSpec`, to choose the order; or with
            ``hub`` an ``etcd://`` cluster and none of those, the relay
            announced on the actor's node, looked up at each dial).
        collector_id: the id the actor reports under (default
            ``ray-<actor id>``).
        report_hub: where reports go when not ``hub`` (a push stream
            reports on the stream).
        lease: a segment's versions are leased and copied straight into
            the module (the default); ``False``: the copying reader.
    """

    def __init__(self, hub: str, model: str, make_module: Callable[[], Any], *, via: str = "store",
                 collector_id: Optional[str] = None, shm_path: Optional[str] = None,
                 report_hub: Optional[str] = None, strict: bool = True, relay: Optional[str] = None,
                 failover: Optional[Sequence[SourceSpec]] = None, probe_every: float = 1.0,
                 lease: bool = True):
        ctx = ray.get_runtime_context()
        self.collector_id = collector_id or f"ray-{(ctx.get_actor_id() or 'driver')[:12]}"
        self.module = make_module()
        # A failover source reports itself, to report_hub while on a segment.
        src = source_for(via, hub, model, self.collector_id, shm_path, relay=relay, failover=failover,
                         probe_every=probe_every, lease=lease, report_hub=report_hub)
        self.receiver = Receiver(self.module, src, collector_id=self.collector_id, model=model,
                                 hub=None if via in OWN_REPORTS else (report_hub or hub),
                                 strict=strict)

    def source(self) -> Optional[str]:
        """The source in use: a failover source's current dialer
        (``relay-shm``, ``relay``, ``upstream``), else the ``via``."""
        src = self.receiver.source
        return getattr(src, "current", None) or getattr(src, "via", None)

    def sync(self, timeout: Optional[float] = None, at_least: int = 0) -> int:
        """Applies the newest version if newer (waiting up to ``timeout``
        for version ``at_least`` or a later one when that is ahead of the
        module) and returns the version the module runs."""
        r = self.receiver
        r.poll()
        if at_least > r.version and timeout:
            # The source may hold a version between the module's and
            # at_least (one the actor was skipped for): apply it and wait on.
            deadline = time.monotonic() + timeout
            while r.version < at_least:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                r.wait(left)
        return r.version

    def version(self) -> int:
        """The rlhub version the module runs (0: none yet)."""
        return self.receiver.version

    def sums(self) -> Dict[str, float]:
        """Each tensor's sum: a cheap fingerprint of the weights the module
        holds (for checks; the weights themselves never cross Ray)."""
        from rlhub.wsync import _targets

        return {k: float(t.detach().double().sum()) for k, t in _targets(self.module).items()}

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.receiver.close()


class ARSWorkerActor:
    """:class:`rlhub.ARSWorker` on a Ray actor: ``start`` serves the hub's
    ARS tasks on a thread of the actor until ``stop``."""

    def __init__(self, hub: str, env_id: str, **kwargs: Any):
        from rlhub.ars_worker import ARSWorker

        self.worker = ARSWorker(hub, env_id, **kwargs)
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> str:
        """Starts serving; returns this actor's Ray node id."""
        def run() -> None:
            try:
                self.worker.run()
            except BaseException as e:  # returned by stop()
                self._error = e

        self._thread = threading.Thread(target=run, name="rlhub-ars-worker", daemon=True)
        self._thread.start()
        return ray.get_runtime_context().get_node_id()

    def stop(self, timeout: float = 60.0) -> Dict[str, Any]:
        """Stops after the task in progress; returns the worker's counts
        (``tasks``, ``steps``, ``pulls``, ``node``) or raises its error."""
        self.worker.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise errors.DeadlineExceeded(f"ARS worker did not stop within {timeout} s")
        self.worker.close()
        if self._error is not None:
            raise self._error
        st = self.worker.stats
        return {"tasks": st.tasks, "steps": st.steps, "pulls": st.pulls,
                "node": ray.get_runtime_context().get_node_id()}


def _spread(n: int, options: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per-actor Ray options: the caller's, else one CPU each."""
    return [dict(options or {"num_cpus": 1}) for _ in range(n)]


def start_receivers(n: int, cls: type = ReceiverActor, *args: Any, actor_options: Optional[Sequence[Dict[str, Any]]] = None,
                    **kwargs: Any) -> List[Any]:
    """Starts ``n`` actors of ``cls`` (a :class:`ReceiverActor` subclass)
    with ``cls(*args, **kwargs)``; ``actor_options[i]`` are the i-th actor's
    Ray options (``num_cpus``, ``scheduling_strategy`` …)."""
    remote: Any = ray.remote(cls)
    opts = list(actor_options) if actor_options is not None else _spread(n, None)
    if len(opts) != n:
        raise ValueError(f"actor_options has {len(opts)} entries for {n} actors")
    return [remote.options(**o).remote(*args, **kwargs) for o in opts]


def start_ars_workers(n: int, hub: str, env_id: str, *, actor_options: Optional[Sequence[Dict[str, Any]]] = None,
                      **kwargs: Any) -> List[Any]:
    """Starts ``n`` :class:`ARSWorkerActor` serving ``hub``'s ARS run on
    ``env_id`` (``kwargs`` go to :class:`rlhub.ARSWorker`); returns the
    actors once each is serving."""
    actors = start_receivers(n, ARSWorkerActor, hub, env_id, actor_options=actor_options, **kwargs)
    ray.get([a.start.remote() for a in actors])
    return actors


def stop_ars_workers(actors: Sequence[Any], timeout: float = 60.0) -> List[Dict[str, Any]]:
    """Stops ARS worker actors; returns each one's counts."""
    return list(ray.get([a.stop.remote(timeout) for a in actors], timeout=timeout + 30))


class RlhubRayWeightUpdater:
    """torchrl's ``RayWeightUpdater``, with rlhub carrying the weights.

    Args:
        remote_collectors: actor handles with ``sync(timeout, at_least)``
            (a :class:`ReceiverActor`; torchrl's ``RayCollector`` actors do
            not have it — give them an rlhub receiver scheme instead).
        hub, model: where versions are pushed.
        max_interval: batches a worker may skip between updates (as
            torchrl's: 0 updates every call).
        timeout: how long each actor waits for the pushed version.

    ``push_weights(weights)`` pushes ``weights`` (a module, TensorDict or
    state dict) as the next version (compare-and-set on the newest) and
    asks each due actor to sync to it; ``push_weights()`` with no weights
    only asks them to sync to the newest version in rlhub. Returns the
    version each actor runs (None for skipped ones). Nothing but the
    version number crosses Ray.
    """

    def __init__(self, remote_collectors: Sequence[Any], *, hub: str, model: str, max_interval: int = 0,
                 timeout: float = 30.0):
        self.remote_collectors = list(remote_collectors)
        self.hub, self.model = hub, model
        self.max_interval = max(0, max_interval)
        self.timeout = timeout
        self._since = [0] * len(self.remote_collectors)
        self._store: Optional[StoreClient] = None
        self._version = 0
        self.post_hooks: List[Callable[[], None]] = []

    def all_worker_ids(self) -> List[int]:
        return list(range(len(self.remote_collectors)))

    def register_post_hook(self, hook: Callable[[], None]) -> None:
        self.post_hooks.append(hook)

    def _skip_update(self, worker_id: int) -> bool:
        self._since[worker_id] += 1
        return self._since[worker_id] <= self.max_interval

    def _client(self) -> StoreClient:
        if self._store is None:
            self._store = StoreClient(self.hub)
        return self._store

    def _push(self, weights: Any) -> int:
        store = self._client()
        if self._version == 0:
            infos = [m for m in store.list() if m.name == self.model]
            self._version = infos[0].version if infos else 0
        if hasattr(weights, "flatten_keys"):  # a TensorDict
            weights = weights.flatten_keys(".").to_dict()
        elif hasattr(weights, "state_dict"):
            weights = weights.state_dict()
        blob = save_bytes({k: (v.detach().cpu().contiguous() if hasattr(v, "detach") else v)
                           for k, v in weights.items()})
        v = self._version + 1
        try:
            store.push(self.model, blob, version=v, expect=self._version)
        except errors.StaleVersion:
            self._version = 0  # another writer moved on: re-read the newest next time
            raise
        self._version = v
        return v

    def push_weights(self, policy_or_weights: Any = None, worker_ids: Any = None) -> List[Optional[int]]:
        target = self._push(policy_or_weights) if policy_or_weights is not None else 0
        ids = self.all_worker_ids() if worker_ids is None else (
            [worker_ids] if isinstance(worker_ids, int) else list(worker_ids))
        calls: Dict[int, Any] = {}
        for i in ids:
            if self._skip_update(i):
                continue
            calls[i] = self.remote_collectors[i].sync.remote(self.timeout, target)
            self._since[i] = 0
        got = dict(zip(calls, ray.get(list(calls.values()), timeout=self.timeout + 30)))
        for hook in self.post_hooks:
            hook()
        return [got.get(i) for i in ids]

    __call__ = push_weights

    @property
    def version(self) -> int:
        """The last version this updater pushed (0: none)."""
        return self._version

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
