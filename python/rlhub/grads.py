"""Client for the gradient reducer: register a model, push gradients, read counters.

    with rlhub.GradClient("127.0.0.1:7470") as g:
        g.register("policy", optimizer=torch.optim.Adam(model.parameters(), lr=3e-4),
                   gradient_max=0.5)
        v = store.pull("policy")                           # weights at v.version
        loss.backward()
        receipt = g.push("policy", v.version, model, life=v.life)   # the params' .grad
        print(g.stats().total)

What happens on the wire is described in docs/reducer.md. A push goes to
one of the live secondaries the primary lists (``Reducer.Secondaries``),
picked at random. With ``transport="auto"`` (the default) the gradient
travels on the hub's data plane (docs/wire.md): the header first, then, once
the secondary has admitted it, the safetensors header and the tensors' own
memory in ``sendmsg`` calls, with no copy in Python. A secondary that does
not speak the data plane is pushed to over gRPC for a minute, as is every
push with ``transport="grpc"``; the bytes, answers and exceptions are the
same on both. The client retries the *same* ``(client id, seq)``:

* ``UNAVAILABLE`` (secondary down or detached, broken connection): the
  secondary is marked dead for ``dead_for`` seconds, the list is refreshed
  and another one is tried;
* ``RESOURCE_EXHAUSTED`` (queue full) or ``ABORTED`` (the same id is still
  being reduced elsewhere): jittered back-off from ``backoff`` doubling to
  ``max_backoff``, then a retry at the same secondary (which then counts the
  gradient once: docs/reducer.md, Counters);
* ``ALREADY_EXISTS`` answering a *retry* after an attempt that may have
  reached a secondary (its connection broke after sending) means that
  attempt got through: the push succeeded (``Receipt.duplicate`` is True).
  Otherwise (a first attempt, or retries after attempts that sent nothing
  or were refused before admission) it means the sequence number was used
  before, and is raised.

The list of secondaries is also asked again every ``refresh_every`` seconds,
so secondaries that start or restart (at a new address) get pushes from
clients already running, not only after a failure. Given a cluster as
``etcd://E/NAME``, the client also watches the secondaries announced in etcd
(``serve --role reducer --etcd``, :mod:`rlhub.discover`): a new one is used
as soon as it is announced, and one whose lease expired is dropped at once.
A hub being restarted is ridden out: ``deadline`` is the window a push keeps retrying in.

Every retry is bounded by ``max_attempts`` and ``deadline``; when they run
out the last error is raised as its named exception (``QueueFull``,
``Unavailable``...). Anything else (``InvalidArgument`` for wrong names,
shapes, dtypes or NaN/Inf; ``NotFound`` for an unregistered model;
``StaleVersion`` for a too stale base version, or one of a model deleted
since it was pulled: ``life``) is raised at once.

A successful push means the gradient is *admitted into a batch*, not yet
applied; watch the model store for the version it produces.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import time
import uuid
from typing import Any, Container, Dict, Iterator, List, Mapping, Optional, Tuple

import grpc

from rlhub import _bulk, _channel, discover, errors
from rlhub._proto.rlhub.v1 import reducer_pb2, reducer_pb2_grpc, tensor_pb2
from rlhub._transfer import DEFAULT_CHUNK_BYTES, iter_part_chunks
from rlhub.tensors import PartsCache, parts_size

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
    # A restarted hub is back within a second or two: reconnect from 50ms
    # backing off to 1s (gRPC's defaults, 1s to 120s, leave a client idle
    # long after the hub is back).
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclasses.dataclass(frozen=True)
class Receipt:
    """What a successful push returns."""

    version: int
    """Model version when the gradient was admitted (0 for a duplicate)."""
    weight: float
    """Staleness weight the gradient was admitted with."""
    seq: int
    """The sequence number used."""
    addr: str
    """Address and id of the secondary that took it."""
    secondary: str
    attempts: int
    """Attempts it took (1 when the first one succeeded)."""
    duplicate: bool = False
    """True when a retry was answered ALREADY_EXISTS: an earlier attempt got through."""


@dataclasses.dataclass(frozen=True)
class Counters:
    """Reducer counters of one part (or the total). See docs/reducer.md."""

    pushed: int
    reduced: int
    applied: int
    steps: int
    dropped: Dict[str, int]
    queue_depth: int
    attempts: int = 0
    """Push attempts, retries included (``pushed`` counts each gradient once)."""

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class OutcomeUnknown(errors.Unavailable):
    """A push whose connection broke after it was sent, with the cluster's
    primary changed since: it may or may not have been applied and is not
    sent again (at most once); count it lost."""


@dataclasses.dataclass(frozen=True)
class Stats:
    """``Reducer.Stats`` of one hub: ``total`` sums ``parts``
    (``"primary"``, ``"secondary/<id>"``)."""

    total: Counters
    parts: Dict[str, Counters]
    versions: Dict[str, int]
    publish_p50_us: float
    publish_p99_us: float
    unreachable: Dict[str, str] = dataclasses.field(default_factory=dict)
    """Secondary hubs the primary's hub could not read (address → error)."""

    def accounted(self) -> bool:
        """True when every pushed gradient is applied or dropped (nothing in flight)."""
        return self.total.pushed == self.total.applied + self.total.dropped_total


