"""rlhub.torchrl inside real torchrl 0.14 collectors on CartPole-v1.

The policy's network has zero weights and bias [v, -v] at rlhub version v,
so every frame's ``action_value`` tells which version chose its action; each
test checks that it equals the version stamped into the frame
(``("next", "policy_version")``), for every frame of every batch.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

# torchrl warns about its own deprecated classes while importing them: import
# everything before a test turns warnings into errors.
import torchrl.collectors  # noqa: E402
from tensordict.nn import TensorDictModule, TensorDictSequential  # noqa: E402
from torchrl.collectors import (Collector, MultiAsyncCollector, MultiSyncCollector,  # noqa: E402
                                 WeightUpdaterBase)
from torchrl.data import Unbounded  # noqa: E402
from torchrl.envs import GymEnv, TransformedEnv  # noqa: E402
from torchrl.envs.transforms import Transform  # noqa: E402

import rlhub  # noqa: E402
import rlhub.wsync as ws  # noqa: E402
from rlhub.torchrl import RlhubWeightSyncScheme, RlhubWeightUpdater  # noqa: E402

from conftest import REPO  # noqa: E402

MODEL = "cartpole"
PREFIX = "module.0.module."  # TensorDictSequential -> TensorDictModule -> the net


def net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 2))


def weights(v: int) -> dict:
    """The trainer's state dict of version v: the hub's names (``0.weight``)."""
    return {"0.weight": torch.zeros(2, 4), "0.bias": torch.tensor([float(v), -float(v)])}


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def make_stamped_env(stamp) -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1"), stamp)


class Greedy(torch.nn.Module):
    """One-hot argmax: CartPole's action from the action values."""

    def forward(self, av: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(av.argmax(-1), av.shape[-1]).to(torch.int64)


def make_policy(env=None) -> TensorDictSequential:
    return TensorDictSequential(TensorDictModule(net(), in_keys=["observation"], out_keys=["action_value"]),
                                TensorDictModule(Greedy(), in_keys=["action_value"], out_keys=["action"]))


def ran_and_stamped(batch):
    ran = batch["action_value"][..., 0]
    stamped = batch["next", "policy_version"]
    return ran, stamped


def check_batch(batch) -> set:
    ran, stamped = ran_and_stamped(batch)
    assert torch.equal(ran, stamped.to(ran.dtype)), (
        f"frames ran versions {ran.unique().tolist()} but were stamped {stamped.unique().tolist()}")
    return set(int(v) for v in stamped.unique())


@pytest.fixture
def store(hub):
    with rlhub.StoreClient(hub.addr) as s:
        s.push(MODEL, weights(1), version=1, expect=0)
        yield s


@pytest.fixture
def relay(hub):
    """A real `rlhub relay` writing the model into a segment of its own."""
    import time
    import uuid

    from conftest import free_port

    shm = f"/dev/shm/rlhub-trl-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    p = subprocess.Popen([hub.binary, "relay", "--upstream", hub.addr, "--model", MODEL, "--id", "relay-trl",
                          "--listen", f"127.0.0.1:{free_port()}", "--shm", shm],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(shm):  # created with the relay's first version
            assert time.monotonic() < deadline and p.poll() is None, "the relay made no segment"
            time.sleep(0.02)
        yield shm
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.parametrize("via", ["store", "push", "dataplane", "shm"])
def test_scheme_collector(hub, store, via, request):
    """A single Collector receives every version through the scheme at
    rollout starts (store pulls, the push stream, the push fan-out on the
    hub's data plane, a relay's shared memory); no deprecation warning on
    this path."""
    shm = request.getfixturevalue("relay") if via == "shm" else None
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, via=via, shm_path=shm, collector_id=f"c-{via}",
                                   strip_prefix=PREFIX)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col = Collector(make_env(), make_policy(), frames_per_batch=16, total_frames=-1, auto_register_policy_transforms=False,
                        track_policy_version=True, weight_recv_schemes={"policy": scheme})
        try:
            for i, batch in enumerate(col):
                seen.append(check_batch(batch))
                if i == 0:
                    assert seen[0] == {1}
                top = max(max(s) for s in seen)
                if top >= 5:
                    break
                if store.list()[0].version == top:  # the trainer: one version per batch it has seen
                    store.push(MODEL, weights(top + 1), version=top + 1, expect=top)
                if i > 200:
                    pytest.fail(f"versions stuck at {seen[-1]}")
            if via == "dataplane":
                # A data-plane collector reports the version it runs in its
                # next poll (what the next rollout start does).
                assert scheme.receive() is None
        finally:
            col.shutdown()
            scheme.shutdown()
    flat = [v for s in seen for v in sorted(s)]
    assert flat == sorted(flat) and flat[-1] == 5 and all(len(s) == 1 for s in seen)
    # The hub's lag table names the collector and the version it runs.
    rows = {c.collector_id: c for m in ws.status(hub.addr, MODEL) for c in m.collectors}
    assert rows[f"c-{via}"].version == 5
    if via == "dataplane":  # on the data plane itself, not its gRPC fallback
        assert rows["c-dataplane"].via == "push-dp", rows["c-dataplane"]


