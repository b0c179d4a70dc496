"""ARS worker in Python: evaluates a hub's ARS directions on a Gymnasium env.

    python -m rlhub.ars_worker --hub 127.0.0.1:7470 --env CartPole-v1

does what ``rlhub worker ars`` does (internal/arsrpc/worker.go): Attach,
Lease (long poll), take the policy inlined in the lease or PullPolicy it,
run the tasks, Report them (asking for the next lease in the same round
trip), Detach on exit. A run it cannot serve (another environment, a
policy that does not decode, a report the hub refuses as invalid) is
skipped as the Go worker skips it: logged, its tasks given back at once
and the run named in ``skip_runs`` from then on, while the worker serves
the hub's other runs. Stopped (``stop()``, SIGINT, SIGTERM) in the middle
of an episode, it stops within 256 steps, reports the tasks of the lease
it finished and detaches. Each task is computed as internal/ars/rollout.go
computes it:

* direction d of iteration j: δ = ``ars_noise.direction(P, seed, j·N + d)``;
  two episodes with θ + νδ and θ − νδ (each parameter ``θ + s·(ν·δ)``), both
  reset with the same episode seed (stream ``j·2³² + d``); every reward has
  ``shift`` subtracted; every observation acted on (raw, before the filter)
  goes into Welford statistics that are reported with the result;
* evaluation episode e: θ itself, shift 0, no statistics, episode stream
  ``j·2³² + 2³¹ + e``.

The policy acts as ``ars.Forward.Act``: x̃ = (x − μ)·(1/σ) (V2/V2-t only;
frozen filter from the policy's statistics), each output a left-to-right
sum of exactly rounded products, argmax (lowest index on ties) for a
discrete action space, the raw outputs for a Box (cast to the space's dtype,
left to the environment to clip, as the Go environments do; pass
``clip_actions=True`` for an environment that does not clip).

Episode seeds: the Go environments seed a PCG from the two words of
``ars_noise.episode_seed``; a Gymnasium environment is reset with
``seed = w1 + 2⁶⁴·w2``, the same 128 bits as one integer. Gymnasium's reset
draws its initial state with its own generator, so a Python worker on a
Gymnasium env and a Go worker on the Go port of that env start episodes from
different states: runs are reproducible per worker language, and bit-identical
across languages only when the environment itself is (see
python/tests/test_ars_worker.py, which checks exactly that with a port of the
Go CartPole).

An environment the hub has no Go implementation of (your own Gymnasium
env) runs when the run spec carries its spaces (``env_spec``):

    python -m rlhub.ars_worker --env MyEnv-v0 --print-env-spec   # the flags below
    rlhub train ars --hub ADDR --workers 0 --env MyEnv-v0 --obs-dim 8 --discrete 4 --out runs/x

gymnasium is imported lazily, only when no ``make_env`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from rlhub import ars_noise, errors
from rlhub._proto.rlhub.v1 import ars_pb2, ars_pb2_grpc
from rlhub._transfer import Assembler
from rlhub.store import channel
from rlhub.tensors import load_bytes, parse_header

__all__ = [
    "ARSPolicy",
    "ARSWorker",
    "EnvAdapter",
    "Stats",
    "WorkerStats",
    "decode_policy",
    "episode_seed",
    "run_task",
    "main",
]

log = logging.getLogger("rlhub.ars_worker")

MIN_STD = 1e-7  # ars.MinStd: a component with σ below this normalises to 0
_POLICY_MAX_BYTES = 256 << 20
_VERSIONS = ("V1", "V2", "V1-t", "V2-t")
_TASK_DIRECTION = ars_pb2.ARS_TASK_KIND_DIRECTION
_TASK_EVAL = ars_pb2.ARS_TASK_KIND_EVAL


# ---------------------------------------------------------------------------
# Policy (internal/ars/statedict.go, policy.go)


@dataclasses.dataclass
class ARSPolicy:
    """A published ARS policy as decoded from its safetensors blob.

    ``theta`` is flat and laid out as the Go ``Arch``: per layer the weight
    matrix (out × in, row-major), then (MLP only) the bias.
    """

    env: str
    version: str
    iteration: int
    seed: int
    obs_dim: int
    out_dim: int
    discrete: bool
    hidden: Tuple[int, ...]
    directions: int
    top: int
    step_size: float
    noise: float
    shift: float
    theta: np.ndarray
    count: float
    mean: np.ndarray
    m2: np.ndarray
    #: Keys of a Dict observation space, ``(name, flattened length)`` in the
    #: space's order (metadata ``ars.obs_keys``); empty for a flat one.
    obs_keys: Tuple[Tuple[str, int], ...] = ()

    def filters_by_key(self) -> Dict[str, Tuple[float, np.ndarray, np.ndarray]]:
        """Each key's filter statistics ``(count, mean, m2)`` (``ars.Stats.ByKey``)."""
        out, off = {}, 0
        for name, dim in self.obs_keys:
            out[name] = (self.count, self.mean[off:off + dim].copy(), self.m2[off:off + dim].copy())
            off += dim
        return out

    def layers(self) -> List[Tuple[int, int, int, int]]:
        """(in, out, weight offset, bias offset or -1) of each affine map."""
        sizes = [self.obs_dim, *self.hidden, self.out_dim]
        out, off = [], 0
        for i in range(len(sizes) - 1):
            n_in, n_out = sizes[i], sizes[i + 1]
            w = off
            off += n_in * n_out
            b = -1
            if self.hidden:
                b = off
                off += n_out
            out.append((n_in, n_out, w, b))
        return out

    @property
    def num_params(self) -> int:
        """len(θ)."""
        return sum(i * o + (o if b >= 0 else 0) for i, o, _, b in self.layers())

    def normalises(self) -> bool:
        """Whether the policy acts on filtered states (V2, V2-t)."""
        return self.version in ("V2", "V2-t")

    def filter(self) -> Tuple[np.ndarray, np.ndarray]:
        """The frozen filter (mean, 1/σ) as ``ars.Policy.Filter``."""
        n = self.obs_dim
        if not self.normalises() or self.count < 2:
            return np.zeros(n), np.ones(n)
        sd = np.sqrt(self.m2 / (self.count - 1.0))
        inv = np.zeros(n)
        ok = sd >= MIN_STD
        inv[ok] = 1.0 / sd[ok]
        return self.mean.copy(), inv


