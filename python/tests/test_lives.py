"""Python followers follow a model deleted and pushed again at once
(docs/weight-sync.md, "Lives"), against the real binary: a store watch
(gRPC and the data plane), a StoreSource and a push stream under a
Receiver. Each follower runs the old model's v5; the model is deleted
(`rlhub model rm`) and pushed again from v1, and the follower must take
the new v1 at once instead of keeping v5 until the new model passes it."""

from __future__ import annotations

import time

import pytest
import torch

import rlhub
import rlhub.wsync as ws

MODEL = "pol"
WAIT = 15.0  # seconds a follower gets to take the new life's version


def linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def filled(value: float) -> dict:
    return {k: torch.full_like(t, value) for k, t in linear().state_dict().items()}


def push_old(store: rlhub.StoreClient) -> None:
    """The old model: v1..v5, v5 all 5.0."""
    for v in range(1, 6):
        store.push(MODEL, filled(float(v)), version=v)


def restart_model(hub, store: rlhub.StoreClient, value: float = 100.0) -> None:
    """Deletes the model and pushes it again at v1 (all ``value``)."""
    hub.run_cli("model", "rm", "--hub", hub.addr, "--name", MODEL)
    store.push(MODEL, filled(value), version=1, expect=0)


def all_equal(module: torch.nn.Module, value: float) -> bool:
    return all(bool((t == value).all()) for t in module.state_dict().values())


@pytest.mark.parametrize("transport", ["grpc", "auto"])
def test_a_pull_if_newer_takes_a_new_life_that_caught_up(hub, transport):
    """The new model already at the old one's version: its "not modified"
    answer names the new life (over the data plane too), so a pull given
    the old life takes it."""
    with rlhub.StoreClient(hub.addr, transport=transport, timeout=10) as store:
        push_old(store)
        old = store.pull(MODEL)
        assert old is not None and old.version == 5
        restart_model(hub, store)
        for v in range(2, 6):
            store.push(MODEL, filled(100.0 + v), version=v)
        got = store.pull(MODEL, if_newer_than=5, life=old.life)
        assert got is not None and (got.version, got.life != old.life) == (5, True)
        assert store.pull(MODEL, if_newer_than=5, life=got.life) is None
        if transport == "auto":
            assert store.stats["grpc"] == 0


@pytest.mark.parametrize("transport", ["grpc", "auto"])
def test_store_watch_follows_a_model_deleted_and_pushed_again(hub, transport):
    with rlhub.StoreClient(hub.addr, transport=transport, timeout=10) as store:
        push_old(store)
        it = store.watch(MODEL, after=0, framework="torch", timeout=WAIT)
        old = next(it)
        assert old.version == 5 and old.life != 0
        restart_model(hub, store)
        v = next(it)  # the new life's v1, though not newer than v5
        assert (v.version, v.life != old.life) == (1, True)
        assert all(bool((t == 100.0).all()) for t in v.tensors.values())
        store.push(MODEL, filled(101.0), version=2)
        v2 = next(it)  # within the new life versions grow
        assert (v2.version, v2.life) == (2, v.life)
        # A pull "if newer" given the life follows lives too: nothing new
        # within the life, the new life's newest for the old life's v5.
        assert store.pull(MODEL, if_newer_than=2, life=v2.life) is None
        got = store.pull(MODEL, if_newer_than=5, life=old.life)
        assert got is not None and (got.version, got.life) == (2, v.life)
        assert store.pull(MODEL, if_newer_than=5) is None  # without it: versions only grow
        it.close()
        if transport == "grpc":
            assert store.stats["bulk"] == 0
        else:
            assert store.stats["bulk"] >= 3 and store.stats["grpc"] == 0

        # Asked not to, a watch keeps the old rule: only newer versions.
        it = store.watch(MODEL, after=0, timeout=WAIT, follow_lives=False)
        assert next(it).version == 2
        restart_model(hub, store, 200.0)
        store.push(MODEL, filled(203.0), version=3)
        assert next(it).version == 3
        it.close()


def test_store_watch_into_follows_a_model_deleted_and_pushed_again(hub):
    module = linear()
    with rlhub.StoreClient(hub.addr, timeout=10) as store:
        push_old(store)
        it = store.watch_into(MODEL, module, timeout=WAIT)
        assert next(it) == 5 and all_equal(module, 5.0)
        restart_model(hub, store)
        assert next(it) == 1 and all_equal(module, 100.0)
        it.close()


def _sources(hub, via):
    if via == "store-grpc":
        return ws.StoreSource(rlhub.StoreClient(hub.addr, transport="grpc", timeout=10), MODEL)
    if via == "store":
        return ws.StoreSource(hub.addr, MODEL)
    if via == "push":
        return ws.PushSource(hub.addr, MODEL, collector_id="c-push")
    if via == "dataplane":
        return ws.DataPlaneSource(hub.addr, MODEL, collector_id="c-dp", fallback=False)
    # open_source("push"): a push stream under a FailoverSource (torchrl, Ray)
    from rlhub._sources import open_source
    return open_source("push", hub.addr, MODEL, collector_id="c-failover")