def test_scheme_multisync(hub, store):
    """MultiSyncCollector with 2 workers: the parent is the sender (its
    update_policy_weights_ pushes a version to rlhub), each worker a receiver."""
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, via="store", collector_id="ms", strip_prefix=PREFIX)
    trainer = make_policy()
    with torch.no_grad():
        trainer[0].module[0].weight.zero_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col = MultiSyncCollector([make_env, make_env], make_policy(), frames_per_batch=32, total_frames=-1, auto_register_policy_transforms=False,
                                 track_policy_version=True, weight_sync_schemes={"policy": scheme})
        seen = []
        try:
            for i, batch in enumerate(col):
                assert batch["next", "policy_version"].shape[0] == 2  # both workers' frames
                seen.append(check_batch(batch))
                if len(seen) == 6:
                    break
                v = max(seen[-1]) + 1
                with torch.no_grad():
                    trainer[0].module[0].bias.copy_(torch.tensor([float(v), -float(v)]))
                col.update_policy_weights_(trainer)  # -> scheme.send: version v in rlhub
                assert scheme.last_sent == v
        finally:
            col.shutdown()
            scheme.shutdown()
    # Workers apply at their next rollout start: one version per batch.
    assert seen == [{1}, {2}, {3}, {4}, {5}, {6}]
    assert store.pull(MODEL).version == 6
    rows = {c.collector_id: c.version for m in ws.status(hub.addr, MODEL) for c in m.collectors}
    assert rows.get("ms-0") == 6 and rows.get("ms-1") == 6, rows


class WorkerTag(Transform):
    """Writes ``worker`` = i into every step: which worker of a
    MultiAsyncCollector a batch came from."""

    def __init__(self, i: int):
        super().__init__(in_keys=[], out_keys=["worker"])
        self.i = i

    def _tag(self, td):
        td.set("worker", torch.full(td.shape, self.i, dtype=torch.int64))
        return td

    def _step(self, tensordict, next_tensordict):
        return self._tag(next_tensordict)

    def _reset(self, tensordict, tensordict_reset):
        return self._tag(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        observation_spec["worker"] = Unbounded(shape=observation_spec.shape, dtype=torch.int64,
                                               device=observation_spec.device)
        return observation_spec


def make_tagged_env(i: int) -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1"), WorkerTag(i))


def test_scheme_multiasync(hub, store):
    """MultiAsyncCollector with 3 workers over the push stream: batches
    arrive from whichever worker is done, each stamped with the version its
    worker ran; the parent pushes a new version whenever the newest one has
    come back in a batch, and every worker ends on the newest (6)."""
    workers, newest = 3, 6
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, via="push", collector_id="ma", strip_prefix=PREFIX)
    trainer = make_policy()
    with torch.no_grad():
        trainer[0].module[0].weight.zero_()
    per_worker = {i: [] for i in range(workers)}
    pushed = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col = MultiAsyncCollector([functools.partial(make_tagged_env, i) for i in range(workers)], make_policy(),
                                  frames_per_batch=16, total_frames=-1, auto_register_policy_transforms=False,
                                  track_policy_version=True, weight_sync_schemes={"policy": scheme})
        try:
            for i, batch in enumerate(col):
                w = batch["worker"].unique().tolist()
                assert len(w) == 1, f"a batch mixes workers {w}"
                got = check_batch(batch)
                assert len(got) == 1, f"worker {w[0]} changed weights inside a batch: {sorted(got)}"
                per_worker[w[0]].append(got.pop())
                if all(vs and vs[-1] == newest for vs in per_worker.values()):
                    break
                if pushed < newest and max(max(vs, default=0) for vs in per_worker.values()) == pushed:
                    pushed += 1
                    with torch.no_grad():
                        trainer[0].module[0].bias.copy_(torch.tensor([float(pushed), -float(pushed)]))
                    col.update_policy_weights_(trainer)  # -> scheme.send: version `pushed` in rlhub
                    assert scheme.last_sent == pushed
                if i > 600:
                    pytest.fail(f"workers stuck at {per_worker}")
        finally:
            col.shutdown()
            scheme.shutdown()
    for w, vs in per_worker.items():  # each worker only moves forward
        assert vs == sorted(vs) and vs[-1] == newest, (w, vs)
    assert store.pull(MODEL).version == newest
    rows = {c.collector_id: c.version for m in ws.status(hub.addr, MODEL) for c in m.collectors}
    assert all(rows.get(f"ma-{i}") == newest for i in range(workers)), rows