def decode_policy(blob: Any) -> ARSPolicy:
    """Parses and validates a policy blob (untrusted bytes).

    Raises ``rlhub.InvalidArgument`` for anything ``ars.PolicyFromStateDict``
    would reject.
    """

    def bad(msg: str) -> errors.InvalidArgument:
        return errors.InvalidArgument(f"ars policy: {msg}")

    try:
        _, _, meta = parse_header(memoryview(blob).cast("B"))
        tensors = load_bytes(blob)
    except (ValueError, TypeError, KeyError) as e:
        raise bad(str(e)) from e

    def uint(key: str) -> int:
        v = meta.get(key, "")
        if not v.isdigit():
            raise bad(f"metadata {key} = {v!r}")
        return int(v)

    def flt(key: str) -> float:
        try:
            return float(meta.get(key, "0") or "0")
        except ValueError:
            return 0.0  # as Go's ParseFloat with the error ignored

    version = meta.get("ars.version", "")
    if version not in _VERSIONS:
        raise bad(f"metadata ars.version = {version!r}")
    obs_dim, out_dim, discrete = uint("ars.obs_dim"), uint("ars.out_dim"), uint("ars.discrete")
    if discrete and discrete != out_dim:
        raise bad(f"{discrete} discrete actions but {out_dim} outputs")
    hidden_s = meta.get("ars.hidden", "")
    try:
        hidden = tuple(int(s) for s in hidden_s.split(",")) if hidden_s else ()
    except ValueError:
        raise bad(f"metadata ars.hidden = {hidden_s!r}") from None
    if not (1 <= obs_dim <= 1 << 16 and 1 <= out_dim <= 1 << 16 and len(hidden) <= 16
            and all(1 <= h <= 4096 for h in hidden)):
        raise bad(f"architecture obs {obs_dim}, out {out_dim}, hidden {hidden}")
    p = ARSPolicy(
        env=meta.get("ars.env", ""), version=version, iteration=uint("ars.iteration"),
        seed=uint("ars.seed"), obs_dim=obs_dim, out_dim=out_dim, discrete=discrete > 0,
        hidden=hidden, directions=int(meta.get("ars.directions", "0") or 0),
        top=int(meta.get("ars.top", "0") or 0), step_size=flt("ars.step_size"),
        noise=flt("ars.noise"), shift=flt("ars.shift"),
        theta=np.zeros(0), count=0.0, mean=np.zeros(0), m2=np.zeros(0))

    def get(name: str, shape: Tuple[int, ...]) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise bad(f"missing tensor {name!r}")
        if t.dtype != np.dtype("<f8") or tuple(t.shape) != shape:
            raise bad(f"tensor {name!r} is {t.dtype}{list(t.shape)}, want F64{list(shape)}")
        return np.array(t, dtype=np.float64).reshape(-1)

    parts, names = [], 3
    for i, (n_in, n_out, _, b) in enumerate(p.layers()):
        wname = "policy.weight" if not hidden else f"policy.{i}.weight"
        parts.append(get(wname, (n_out, n_in)))
        names += 1
        if b >= 0:
            parts.append(get(f"policy.{i}.bias", (n_out,)))
            names += 1
    if len(tensors) != names:
        raise bad(f"{len(tensors)} tensors, want {names}")
    p.theta = np.concatenate(parts)
    if not np.all(np.isfinite(p.theta)):
        raise bad("a parameter is not finite")
    p.count = float(get("filter.count", (1,))[0])
    p.mean = get("filter.mean", (obs_dim,))
    p.m2 = get("filter.m2", (obs_dim,))
    if not (p.count >= 0 and p.count == np.trunc(p.count) and np.isfinite(p.count)):
        raise bad(f"filter count {p.count} is not a whole number ≥ 0")
    if not (np.all(np.isfinite(p.mean)) and np.all(np.isfinite(p.m2)) and np.all(p.m2 >= 0)):
        raise bad("filter statistics are not finite or have a negative M2")
    p.obs_keys = _decode_obs_keys(meta.get("ars.obs_keys", ""), obs_dim, bad)
    return p