def _counters(c: reducer_pb2.ReducerCounters) -> Counters:
    return Counters(c.pushed, c.reduced, c.applied, c.steps, dict(c.dropped), c.queue_depth, c.attempts)


@dataclasses.dataclass(frozen=True)
class Registered:
    """What ``register`` returns."""

    version: int
    """The version the primary starts from."""
    restored_steps: int
    """Optimizer steps restored from a checkpoint (0 when fresh)."""


_OPT_FIELDS = ("kind", "lr", "weight_decay", "momentum", "dampening", "nesterov", "beta1", "beta2",
               "eps", "alpha", "centered", "lr_decay", "initial_accumulator_value", "momentum_decay",
               "decoupled_weight_decay")
_SCHED_FIELDS = ("kind", "step_size", "gamma", "t_max", "min_lr", "warmup_steps", "warmup_start")


def optimizer_config(optimizer: Any) -> Dict[str, Any]:
    """Converts a ``torch.optim`` optimizer into the reducer's optimizer fields.

    Supports SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam and RAdam
    with one set of hyper-parameters (every param group equal). Options the
    reducer does not implement (amsgrad, maximize, ...) raise ``ValueError``
    rather than being ignored.

    The learning rate is the group's ``initial_lr`` when a
    ``torch.optim.lr_scheduler`` has been attached (it scales ``lr`` at
    once, e.g. ``LinearLR`` by its start factor: reading ``lr`` would apply
    the warm-up twice), else ``lr``. The schedule itself travels as
    ``register(schedule=...)``.
    """
    kind = type(optimizer).__name__.lower()
    groups = optimizer.param_groups
    if not groups:
        raise ValueError("optimizer has no param groups")
    keys = ("lr", "initial_lr", "momentum", "dampening", "nesterov", "weight_decay", "betas", "eps", "alpha",
            "centered", "amsgrad", "maximize", "decoupled_weight_decay", "lr_decay", "initial_accumulator_value",
            "momentum_decay")
    g = {k: groups[0][k] for k in keys if k in groups[0]}
    for other in groups[1:]:
        if any(other.get(k) != v for k, v in g.items()):
            raise ValueError("param groups with different hyper-parameters cannot be reduced by one optimizer")
    for flag in ("amsgrad", "maximize"):
        if g.get(flag):
            raise ValueError(f"{type(optimizer).__name__}({flag}=True) is not supported by the reducer")
    for key in ("eps", "alpha"):
        if key in g and float(g[key]) == 0:
            # The wire treats 0 as "PyTorch's default" (eps 1e-8, Adagrad's
            # 1e-10; alpha 0.99), so a real 0 would train with the default.
            raise ValueError(f"{type(optimizer).__name__}({key}=0) is not expressible (0 means the default): "
                             f"use a tiny positive value")
    lr = float(g["initial_lr"] if "initial_lr" in g else g["lr"])
    wd = float(g.get("weight_decay", 0.0))
    if kind == "adam" and g.get("decoupled_weight_decay"):
        kind = "adamw"
    if kind == "sgd":
        return dict(kind="sgd", lr=lr, weight_decay=wd, momentum=float(g.get("momentum", 0)),
                    dampening=float(g.get("dampening", 0)), nesterov=bool(g.get("nesterov", False)))
    if kind in ("adam", "adamw"):
        b1, b2 = (float(b) for b in g["betas"])
        if b1 == 0 or b2 == 0:
            # The wire treats 0 as "PyTorch's default", so a real 0 cannot travel.
            raise ValueError(f"betas {g['betas']}: a beta of exactly 0 is not expressible (0 means the default)")
        if kind == "adamw" and wd == 0:
            kind = "adam"  # AdamW without decay is Adam; wd 0 on the wire would mean 0.01
        return dict(kind=kind, lr=lr, weight_decay=wd, beta1=b1, beta2=b2, eps=float(g["eps"]))
    if kind == "rmsprop":
        return dict(kind="rmsprop", lr=lr, weight_decay=wd, momentum=float(g.get("momentum", 0)),
                    alpha=float(g["alpha"]), eps=float(g["eps"]), centered=bool(g.get("centered", False)))
    if kind == "adagrad":
        return dict(kind="adagrad", lr=lr, weight_decay=wd, lr_decay=float(g.get("lr_decay", 0)),
                    initial_accumulator_value=float(g.get("initial_accumulator_value", 0)), eps=float(g["eps"]))
    if kind in ("adamax", "nadam", "radam"):
        b1, b2 = (float(b) for b in g["betas"])
        if b1 == 0 or b2 == 0:
            raise ValueError(f"betas {g['betas']}: a beta of exactly 0 is not expressible (0 means the default)")
        out = dict(kind=kind, lr=lr, weight_decay=wd, beta1=b1, beta2=b2, eps=float(g["eps"]))
        if kind == "nadam":
            md = float(g.get("momentum_decay", 4e-3))
            if md == 0:
                raise ValueError("momentum_decay 0 is not expressible (0 means the default 0.004)")
            out["momentum_decay"] = md
        if kind in ("nadam", "radam"):
            out["decoupled_weight_decay"] = bool(g.get("decoupled_weight_decay", False))
        return out
    raise ValueError(f"optimizer {type(optimizer).__name__} is not supported "
                     "(SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam, RAdam; any other through rlhub.OptimizerHost)")