@pytest.mark.parametrize("via", ["store-grpc", "store", "push", "dataplane", "failover"])
@pytest.mark.parametrize("how", ["wait", "poll"])
def test_receiver_follows_a_model_deleted_and_pushed_again(hub, via, how):
    module = linear()
    with rlhub.StoreClient(hub.addr, timeout=10) as store:
        push_old(store)
        src = _sources(hub, via)
        with ws.Receiver(module, src, hub=hub.addr, collector_id="c1") as r:
            def step() -> bool:
                if how == "wait":
                    return r.wait(1.0)
                ok = r.poll()
                if not ok:
                    time.sleep(0.02)
                return ok

            deadline = time.monotonic() + WAIT
            while r.version != 5 and time.monotonic() < deadline:
                step()
            assert r.version == 5 and all_equal(module, 5.0)
            old_life = r.life
            assert old_life != 0
            # The same version again is still a no-op.
            assert not r.apply(ws.WeightVersion(MODEL, 5, 0, b"", "test", life=old_life))

            restart_model(hub, store)
            deadline = time.monotonic() + WAIT
            while r.version != 1 and time.monotonic() < deadline:
                step()
            assert r.version == 1, f"still on v{r.version} of the deleted model"
            assert all_equal(module, 100.0) and r.life not in (0, old_life)

            store.push(MODEL, filled(102.0), version=2)
            deadline = time.monotonic() + WAIT
            while r.version != 2 and time.monotonic() < deadline:
                step()
            assert r.version == 2 and all_equal(module, 102.0)


def test_receiver_asked_not_to_keeps_versions_only_growing(hub):
    """follow_lives=False: the old rule, on the push stream as on the store."""
    module = linear()
    with rlhub.StoreClient(hub.addr, timeout=10) as store:
        push_old(store)
        src = ws.PushSource(hub.addr, MODEL, collector_id="c-old", follow_lives=False)
        with ws.Receiver(module, src, follow_lives=False) as r:
            assert r.wait(WAIT) and r.version == 5
            restart_model(hub, store)
            store.push(MODEL, filled(106.0), version=2)
            assert not r.wait(1.0) and r.version == 5 and all_equal(module, 5.0)
            for v in range(3, 7):
                store.push(MODEL, filled(100.0 + v), version=v)
            deadline = time.monotonic() + WAIT
            while r.version != 6 and time.monotonic() < deadline:
                r.wait(1.0)
            assert r.version == 6 and all_equal(module, 106.0)


def test_data_plane_fallback_counts_no_skips_across_lives(rlhub_bin, tmp_path):
    """A DataPlaneSource on its fallback push stream (a hub without the
    store's data plane): the new life's v9 after the deleted model's v1
    skipped nothing, as the data plane's own count says."""
    from conftest import Hub

    hub = Hub(rlhub_bin, tmp_path, extra=["--no-store-data-plane"])
    try:
        module = linear()
        with rlhub.StoreClient(hub.addr, timeout=10) as store, \
                ws.Receiver(module, ws.DataPlaneSource(hub.addr, MODEL, collector_id="c-fb")) as r:
            store.push(MODEL, filled(1.0), version=1)
            assert r.wait(WAIT) and r.version == 1 and r.source.transport == "grpc"
            restart_model(hub, store)
            for v in range(2, 10):
                store.push(MODEL, filled(100.0 + v), version=v)
            deadline = time.monotonic() + WAIT
            while r.version != 9 and time.monotonic() < deadline:
                r.wait(1.0)
            assert r.version == 9 and all_equal(module, 109.0)
            assert r.source.stats["skipped"] == 0, r.source.stats
    finally:
        hub.stop()


@pytest.mark.parametrize("transport", ["grpc", "auto"])
def test_a_gradient_of_a_deleted_model_is_refused(hub, transport):
    """A gradient computed on the old model's v3, pushed once the model
    pushed again is registered and at v3 too, was applied to the new model.
    It names the life it was computed on (``push(life=)``): refused
    (StaleVersion, counted stale), the new model unchanged; a gradient of
    the new life is applied."""
    from rlhub.grads import GradClient

    sgd = {"kind": "sgd", "lr": 0.5}
    grad = filled(1.0)
    with rlhub.StoreClient(hub.addr, timeout=10) as store, GradClient(hub.addr, transport=transport) as g:
        store.push(MODEL, filled(1.0), version=1, expect=0)
        g.register(MODEL, optimizer=sgd)
        for v in (1, 2):
            g.push(MODEL, v, grad)
            got = next(store.watch(MODEL, after=v, timeout=WAIT))
            assert got.version == v + 1
        old = store.pull(MODEL)
        assert old is not None and old.version == 3 and old.life != 0

        hub.run_cli("model", "rm", "--hub", hub.addr, "--name", MODEL)
        for v in (1, 2, 3):
            store.push(MODEL, filled(100.0 + v), version=v, expect=v - 1)
        assert g.register(MODEL, optimizer=sgd).version == 3
        new = store.pull(MODEL)
        assert new is not None and new.version == 3 and new.life not in (0, old.life)

        before = g.stats()
        with pytest.raises(rlhub.StaleVersion) as e:
            g.push(MODEL, 3, grad, life=old.life)
        assert f'"{MODEL}"' in str(e.value) and "version 3" in str(e.value)
        after = g.stats()
        assert after.total.dropped.get("stale", 0) - before.total.dropped.get("stale", 0) == 1
        assert (after.total.applied, after.versions[MODEL]) == (before.total.applied, 3)
        now = store.pull(MODEL)
        assert now is not None and (now.version, now.life) == (3, new.life)
        assert all(bool((torch.as_tensor(t) == 103.0).all()) for t in now.tensors.values())

        g.push(MODEL, 3, grad, life=new.life)
        got = next(store.watch(MODEL, after=3, framework="torch", timeout=WAIT))
        assert got.version == 4 and all(bool((t == 102.5).all()) for t in got.tensors.values())