def two_workers(scheme) -> MultiSyncCollector:
    """Two CartPole workers under the scheme, stamping versions."""
    return MultiSyncCollector([make_env, make_env], make_policy(), frames_per_batch=32, total_frames=-1,
                              auto_register_policy_transforms=False, track_policy_version=True,
                              weight_sync_schemes={"policy": scheme})


def test_scheme_failover_when_the_relay_is_killed(hub, store):
    """via="failover" in MultiSyncCollector workers fed by a real relay's
    segment: the relay SIGKILLed, the workers' next rollouts run versions
    from the upstream hub; the relay restarted, they return to its segment.
    The hub's lag table shows which way each worker's version came."""
    from relayproc import Relay

    relay = Relay(hub.binary, hub.addr, MODEL).start()
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, via="failover", relay=relay.listen, shm_path=relay.shm,
                                   collector_id="fo", strip_prefix=PREFIX, probe_every=0.2)
    assert [s.name for s in scheme.failover] == ["relay-shm", "relay", "upstream"]

    def lag():
        return {c.collector_id: (c.version, c.via) for m in ws.status(hub.addr, MODEL) for c in m.collectors}

    seen, rows = [], [[], []]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col = two_workers(scheme)
        it = iter(col)

        def until(cond, what, batches=300):
            for _ in range(batches):
                batch = next(it)
                seen.append(check_batch(batch))
                for w in range(2):  # each worker applies at its own rollout start
                    rows[w].append(check_batch(batch[w]))
                if cond():
                    return
            pytest.fail(f"{what}: after {batches} batches, seen {seen[-5:]}, lag {lag()}")

        try:
            until(lambda: seen[-1] == {1}, "v1")
            assert all(lag().get(f"fo-{i}") == (1, "shm") for i in range(2)), lag()

            relay.kill()
            for v in (2, 3):  # only the upstream can deliver these now
                store.push(MODEL, weights(v), version=v, expect=v - 1)
                until(lambda: seen[-1] == {v}, f"v{v} with the relay dead")
            assert all(lag().get(f"fo-{i}") == (3, "push") for i in range(2)), lag()

            # Back: the workers probe it at rollout starts and return. A
            # worker that switches back reports with its next version (a
            # version may still come from the upstream before its probe).
            # The bound is a time, not a count of versions: a worker probes
            # at most every probe_every seconds, and this loop pushes a
            # version as soon as both run the last one (every 20-40 ms), so
            # the 7 versions this allowed were one or two probe periods, and
            # a worker whose next probe came after the 7th missed them all
            # (docs/benchlog/2026-12-03-s18-relayflake.md).
            relay.start()
            v = 3
            deadline = time.monotonic() + 60
            while not all(lag().get(f"fo-{i}") == (v, "shm") for i in range(2)):
                assert time.monotonic() < deadline, f"the workers did not return to the relay's segment: {lag()}"
                v += 1
                store.push(MODEL, weights(v), version=v, expect=v - 1)
                until(lambda: seen[-1] == {v}, f"v{v} after the relay's restart")
        finally:
            col.shutdown()
            scheme.shutdown()
            relay.stop()
    for w, got in enumerate(rows):  # one version per worker's rollout, only moving forward
        assert all(len(g) == 1 for g in got), (w, got)
        flat = [g.pop() for g in got]
        assert flat == sorted(flat) and flat[-1] == v, (w, flat)