def _decode_obs_keys(raw: str, obs_dim: int, bad: Callable[[str], Exception]) -> Tuple[Tuple[str, int], ...]:
    """``ars.obs_keys`` as ``internal/ars/obskeys.go`` validates it."""
    if not raw:
        return ()
    try:
        items = json.loads(raw)
        keys = tuple((str(k["name"]), int(k["dim"])) for k in items)
        assert all(isinstance(k["name"], str) and isinstance(k["dim"], int) for k in items)
    except (ValueError, TypeError, KeyError, AssertionError):
        raise bad("metadata ars.obs_keys is not a JSON list of {name, dim}") from None
    names = [n for n, _ in keys]
    if (len(keys) > 256 or len(set(names)) != len(names) or any(not n or len(n.encode()) > 128 for n in names)
            or any(not 1 <= d <= 1 << 16 for _, d in keys) or sum(d for _, d in keys) != obs_dim):
        raise bad(f"observation keys do not describe {obs_dim} observations")
    return keys


# ---------------------------------------------------------------------------
# Statistics and forward pass (internal/ars/filter.go, policy.go)


class Stats:
    """Welford running mean and M2 of observation vectors (``ars.Stats``)."""

    def __init__(self, dim: int):
        self.count = 0.0
        self.mean = np.zeros(dim)
        self.m2 = np.zeros(dim)

    def push(self, x: np.ndarray) -> None:
        """Adds one vector, in the Go order of operations."""
        self.count += 1.0
        d = x - self.mean
        self.mean += d / self.count
        self.m2 += d * (x - self.mean)

    def to_pb(self) -> ars_pb2.ARSFilterStats:
        """The statistics as reported to the hub."""
        return ars_pb2.ARSFilterStats(count=self.count, mean=self.mean.tolist(), m2=self.m2.tolist())