def _optimizer_proto(optimizer: Any, schedule: Optional[Mapping[str, Any]]) -> reducer_pb2.ReducerOptimizer:
    if isinstance(optimizer, reducer_pb2.ReducerOptimizer):
        o = reducer_pb2.ReducerOptimizer()
        o.CopyFrom(optimizer)
    else:
        if isinstance(optimizer, str):
            raise ValueError("optimizer must carry its lr: pass a torch optimizer or a dict like "
                             "{'kind': 'adam', 'lr': 3e-4}")
        cfg = dict(optimizer) if isinstance(optimizer, Mapping) else optimizer_config(optimizer)
        unknown = set(cfg) - set(_OPT_FIELDS)
        if unknown:
            raise ValueError(f"unknown optimizer fields {sorted(unknown)}; known: {_OPT_FIELDS}")
        o = reducer_pb2.ReducerOptimizer(**cfg)
    if schedule:
        unknown = set(schedule) - set(_SCHED_FIELDS)
        if unknown:
            raise ValueError(f"unknown schedule fields {sorted(unknown)}; known: {_SCHED_FIELDS}")
        for k, v in schedule.items():
            setattr(o, "schedule" if k == "kind" else k, v)
    return o


def gradient_dict(grads: Any) -> Dict[str, Any]:
    """The gradient state dict of ``grads``.

    ``grads`` is a dict of tensors/arrays (used as is) or a ``torch.nn.Module``:
    then every entry of its ``state_dict`` is sent, named as there: a
    parameter's ``.grad``, or zeros for a parameter without a gradient and
    for buffers (the reducer wants exactly the model's tensors, and a zero
    gradient leaves a buffer unchanged unless weight decay is on).
    """
    if isinstance(grads, Mapping):
        return dict(grads)
    if not hasattr(grads, "named_parameters") or not hasattr(grads, "state_dict"):
        raise TypeError(f"grads must be a dict of tensors or a torch.nn.Module, not {type(grads).__name__}")
    import torch

    params = dict(grads.named_parameters(remove_duplicate=False))
    out: Dict[str, Any] = {}
    for name, t in grads.state_dict(keep_vars=True).items():
        p = params.get(name)
        g = p.grad if p is not None else None
        out[name] = g.detach() if g is not None else torch.zeros_like(t.detach())
    return out