def test_scheme_given_only_the_cluster_finds_each_workers_relay_when_it_dials(rlhub_bin, tmp_path):
    """``cluster="etcd://…"`` and nothing else: the parent looks nothing up;
    each MultiSyncCollector worker asks etcd for the relay on its own host
    when it dials and probes. Started before any relay exists, the workers
    run from the primary, then go to a relay announced later, fall back to
    the primary when it is SIGKILLed, and find it again once it comes back
    on another port and segment."""
    import shutil

    from relayproc import Relay
    from etcdproc import Etcd
    from test_cluster_follow import CLUSTER

    from conftest import Hub
    from rlhub import _channel

    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")
    etcd = Etcd(tmp_path)
    target = _channel.etcd_target(etcd.url, CLUSTER)
    d = tmp_path / "p"
    d.mkdir()
    hub = Hub(rlhub_bin, d, extra=["--etcd", etcd.url, "--cluster", CLUSTER, "--lease-ttl", "1s", "--member-id", "p"])
    relay = Relay(rlhub_bin, None, MODEL, relay_id="relay-disc", etcd=(etcd.url, CLUSTER))
    col = scheme = None
    try:
        deadline = time.monotonic() + 30
        while etcd.leader(CLUSTER) is None:
            assert time.monotonic() < deadline, "no primary elected"
            time.sleep(0.05)
        store = rlhub.StoreClient(target, timeout=30.0)
        store.push(MODEL, weights(1), version=1, expect=0)
        scheme = RlhubWeightSyncScheme("", MODEL, via="failover", cluster=target, collector_id="disc",
                                       strip_prefix=PREFIX, probe_every=0.2)
        assert scheme.hub == target and scheme.discovers_relay and scheme.failover is None

        def lag():
            return {c.collector_id: (c.version, c.via) for m in ws.status(hub.addr, MODEL) for c in m.collectors}

        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            col = two_workers(scheme)
            it = iter(col)
            v = 1

            def until_via(via, what):
                # Bounded in time, not in versions: the workers probe (and
                # look the relay up) at most every probe_every seconds, and
                # a version is pushed as soon as both run the last one.
                nonlocal v
                deadline = time.monotonic() + 60
                while not all(lag().get(f"disc-{i}") == (v, via) for i in range(2)):
                    assert time.monotonic() < deadline, f"{what}: {lag()}"
                    v += 1
                    store.push(MODEL, weights(v), version=v, expect=v - 1)
                    for _ in range(300):
                        seen.append(check_batch(next(it)))
                        if seen[-1] == {v}:
                            break
                    else:
                        pytest.fail(f"{what}: v{v} never ran, seen {seen[-5:]}, lag {lag()}")

            for _ in range(300):
                seen.append(check_batch(next(it)))
                if seen[-1] == {1}:
                    break
            until_via("push", "no relay: the workers run from the primary")
            relay.start()  # announced in etcd after the workers opened their sources
            until_via("shm", "the relay announced later: the workers go to its segment")
            relay.kill()
            until_via("push", "the relay SIGKILLed: back to the primary")
            relay.move()
            relay.start()
            until_via("shm", "the relay back on another port and segment: found again")
        flat = [g.pop() for g in seen if len(g) == 1]
        assert flat == sorted(flat) and flat[-1] == v, flat
        store.close()
    finally:
        if col is not None:
            col.shutdown()
        if scheme is not None:
            scheme.shutdown()
        relay.stop()
        hub.stop()
        etcd.stop()