class _Forward:
    """``ars.Forward``: the outputs of policy θ for one observation."""

    def __init__(self, p: ARSPolicy, theta: np.ndarray):
        self.layers = [(theta[w:w + n_in * n_out].reshape(n_out, n_in), theta[b:b + n_out] if b >= 0 else None)
                       for n_in, n_out, w, b in p.layers()]

    def outputs(self, mean: np.ndarray, inv_std: np.ndarray, obs: np.ndarray) -> np.ndarray:
        x = (obs - mean) * inv_std
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            # Go sums s = 0; s += w_k·x_k left to right: cumsum is that
            # sequential fold (np.sum would sum pairwise); + 0.0 makes an
            # all −0 row +0 as the fold from +0 does.
            s = np.cumsum(w * x, axis=1)[:, -1] + 0.0
            if b is not None:
                s = s + b
            if i < last:
                s = np.tanh(s)  # libm tanh: MLPs are not bit-identical to Go
            x = s
        out: np.ndarray = x
        return out


# ---------------------------------------------------------------------------
# Environment adapter


class EnvAdapter:
    """Wraps a Gymnasium-style env: float64 flat observations, Go-style actions.

    ``reset(seed)`` takes the 128-bit episode seed; ``step(outputs)`` turns
    the policy's outputs into the env's action (argmax + ``start`` for a
    ``Discrete`` space; the outputs reshaped and cast to the ``Box`` dtype,
    optionally clipped to its bounds, otherwise).
    """

    def __init__(self, env: Any, clip_actions: bool = False):
        self.env = env
        space = env.action_space
        self.clip = clip_actions
        if hasattr(space, "n") and not hasattr(space, "nvec"):
            self.discrete, self.out_dim = True, int(space.n)
            self.start = int(getattr(space, "start", 0))
        elif hasattr(space, "low") and hasattr(space, "high") and hasattr(space, "shape"):
            self.discrete, self.out_dim = False, int(np.prod(space.shape))
            self.shape, self.dtype = tuple(space.shape), np.dtype(space.dtype)
            self.low, self.high = np.asarray(space.low), np.asarray(space.high)
        else:
            raise errors.InvalidArgument(f"ars worker: action space {space} is neither Discrete nor Box")
        ospace = env.observation_space
        self.obs_keys: Tuple[Tuple[str, int], ...] = ()
        self._dict_space: Any = None
        if _is_dict_space(ospace):
            # A Dict space: flattened in its key order, as
            # gymnasium.spaces.flatten does; one filter per key.
            from gymnasium import spaces as gs
            self._dict_space = ospace
            self.obs_keys = tuple((str(k), int(gs.flatdim(sub))) for k, sub in ospace.spaces.items())
            self.obs_dim = sum(d for _, d in self.obs_keys)
        else:
            self.obs_dim = int(np.prod(ospace.shape)) if getattr(ospace, "shape", None) else 0

    def check(self, p: ARSPolicy) -> None:
        """Refuses a policy whose spaces do not fit this env."""
        if p.discrete != self.discrete or p.out_dim != self.out_dim or p.obs_dim != self.obs_dim:
            def kind(discrete: bool) -> str:
                return "discrete" if discrete else "continuous"

            raise errors.InvalidArgument(
                f"ars worker: policy of env {p.env!r} has {p.obs_dim} observations and {p.out_dim} "
                f"{kind(p.discrete)} outputs; this env has {self.obs_dim} and {self.out_dim} {kind(self.discrete)}")
        if tuple(p.obs_keys) != self.obs_keys:
            # Another flatten layout would feed the per-key filters (and
            # the policy) the wrong components.
            raise errors.InvalidArgument(
                f"ars worker: policy of env {p.env!r} takes observation keys {list(p.obs_keys)}; "
                f"this env's are {list(self.obs_keys)}")

    def spec(self) -> ars_pb2.ARSEnvSpec:
        """The env's spaces as a run spec's ``env_spec`` (for an env the hub
        does not know; ``rlhub train ars --obs-dim … --discrete|--act-dim …``)."""
        keys = [ars_pb2.ARSObsKey(name=n, dim=d) for n, d in self.obs_keys]
        if self.discrete:
            return ars_pb2.ARSEnvSpec(obs_dim=self.obs_dim, discrete=self.out_dim, obs_keys=keys)
        return ars_pb2.ARSEnvSpec(obs_dim=self.obs_dim, act_dim=self.out_dim, obs_keys=keys)

    def _flat(self, obs: Any) -> np.ndarray:
        if self._dict_space is not None:
            from gymnasium import spaces as gs
            obs = gs.flatten(self._dict_space, obs)
        return np.asarray(obs, dtype=np.float64).reshape(-1)

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        return self._flat(obs)

    def step(self, out: np.ndarray) -> Tuple[np.ndarray, float, bool, bool]:
        if self.discrete:
            action: Any = _argmax_go(out) + self.start
        else:
            action = out.reshape(self.shape).astype(self.dtype)
            if self.clip:
                action = np.clip(action, self.low, self.high)
        obs, r, term, trunc, _ = self.env.step(action)
        return self._flat(obs), float(r), bool(term), bool(trunc)