class GradClient:
    """A reducer client. Thread-safe; close it (or use ``with``).

    ``client_id`` names this client in every ``(client id, seq)``; the default
    is a random id. Sequence numbers start at ``first_seq``: by default 1 for
    a random id and the current Unix time in microseconds for an explicit
    one, so a restarted process with the same id keeps growing past its
    earlier pushes (the primary counts ids below its floor as applied).

    ``transport`` carries the gradients: "auto" (the data plane, with gRPC
    for a hub that does not speak it) or "grpc". ``timeout`` bounds each
    attempt on either. ``transport_stats`` counts which one pushes took.
    """

    def __init__(self, hub_addr: str, client_id: Optional[str] = None, *, timeout: float = 60.0,
                 deadline: float = 120.0, max_attempts: int = 0, backoff: float = 0.001,
                 max_backoff: float = 0.1, dead_for: float = 1.0, first_seq: Optional[int] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, seed: Optional[int] = None,
                 transport: str = "auto", refresh_every: float = 2.0):
        if not hub_addr:
            raise ValueError("hub_addr is required")
        if transport not in ("auto", "grpc"):
            raise ValueError(f"transport {transport!r}: want 'auto' or 'grpc'")
        self.transport = transport
        self.hub_addr = hub_addr
        self.client_id = client_id or f"py-{uuid.uuid4().hex[:16]}"
        self.timeout = timeout
        self.deadline = deadline
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.dead_for = dead_for
        self.refresh_every = refresh_every
        self._refreshed = 0.0  # monotonic time of the last listing (0: never)
        self.chunk_bytes = chunk_bytes
        if first_seq is None:
            first_seq = 1 if client_id is None else time.time_ns() // 1000
        self._seq = itertools.count(first_seq)
        self._parts = PartsCache()  # the last gradient's encoding, reused while its tensors are unchanged
        self._mu = threading.Lock()  # guards _rnd, _channels, _targets, _dead, _seq, _counts
        self._bulk = _bulk.Client() if transport == "auto" else None
        self._counts = {"bulk": 0, "grpc": 0, "fallback": 0}
        self._unknown = 0  # pushes raised as OutcomeUnknown
        self._rnd = random.Random(seed)
        self._channels: Dict[str, grpc.Channel] = {}
        self._targets: List[Tuple[str, str]] = []
        self._dead: Dict[Tuple[str, str], float] = {}
        self._channel(hub_addr)  # the hub's channel (re-made, like every channel, after close)
        # With an etcd:// hub_addr, secondaries announced in etcd come from a
        # watch (rlhub.discover): one that starts is used at once, one whose
        # announcement goes (withdrawn, lease expired) is skipped even if the
        # primary still lists it, until it is announced again.
        self._announced: List[Tuple[str, str]] = []
        self._withdrawn: set[str] = set()
        self._watch: Optional[discover.ServiceWatch] = None
        if _channel.parse_target(hub_addr).etcd:
            self._watch = discover.ServiceWatch(hub_addr, discover.KIND_SECONDARY, self._on_announced)

    def _on_announced(self, ss: List["discover.Service"]) -> None:
        now = {s.addr for s in ss}
        ts = [(s.addr, sid) for s in ss for sid in s.secondaries]
        with self._mu:
            self._withdrawn |= {a for a, _ in self._announced if a not in now}
            self._withdrawn -= now
            self._announced = ts

    def _candidates(self) -> List[Tuple[str, str]]:
        """The primary's list and the announced secondaries, less the
        withdrawn (under _mu)."""
        out: List[Tuple[str, str]] = []
        for t in self._targets + self._announced:
            if t not in out and t[0] not in self._withdrawn:
                out.append(t)
        return out

    def known(self) -> List[Tuple[str, str]]:
        """The secondaries a push picks from now, as (addr, id), without
        asking anyone (with an etcd:// address: the announced ones too)."""
        with self._mu:
            return self._candidates()

    # -- connections -----------------------------------------------------

    def _channel(self, addr: str) -> grpc.Channel:
        with self._mu:
            ch = self._channels.get(addr)
            if ch is None:
                ch = self._channels[addr] = _channel.channel(addr, options=_CHANNEL_OPTIONS)
                if addr == self.hub_addr and self._bulk is not None and isinstance(ch, _channel.FollowingChannel):
                    ch.on_move(self._bulk.abort)  # pushes in flight on a primary that moved end there: outcome unknown
            return ch

    @property
    def _hub(self) -> reducer_pb2_grpc.ReducerStub:
        """A stub on the hub's current channel: the one made before a
        ``close`` is closed, and a stub kept from then would raise
        ``ValueError: Cannot invoke RPC on closed channel!``."""
        return reducer_pb2_grpc.ReducerStub(self._channel(self.hub_addr))

    def close(self) -> None:
        """Stops the etcd watch and closes every channel and idle data-plane
        connection. Safe to call twice."""
        if self._watch is not None:
            self._watch.close()
        with self._mu:
            chans, self._channels = list(self._channels.values()), {}
        for ch in chans:
            ch.close()
        if self._bulk is not None:
            self._bulk.close()

    def transport_stats(self) -> Dict[str, int]:
        """Push attempts so far by transport: ``bulk`` (made on the data
        plane, whatever their outcome), ``grpc``, and ``fallback`` (attempts
        that found the secondary not speaking the data plane and went over
        gRPC; also counted in ``grpc``); ``bulk_dials``: data-plane
        connections opened (the rest of ``bulk`` reused an idle one)."""
        with self._mu:
            out = dict(self._counts)
        out["bulk_dials"] = self._bulk.dials if self._bulk is not None else 0
        return out

    def unknown(self) -> int:
        """Pushes raised as :class:`OutcomeUnknown` (counted lost)."""
        with self._mu:
            return self._unknown

    def _count(self, key: str) -> None:
        with self._mu:
            self._counts[key] += 1

    def __enter__(self) -> "GradClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operator RPCs ---------------------------------------------------

    def register(self, model: str, optimizer: Any, *, reduction: str = "mean", gradient_max: float = 0.0,
                 staleness: str = "accept", max_lag: int = 0, checkpoint_every: int = 0,
                 schedule: Optional[Mapping[str, Any]] = None) -> Registered:
        """Starts reducing gradients for ``model`` (already in the store; its
        newest version is the initial weights).

        ``optimizer`` is a ``torch.optim`` SGD/Adam/AdamW/RMSprop/Adagrad/
        Adamax/NAdam/RAdam (its hyper-parameters are sent, not its state; the
        lr is ``initial_lr`` when a scheduler is attached), or a dict of
        ``ReducerOptimizer`` fields (``{"kind": "adam", "lr": 3e-4}``; a zero
        field means PyTorch's default). ``schedule`` holds ``kind`` ("step",
        "cosine"), ``step_size``, ``gamma``, ``t_max``, ``min_lr``,
        ``warmup_steps``, ``warmup_start``. ``reduction`` is "mean" or "sum";
        ``gradient_max`` a global-norm clip (0: none); ``staleness`` "accept",
        "drop" or "downweight" with ``max_lag``. Registering again with the
        same config is a no-op; another config raises ``AlreadyExists``.
        """
        errors.check_version("max_lag", max_lag)
        errors.check_version("checkpoint_every", checkpoint_every)
        req = reducer_pb2.ReducerRegisterRequest(
            model=model, optimizer=_optimizer_proto(optimizer, schedule), reduction=reduction,
            gradient_max=gradient_max, staleness=staleness, max_lag=max_lag, checkpoint_every=checkpoint_every)
        try:
            resp = self._hub.Register(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return Registered(resp.version, resp.restored_steps)

    def stats(self, addr: Optional[str] = None) -> Stats:
        """Counters of the hub at ``addr`` (default: the primary's hub)."""
        stub = self._hub if addr is None else reducer_pb2_grpc.ReducerStub(self._channel(addr))
        try:
            r = stub.Stats(reducer_pb2.ReducerStatsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return Stats(_counters(r.total), {k: _counters(v) for k, v in r.parts.items()}, dict(r.versions),
                     r.publish_p50_us, r.publish_p99_us, dict(r.unreachable))

    def secondaries(self) -> List[Tuple[str, str]]:
        """Refreshes and returns the live secondaries as (addr, id)."""
        self._refresh()
        with self._mu:
            return list(self._targets)

    def _refresh(self) -> None:
        try:
            r = self._hub.Secondaries(reducer_pb2.ReducerSecondariesRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        hub = _channel.primary_addr(self._channel(self.hub_addr), self.hub_addr)  # a cluster's primary
        ts = [(s.addr or hub, s.id) for s in r.secondaries]
        with self._mu:
            self._targets = ts
            self._refreshed = time.monotonic()

    def _maybe_refresh(self) -> None:
        """Lists the secondaries again when the list is older than
        ``refresh_every`` (a failure keeps the old list)."""
        if self.refresh_every <= 0:
            return
        with self._mu:
            stale = self._refreshed and time.monotonic() - self._refreshed > self.refresh_every
            if stale:
                self._refreshed = time.monotonic()  # one caller refreshes; retry in refresh_every
        if stale:
            try:
                self._refresh()
            except errors.RlhubError:
                pass

    def _choose(self, any_listed: bool = False, skip: Container[str] = ()) -> Optional[Tuple[str, str]]:
        """A random secondary not marked dead, nor at an address in
        ``skip``; with ``any_listed`` any listed one not skipped (the
        primary, asked just now, lists only ones marked dead, such as a
        restarted hub's own)."""
        now = time.monotonic()
        with self._mu:
            live = [t for t in self._candidates() if t[0] not in skip
                    and (any_listed or now - self._dead.get(t, -1e18) > self.dead_for)]
            return self._rnd.choice(live) if live else None

    def _listed(self) -> bool:
        """Whether any secondary is listed or announced."""
        with self._mu:
            return bool(self._candidates())

    # -- pushing ---------------------------------------------------------

    def next_seq(self) -> int:
        """Takes the next sequence number."""
        with self._mu:
            return next(self._seq)

    def push(self, model: str, base_version: int, grads: Any, *, seq: Optional[int] = None,
             life: int = 0) -> Receipt:
        """Pushes the gradient of ``model`` computed on ``base_version``.

        ``life`` is that version's life as pulled (``ModelVersion.life``; 0:
        unknown): if the model was deleted and pushed again since, the
        gradient is refused (``StaleVersion``) rather than applied to the new
        model, even at the same version.

        ``grads`` is a ``torch.nn.Module`` (its parameters' ``.grad``, named
        like its ``state_dict``; see ``gradient_dict``) or a dict of torch
        tensors / numpy arrays with exactly the model's names, shapes and
        dtype (F32). ``seq`` defaults to the client's next sequence number.
        Returns once the gradient is admitted into a batch. The tensors'
        memory is sent as it is while the call runs (contiguous CPU tensors
        are not copied): do not change them until it returns.
        """
        errors.check_version("base_version", base_version)
        errors.check_version("life", life)
        if seq is not None:
            errors.check_version("seq", seq)
        body = self._parts.get(gradient_dict(grads))
        if seq is None:
            seq = self.next_seq()
        header = reducer_pb2.ReducerPushHeader(
            blob=tensor_pb2.BlobInfo(model=model, version=base_version, life=life, total_bytes=parts_size(*body),
                                     chunk_bytes=self.chunk_bytes),
            client_id=self.client_id, seq=seq)
        give_up = time.monotonic() + self.deadline
        backoff = self.backoff
        last: Optional[errors.RlhubError] = None
        attempt = 0
        stick: Optional[Tuple[str, str]] = None  # where back-pressure refused the last attempt
        self._maybe_refresh()
        epoch = 0  # the primary the attempt whose outcome is unknown was for (0 for one hub)
        unknown = False  # an attempt may have been applied
        unanswered: Dict[str, int] = {}  # data-plane connects or handshakes with no answer, by address
        silent: Dict[str, errors.RlhubError] = {}  # addresses not tried again (NO_ANSWER_TRIES), their last error
        while True:
            attempt += 1
            if unknown and self._epoch() != epoch:
                # Never resent to a primary other than the one that may
                # have applied it: at most once (docs/cluster.md, Clients).
                with self._mu:
                    self._unknown += 1
                raise OutcomeUnknown(f"rlhub: push {self.client_id}/{seq}: its outcome is unknown and the primary "
                                     f"changed (epoch {epoch} → {self._epoch()}): counted lost, not resent; last: {last}")
            if (self.max_attempts and attempt > self.max_attempts) or (attempt > 1 and time.monotonic() > give_up):
                assert last is not None
                raise last
            t, stick = stick or self._choose(skip=silent), None
            if t is None:
                listed = False
                try:
                    self._refresh()
                    listed = True
                    t = self._choose(any_listed=True, skip=silent)
                    if t is None:
                        last = errors.Unavailable("no live reducer secondary")
                except errors.Unavailable as e:
                    last = e
                if t is None and listed and silent and self._listed():
                    # Every secondary the primary lists now left this push's
                    # connects or handshakes unanswered: the last one's error.
                    a = next(reversed(silent))
                    raise _bulk.not_tried_again(silent[a], unanswered[a])
                if t is None:
                    backoff = self._sleep(backoff)
                    continue
            if not unknown:
                # Read before each attempt, not once per push (as the Go
                # client): a fresh client learns the primary only with its
                # first listing, and the primary may change between attempts
                # that all failed before sending; only an attempt that may
                # have landed pins it.
                epoch = self._epoch()
            try:
                resp = self._push_once(t, header, body)
                return Receipt(resp.version, resp.weight, seq, t[0], t[1], attempt)
            except errors.RlhubError as e:
                code = e.code
                last = e
            if code == grpc.StatusCode.ALREADY_EXISTS and unknown:
                # Only an earlier attempt that may have reached a secondary
                # makes this "ours": after attempts that provably sent
                # nothing (a refused dial, a standby's refusal) or were
                # refused before admission (RESOURCE_EXHAUSTED), the seq
                # was used before, as on a first attempt: raised below.
                return Receipt(0, 0.0, seq, t[0], t[1], attempt, duplicate=True)
            if code == grpc.StatusCode.UNAVAILABLE:
                hub = self._channel(self.hub_addr)
                ref = _channel.refusal(last)
                if ref is not None and isinstance(hub, _channel.FollowingChannel):
                    hub.offer(*ref)  # a standby: not applied; follow the primary it names
                elif ref is None and not isinstance(last, _bulk.NothingSent):
                    # It may have reached the secondary. Not so when the
                    # connect, TLS or the data-plane hello failed: the
                    # request goes out only after them, and ALREADY_EXISTS
                    # after such attempts alone is a reused sequence
                    # number, not an earlier attempt's duplicate.
                    unknown = True
                if isinstance(last, _bulk.NoAnswer):
                    if isinstance(hub, _channel.FollowingChannel) and (p := hub.primary()) is not None \
                            and p[0] == last.addr:
                        # The primary itself is silent (stopped, its machine
                        # hung): its gRPC connection stays READY, and the
                        # listing below would wait out its timeout there.
                        # Look the primary up again first.
                        hub.offer("", 0)
                    n = unanswered[last.addr] = unanswered.get(last.addr, 0) + 1
                    if n >= _bulk.NO_ANSWER_TRIES:
                        silent[last.addr] = last  # not chosen again in this push
                with self._mu:
                    self._dead[t] = time.monotonic()
                try:
                    self._refresh()
                except errors.RlhubError:
                    pass  # best effort: the next choice skips the dead one
                if self._choose() is None:
                    # Every listed secondary is marked dead: the next try
                    # would be the same one at once, a spin against it and
                    # the primary's listing.
                    backoff = self._sleep(backoff)
                continue
            if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED):
                backoff = self._sleep(backoff)
                stick = t
                continue
            raise last

    def _epoch(self) -> int:
        ch = self._channel(self.hub_addr)
        p = ch.primary() if isinstance(ch, _channel.FollowingChannel) else None
        return p[1] if p is not None else 0

    def _push_once(self, t: Tuple[str, str], header: reducer_pb2.ReducerPushHeader,
                   body: Tuple[bytes, List[memoryview]]) -> reducer_pb2.ReducerPushResponse:
        """One attempt; raises the answer as an ``errors.RlhubError``."""
        addr, sid = t
        h = reducer_pb2.ReducerPushHeader()
        h.CopyFrom(header)
        h.secondary = sid
        if self._bulk is not None and self._bulk.supported(addr):
            resp = reducer_pb2.ReducerPushResponse()
            try:
                self._bulk.call(addr, _bulk.PUSH_METHOD, h.SerializeToString(), [body[0], *body[1]], resp,
                                timeout=self.timeout)
            except _bulk.NotSupported:
                self._count("fallback")  # and over gRPC below
            except BaseException:
                self._count("bulk")
                raise
            else:
                self._count("bulk")
                return resp
        self._count("grpc")

        def requests() -> Iterator[reducer_pb2.ReducerPushRequest]:
            yield reducer_pb2.ReducerPushRequest(header=h)
            for c in iter_part_chunks(body[0], body[1], self.chunk_bytes):
                yield reducer_pb2.ReducerPushRequest(chunk=tensor_pb2.Chunk(data=c))

        stub = reducer_pb2_grpc.ReducerStub(self._channel(addr))
        try:
            got: reducer_pb2.ReducerPushResponse = stub.Push(requests(), timeout=self.timeout)
            return got
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def _sleep(self, backoff: float) -> float:
        """Sleeps a jittered ``backoff`` (between half and all of it); returns the next one."""
        with self._mu:
            j = self._rnd.random()
        time.sleep(backoff * (0.5 + 0.5 * j))
        return min(2 * backoff, self.max_backoff)