def test_scheme_failover_options_are_checked_and_pickle():
    import pickle

    from rlhub.torchrl import SourceSpec

    with pytest.raises(ValueError, match="needs a relay"):
        RlhubWeightSyncScheme("127.0.0.1:1", MODEL, via="failover")
    with pytest.raises(ValueError, match="via must be one of"):
        RlhubWeightSyncScheme("127.0.0.1:1", MODEL, via="failover", failover=[("a", "carrier-pigeon", "x")])
    with pytest.raises(ValueError, match="needs an address"):
        RlhubWeightSyncScheme("127.0.0.1:1", MODEL, via="failover", failover=[("a", "push", "")])
    with pytest.raises(ValueError, match="empty"):
        RlhubWeightSyncScheme("127.0.0.1:1", MODEL, via="failover", failover=[])
    s = RlhubWeightSyncScheme("127.0.0.1:1", MODEL, via="failover", failover=[("up", "store", "127.0.0.1:2")])
    assert pickle.loads(pickle.dumps(s)).failover == [SourceSpec("up", "store", "127.0.0.1:2")]


def test_scheme_sender_on_trainer(hub, store):
    """The scheme's sender alone, on a trainer with no collector."""
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, strip_prefix=PREFIX)
    policy = make_policy()
    scheme.init_on_sender(model_id="policy", model=policy)
    with torch.no_grad():
        policy[0].module[0].bias.fill_(7.0)
    assert scheme.push() == 2
    got = store.pull(MODEL, framework="torch")
    assert got.version == 2 and sorted(got.tensors) == ["0.bias", "0.weight"]
    assert torch.equal(got.tensors["0.bias"], torch.full((2,), 7.0))
    # A second trainer's push in between: compare-and-set refuses to overwrite.
    store.push(MODEL, weights(9), version=3, expect=2)
    with pytest.raises(rlhub.StaleVersion):
        scheme.push()
    scheme.shutdown()


def test_legacy_updater_collector(hub, store):
    up = RlhubWeightUpdater(source=ws.StoreSource(hub.addr, MODEL), hub=hub.addr, collector_id="legacy",
                            strip_prefix=PREFIX)
    assert isinstance(up, WeightUpdaterBase) and up.from_policy(make_policy()) is None
    env = make_stamped_env(up.version_transform())
    with pytest.warns(DeprecationWarning, match="WeightUpdaterBase is deprecated"):  # torchrl's own
        col = Collector(env, make_policy(env), frames_per_batch=16, total_frames=-1, auto_register_policy_transforms=False, weight_updater=up)
    col.init_updater()
    assert up.collector is col and up.collectors == [col]
    seen = []
    try:
        for i, batch in enumerate(col):
            if i == 0:  # before the first update: the policy's own (random) weights, stamp 0
                assert int(batch["next", "policy_version"].max()) == 0
            else:
                seen.append(check_batch(batch))
            if i == 6:
                break
            if i >= 1:
                v = max(seen[-1]) + 1
                store.push(MODEL, weights(v), version=v, expect=v - 1)
            col.update_policy_weights_()
            assert up.last_update and up.version == (1 if i == 0 else v)
    finally:
        col.shutdown()
        up.close()
    assert seen == [{1}, {2}, {3}, {4}, {5}, {6}]