def _is_dict_space(space: Any) -> bool:
    try:
        from gymnasium import spaces as gs
    except ImportError:
        return False
    return isinstance(space, gs.Dict)


def _argmax_go(out: np.ndarray) -> int:
    """Go's ``best = 0; if out[o] > out[best] { best = o }``: the first
    maximum; a NaN is never greater, so NaN at 0 wins and later NaNs lose."""
    nan = np.isnan(out)
    if nan.any():
        if nan[0]:
            return 0
        out = np.where(nan, -np.inf, out)
    return int(np.argmax(out))


def episode_seed(seed: int, index: int) -> int:
    """The 128-bit integer an episode's env is reset with (w1 + 2⁶⁴·w2)."""
    w1, w2 = ars_noise.episode_seed(seed, index)
    return w1 | w2 << 64


def _train_index(it: int, d: int) -> int:
    return (it << 32 | d) & 0xFFFFFFFFFFFFFFFF


def _eval_index(it: int, e: int) -> int:
    return (it << 32 | 1 << 31 | e) & 0xFFFFFFFFFFFFFFFF


# _STOP_EVERY is how many steps an episode runs between looks at the
# worker's stop (ars.RunUntil's 256).
_STOP_EVERY = 256


class _Stopped(Exception):
    """The worker was stopped in the middle of a task."""


class _CannotServe(errors.InvalidArgument):
    """A run of an environment this worker was not started for."""


def _rollout(env: EnvAdapter, p: ARSPolicy, theta: np.ndarray, mean: np.ndarray, inv: np.ndarray,
             shift: float, seed: int, stats: Optional[Stats],
             stop: Optional[threading.Event] = None) -> Tuple[float, int]:
    """``ars.Rollout``: one episode of θ; shifted return and steps. Raises
    ``_Stopped`` when ``stop`` is set (looked at every 256 steps)."""
    fw = _Forward(p, theta)
    obs = env.reset(seed)
    ret, steps = 0.0, 0
    while True:
        if stop is not None and steps % _STOP_EVERY == 0 and stop.is_set():
            raise _Stopped()
        if stats is not None:
            stats.push(obs)
        obs, r, term, trunc = env.step(fw.outputs(mean, inv, obs))
        ret += r - shift
        steps += 1
        if term or trunc:
            return ret, steps


def run_task(p: ARSPolicy, env: EnvAdapter, kind: ars_pb2.ARSTaskKind, index: int) -> ars_pb2.ARSTaskResult:
    """Computes one task of iteration ``p.iteration`` (``ars.Evaluator.Run``)."""
    return _run_task(p, env, kind, index, None)


def _run_task(p: ARSPolicy, env: EnvAdapter, kind: ars_pb2.ARSTaskKind, index: int,
              stop: Optional[threading.Event]) -> ars_pb2.ARSTaskResult:
    """``run_task``, raising ``_Stopped`` within 256 steps of ``stop`` being set
    (``ars.Evaluator.RunUntil``)."""
    mean, inv = p.filter()
    res = ars_pb2.ARSTaskResult(task=ars_pb2.ARSTask(kind=kind, index=index))
    if kind == _TASK_DIRECTION:
        delta = ars_noise.direction(p.num_params, p.seed, p.iteration * p.directions + index)
        scaled = p.noise * delta
        stats = Stats(p.obs_dim)
        seed = episode_seed(p.seed, _train_index(p.iteration, index))
        rp, n1 = _rollout(env, p, p.theta + scaled, mean, inv, p.shift, seed, stats, stop)
        rm, n2 = _rollout(env, p, p.theta + -1.0 * scaled, mean, inv, p.shift, seed, stats, stop)
        res.r_plus, res.r_minus, res.steps = rp, rm, n1 + n2
        res.stats.CopyFrom(stats.to_pb())
    elif kind == _TASK_EVAL:
        ret, n = _rollout(env, p, p.theta, mean, inv, 0.0,
                          episode_seed(p.seed, _eval_index(p.iteration, index)), None, stop)
        setattr(res, "return", ret)
        res.steps = n
    else:
        raise errors.InvalidArgument(f"ars worker: unknown task kind {kind}")
    return res


# ---------------------------------------------------------------------------
# The worker loop (internal/arsrpc/worker.go)


@dataclasses.dataclass
class WorkerStats:
    """What a worker did."""

    tasks: int = 0
    steps: int = 0
    pulls: int = 0  # PullPolicy streams (policies not inlined in a lease)


class ARSWorker:
    """Serves a hub's ARS tasks on one environment until stopped.

        w = ARSWorker("127.0.0.1:7470", "CartPole-v1")
        w.run()          # from another thread: w.stop()

    ``make_env`` (no arguments) builds the environment; by default
    ``gymnasium.make(env_id)``. A lease for a run whose environment is not
    ``env_id``, whose policy does not decode or whose report the hub refuses
    as invalid makes the worker skip that run (internal/arsrpc/worker.go):
    it logs why, detaches (releasing the run's tasks at once) and asks for
    other runs only (``skipped`` lists them). ``after_lease``, when given, is called with
    every non-empty lease before its tasks run (tests use it to kill a
    worker that holds tasks).
    """

    def __init__(self, hub: str, env_id: str, *, make_env: Optional[Callable[[], Any]] = None,
                 name: str = "py-worker", max_tasks: int = 8, wait: float = 1.0,
                 retry_for: float = 30.0, clip_actions: bool = False,
                 after_lease: Optional[Callable[[ars_pb2.ARSLeaseResponse], None]] = None):
        if max_tasks < 1 or wait < 0 or retry_for < 0:
            raise ValueError(f"ars worker: max_tasks {max_tasks}, wait {wait}, retry_for {retry_for}")
        self.hub, self.env_id, self.name = hub, env_id, name
        self.max_tasks, self.wait, self.retry_for = max_tasks, wait, retry_for
        self.stats = WorkerStats()
        self._make_env = make_env
        self._clip = clip_actions
        self._after_lease = after_lease
        self._env: Optional[EnvAdapter] = None
        self._stop = threading.Event()
        self._channel = channel(hub)
        self._client = ars_pb2_grpc.ARSStub(self._channel)
        self._id = ""
        self._run_id, self._version = "", 0
        self._policy: Optional[ARSPolicy] = None
        self.skipped: List[str] = []  # runs this worker asks the hub not to lease

    # -- public ---------------------------------------------------------

    def stop(self) -> None:
        """Asks ``run`` to return within 256 steps of the episode in progress,
        after reporting the lease's finished tasks (thread-safe)."""
        self._stop.set()

    def close(self) -> None:
        """Closes the channel; safe to call twice."""
        self._channel.close()

    def __enter__(self) -> "ARSWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def env(self) -> EnvAdapter:
        """The worker's environment, made on first use."""
        if self._env is None:
            if self._make_env is not None:
                raw = self._make_env()
            else:
                import gymnasium  # optional dependency, only for the default env

                raw = gymnasium.make(self.env_id)
            self._env = EnvAdapter(raw, clip_actions=self._clip)
        return self._env

    def run(self) -> WorkerStats:
        """Attaches and serves leases until ``stop()``; then detaches.

        Raises the mapped gRPC error when the hub stays unreachable for
        ``retry_for`` seconds or refuses the worker for good (credentials);
        a run it cannot serve is skipped, not raised.
        """
        self.env()  # fail before attaching when the env cannot be made
        try:
            self._loop()
        finally:
            if self._id:
                try:
                    self._client.Detach(ars_pb2.ARSDetachRequest(worker_id=self._id), timeout=2.0)
                except grpc.RpcError:
                    pass
                self._id = ""
        return self.stats

    # -- internals ------------------------------------------------------

    def _lease_request(self) -> ars_pb2.ARSLeaseRequest:
        return ars_pb2.ARSLeaseRequest(worker_id=self._id, max_tasks=self.max_tasks,
                                       wait_ms=int(self.wait * 1000), held_run_id=self._run_id,
                                       held_version=self._version, skip_runs=self.skipped)

    def _loop(self) -> None:
        failing_since: Optional[float] = None
        backoff = 0.05

        def retry(err: errors.RlhubError) -> bool:
            # Retry within retry_for of the first failure, backing off from
            # 50 ms to 2 s (a hub restarting on its --data keeps the run);
            # never a permanent refusal (errors.is_permanent).
            nonlocal failing_since, backoff
            if self._stop.is_set() or errors.is_permanent(err):
                return False
            now = time.monotonic()
            if failing_since is None:
                failing_since, backoff = now, 0.05
            if now - failing_since > self.retry_for:
                return False
            log.debug("ars worker: retrying in %.2fs: %s", backoff, err)
            self._stop.wait(backoff)
            backoff = min(2 * backoff, 2.0)
            return True

        while not self._stop.is_set():
            if not self._id:
                try:
                    resp = self._client.Attach(ars_pb2.ARSAttachRequest(name=self.name), timeout=10.0,
                                               wait_for_ready=True)
                except grpc.RpcError as e:
                    err = errors.from_rpc_error(e)
                    if retry(err):
                        continue
                    raise err from e
                # A new attachment may be to another hub, whose run of the
                # same id and version is another run: forget the policy held.
                self._id = resp.worker_id
                self._policy, self._run_id, self._version = None, "", 0
            try:
                lease = self._client.Lease(self._lease_request(), timeout=self.wait + 10.0)
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
                if isinstance(err, errors.NotFound):
                    self._id = ""  # the hub forgot us: attach again
                    continue
                if retry(err):
                    continue
                raise err from e
            failing_since = None
            while lease is not None and len(lease.tasks) > 0 and not self._stop.is_set():
                run_id = lease.run_id
                try:
                    lease = self._serve(lease)
                except errors.InvalidArgument as err:
                    # A run of another environment, or one the hub and this
                    # worker disagree about (a policy that does not decode,
                    # a refused report: a bug or a version mismatch).
                    # Retrying would fail the same way and exiting would
                    # leave the hub's other runs without this worker: give
                    # its tasks back at once and ask for other runs only.
                    self._skip_run(run_id, err)
                    break
                except errors.RlhubError as err:
                    if not retry(err):
                        raise
                    break

    def _skip_run(self, run_id: str, err: errors.RlhubError) -> None:
        if isinstance(err, _CannotServe):
            log.warning("ars worker: skipping run %s: %s", run_id, err)
        else:
            log.error("ars worker: skipping run %s, which the hub and this worker disagree about: %s", run_id, err)
        if run_id not in self.skipped:
            self.skipped.append(run_id)
        if self._run_id == run_id:
            self._policy, self._run_id, self._version = None, "", 0
        try:
            self._client.Detach(ars_pb2.ARSDetachRequest(worker_id=self._id), timeout=5.0)
        except grpc.RpcError:
            pass  # its leases expire instead
        self._id = ""

    def _serve(self, lease: ars_pb2.ARSLeaseResponse) -> Optional[ars_pb2.ARSLeaseResponse]:
        if self._after_lease is not None:
            self._after_lease(lease)
        p = self._ensure_policy(lease)
        env = self.env()
        req = ars_pb2.ARSReportRequest(worker_id=self._id, run_id=lease.run_id, iteration=lease.iteration)
        for t in lease.tasks:
            try:
                res = _run_task(p, env, t.kind, t.index, self._stop)
            except _Stopped:
                self._report_finished(req)
                return None  # unreported tasks go back to the pool on Detach
            self.stats.tasks += 1
            self.stats.steps += res.steps
            req.results.append(res)
        req.next.CopyFrom(self._lease_request())
        try:
            resp = self._client.Report(req, timeout=30.0)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e
        return resp.next if resp.HasField("next") else None

    def _report_finished(self, req: ars_pb2.ARSReportRequest) -> None:
        """Reports a stopped lease's finished tasks, asking for no next lease,
        within a second: their work is not lost when the hub answers at once
        (a result is a function of its task: what is not reported is run
        again by another worker)."""
        if len(req.results) == 0:
            return
        try:
            self._client.Report(req, timeout=1.0)
        except grpc.RpcError as e:
            log.debug("ars worker: report of the finished tasks on the way out failed: %s",
                      errors.from_rpc_error(e))

    def _ensure_policy(self, lease: ars_pb2.ARSLeaseResponse) -> ARSPolicy:
        if lease.spec.env != self.env_id:
            raise _CannotServe(
                f"ars worker: hub run {lease.run_id} trains env {lease.spec.env!r}, but this worker "
                f"runs {self.env_id!r}; start a worker with --env {lease.spec.env}")
        if self._policy is not None and self._run_id == lease.run_id and self._version == lease.version:
            return self._policy
        if lease.policy:
            p = decode_policy(lease.policy)
        else:
            p = decode_policy(pull_policy(self._client, lease.run_id, lease.version))
            self.stats.pulls += 1
        if p.iteration != lease.iteration:
            raise errors.InvalidArgument(
                f"ars worker: policy version {lease.version} is iteration {p.iteration}, "
                f"lease is for iteration {lease.iteration}")
        self.env().check(p)
        self._policy, self._run_id, self._version = p, lease.run_id, lease.version
        return p