def test_legacy_updater_multisync(hub, store):
    up = RlhubWeightUpdater(source=ws.StoreSource(hub.addr, MODEL), hub=hub.addr, collector_id="legacy-ms",
                            strip_prefix=PREFIX)
    envs = [functools.partial(make_stamped_env, up.version_transform()) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy API is deprecated in torchrl
        col = MultiSyncCollector(envs, make_policy(), frames_per_batch=32, total_frames=-1, auto_register_policy_transforms=False, weight_updater=up)
    seen = []
    try:
        col.update_policy_weights_()
        assert up.version == 1
        for i, batch in enumerate(col):
            assert batch["next", "policy_version"].shape[0] == 2
            seen.append(check_batch(batch))
            if i == 4:
                break
            v = max(seen[-1]) + 1
            store.push(MODEL, weights(v), version=v, expect=v - 1)
            col.update_policy_weights_()  # workers are idle between batches: applied whole
    finally:
        col.shutdown()
        up.close()
    assert seen == [{1}, {2}, {3}, {4}, {5}]


IMPORT_ORDER = textwrap.dedent("""
    import sys, warnings
    order = sys.argv[1]
    if order == "rlhub-first":
        import rlhub.wsync as ws
        up = ws.RlhubWeightUpdater(source=ws.StoreSource(sys.argv[2], "m"), hub=sys.argv[2])
        assert "torchrl" in sys.modules  # the updater is torchrl's own subclass: importing it imports torchrl
    import torchrl.collectors
    from torchrl.collectors import Collector, WeightUpdaterBase
    from torchrl.envs import GymEnv
    from tensordict.nn import TensorDictModule
    import torch
    if order == "torchrl-first":
        from rlhub import RlhubWeightUpdater
        import rlhub.wsync as ws
        up = RlhubWeightUpdater(source=ws.StoreSource(sys.argv[2], "m"), hub=sys.argv[2])
    assert isinstance(up, WeightUpdaterBase) and type(up).__mro__[1] is WeightUpdaterBase
    env = GymEnv("CartPole-v1")
    policy = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        col = Collector(env, policy, frames_per_batch=8, total_frames=8, auto_register_policy_transforms=False, weight_updater=up)
    assert col.weight_updater is up  # not called as a factory
    col.init_updater()
    assert up.collector is col
    col.shutdown()
    print("ok", order)
""")


@pytest.mark.parametrize("order", ["rlhub-first", "torchrl-first"])
def test_import_order(hub, order):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", IMPORT_ORDER, order, hub.addr], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and f"ok {order}" in r.stdout, r.stderr[-3000:]


def test_shared_counter_is_unlinked_without_close():
    """The version counter's /dev/shm file goes when its creator's counter
    is garbage, or its process exits, if nobody called close: a script
    that drops its weight updater without closing it (as the import-order
    check above does) left a file in /dev/shm per run."""
    import gc

    from rlhub.torchrl import SharedCounter

    c = SharedCounter()
    path = c.path
    assert os.path.exists(path)
    c.set(7)
    del c
    gc.collect()
    assert not os.path.exists(path)

    c = SharedCounter()
    c.close()
    c.close()  # twice: nothing more happens
    assert not os.path.exists(c.path)

    script = "from rlhub.torchrl import SharedCounter; c = SharedCounter(); c.set(3); print(c.path)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip().splitlines()[-1]
    assert path.startswith("/dev/shm/rlhub-torchrl-") and not os.path.exists(path)


def test_legacy_updater_multisync_on_two_policy_devices(hub, store):
    """Workers on two policy devices (cpu and cpu:0 stand for cpu and cuda
    here): torchrl keeps one shared weight TensorDict per device, and the
    updater writes each version into both (it failed on every update).
    Only what the updater controls is checked: torchrl's worker on the
    second device does not read its shared set."""
    up = RlhubWeightUpdater(source=ws.StoreSource(hub.addr, MODEL), hub=hub.addr, collector_id="legacy-2dev",
                            strip_prefix=PREFIX)
    envs = [functools.partial(make_stamped_env, up.version_transform()) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        col = MultiSyncCollector(envs, make_policy(), frames_per_batch=32, total_frames=-1,
                                 auto_register_policy_transforms=False, weight_updater=up,
                                 policy_device=["cpu", "cpu:0"], env_device="cpu", storing_device="cpu")
    try:
        assert len(col._policy_weights_dict) == 2, col._policy_weights_dict.keys()
        col.update_policy_weights_()
        assert up.version == 1 and up.last_update
        for dev, td in col._policy_weights_dict.items():  # what every worker's policy runs on
            assert torch.equal(td.flatten_keys(".")[PREFIX + "0.bias"].data, torch.tensor([1.0, -1.0])), dev
    finally:
        col.shutdown()
        up.close()


def test_scheme_pushes_again_after_a_stale_version(hub, store):
    """After another writer advanced the model, the scheme's push says
    StaleVersion once; a retry (with the trainer's new weights) must be
    able to publish the next version instead of failing forever."""
    scheme = RlhubWeightSyncScheme(hub.addr, MODEL, strip_prefix=PREFIX)
    policy = make_policy()
    scheme.init_on_sender(model_id="policy", model=policy)
    assert scheme.push() == 2
    store.push(MODEL, weights(9), version=3, expect=2)  # another trainer / the reducer
    with pytest.raises(rlhub.StaleVersion):
        scheme.push()
    try:
        assert scheme.push() == 4  # retried: the next version after the newest
    finally:
        scheme.shutdown()
    assert store.pull(MODEL).version == 4