def pull_policy(client: ars_pb2_grpc.ARSStub, run_id: str, version: int = 0, timeout: float = 30.0) -> bytes:
    """Downloads one policy version's safetensors blob (0 means the newest)."""
    try:
        stream = client.PullPolicy(ars_pb2.ARSPullPolicyRequest(run_id=run_id, version=version), timeout=timeout)
        first = next(stream, None)
        if first is None or not first.HasField("info"):
            raise errors.InvalidArgument("pull policy: stream did not start with BlobInfo")
        try:
            asm = Assembler(first.info.total_bytes, max_bytes=_POLICY_MAX_BYTES)
            for part in stream:
                if not part.HasField("chunk"):
                    raise errors.InvalidArgument("pull policy: stream sent a second header")
                asm.write(part.chunk.data)
            return bytes(asm.finish())
        except ValueError as e:
            raise errors.InvalidArgument(f"pull policy: {e}") from e
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from e


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m rlhub.ars_worker``: serve ARS tasks until SIGINT/SIGTERM."""
    ap = argparse.ArgumentParser(prog="rlhub-ars-worker", description=__doc__.splitlines()[0])
    ap.add_argument("--hub", default="127.0.0.1:7470", help="hub address")
    ap.add_argument("--env", required=True, help="Gymnasium environment id (must be the run's env)")
    ap.add_argument("--name", default="py-worker", help="worker name in the hub's logs")
    ap.add_argument("--max-tasks", type=int, default=8, help="tasks per lease")
    ap.add_argument("--wait", type=float, default=1.0, help="long-poll seconds asked of the hub")
    ap.add_argument("--retry-for", type=float, default=30.0, help="seconds an unreachable hub is retried")
    ap.add_argument("--clip-actions", action="store_true", help="clip Box actions to the space's bounds")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--print-env-spec", action="store_true",
                    help="print the `rlhub train ars` flags describing --env's spaces and exit")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    w = ARSWorker(a.hub, a.env, name=a.name, max_tasks=a.max_tasks, wait=a.wait,
                  retry_for=a.retry_for, clip_actions=a.clip_actions)
    if a.print_env_spec:
        sp = w.env().spec()
        kind = f"--discrete {sp.discrete}" if sp.discrete else f"--act-dim {sp.act_dim}"
        keys = ",".join(f"{k.name}:{k.dim}" for k in sp.obs_keys)
        print(f"--env {a.env} --obs-dim {sp.obs_dim} {kind}" + (f" --obs-keys {keys}" if keys else ""))
        w.close()
        return 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: w.stop())
    try:
        with w:
            st = w.run()
    except errors.RlhubError as e:
        print(f"rlhub.ars_worker: {e}", file=sys.stderr)
        return 1
    print(f"rlhub.ars_worker: {st.tasks} tasks, {st.steps} steps, {st.pulls} policy pulls", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
