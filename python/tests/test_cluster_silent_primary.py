"""A cluster's primary goes silent — SIGSTOPped, as a hub whose machine
hangs: the kernel still accepts connections, nothing answers, and the
clients' gRPC connection to it stays READY — and a standby is elected in
its place. A client that learned the old primary (over gRPC: no idle
data-plane connection) and then calls on the data plane gets no answer to
its handshake there (``_bulk.NoAnswer``); it looks the primary up again
and the next try goes to the new one, instead of trying the silent hub
again and ending ``Unavailable`` "not tried again" (a pull; a push went to
gRPC on the still-READY channel and waited out its timeout; a gradient
push listed the secondaries there and waited out its timeout). Given
``etcd://`` the election watch already moved the client. One real etcd and
three real `rlhub serve --etcd` processes per test.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

import rlhub
from rlhub import _bulk, _channel
from rlhub.grads import GradClient
from etcdproc import sigstop, start_cluster, stop_cluster, wait_leader

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")


def _seed(addr: str, w, version: int) -> None:
    """Pushes ``version`` to the hub at ``addr`` once it takes pushes as the
    primary (it may already hold it, replicated)."""
    with rlhub.StoreClient(addr, timeout=5.0, retries=0) as direct:
        deadline = time.monotonic() + 30
        while True:
            try:
                direct.push("m", w, version=version)
                return
            except rlhub.RlhubError as e:
                if "not newer" in str(e):
                    return
                if not isinstance(e, rlhub.Unavailable):  # a standby's refusal, or becoming the primary
                    raise
            assert time.monotonic() < deadline, "the new primary did not take a push within 30 s"
            time.sleep(0.05)


def _model_on(addr: str) -> int:
    """The version of "m" the hub at ``addr`` serves once it serves as
    the primary (replicated from the old one)."""
    with rlhub.StoreClient(addr, timeout=5.0, retries=0) as direct:
        deadline = time.monotonic() + 30
        while True:
            try:
                return direct.pull("m").version
            except rlhub.RlhubError as e:
                if not isinstance(e, (rlhub.Unavailable, rlhub.NotFound)):
                    raise
            assert time.monotonic() < deadline, "the new primary did not serve m within 30 s"
            time.sleep(0.05)


def _silence_the_primary(etcd, hubs, cluster, client_channel):
    """SIGSTOPs the primary the client follows; returns the new one's id
    once elected (the client still follows the old one, unless by etcd)."""
    old, epoch = wait_leader(etcd, cluster)
    assert client_channel.primary() == (hubs[old].addr, epoch)
    sigstop(hubs[old].proc)
    new, _ = wait_leader(etcd, cluster, other_than=old, after=epoch)
    return old, new


@pytest.mark.parametrize("target,op", [("hubs", "pull"), ("hubs", "push"), ("etcd", "pull")])
def test_store_client_moves_to_the_new_primary_after_a_silent_ones_no_answer(rlhub_bin, tmp_path, monkeypatch,
                                                                            target, op):
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 2.0)  # the bound of each silent handshake (10 s)
    cluster = "pysilent" + op
    etcd, hubs = start_cluster(rlhub_bin, tmp_path, cluster)
    addr = ",".join(h.addr for h in hubs.values()) if target == "hubs" else _channel.etcd_target(etcd.url, cluster)
    w = {"w": np.arange(4, dtype=np.float32)}
    try:
        wait_leader(etcd, cluster)
        with rlhub.StoreClient(addr, timeout=15.0, retries=4) as store:
            store.list()  # learns the primary, over gRPC
            old, new = _silence_the_primary(etcd, hubs, cluster, store._channel)
            _seed(hubs[new].addr, w, 7)
            if op == "pull":
                v = store.pull("m")
                assert v.version == 7
                assert store.stats["bulk"] == 1, store.stats  # on the data plane
            else:
                store.push("m", w, version=8)
                assert store.stats["push_bulk"] == 1, store.stats
                with rlhub.StoreClient(hubs[new].addr, timeout=5.0) as direct:
                    assert direct.pull("m").version == 8
            assert store._channel.primary()[0] == hubs[new].addr
    finally:
        stop_cluster(etcd, hubs)


def test_grad_client_moves_to_the_new_primary_after_a_silent_ones_no_answer(rlhub_bin, tmp_path, monkeypatch):
    """The primary is its own only secondary, listed over gRPC; the
    gradient push's handshake there gets no answer. The push looks the primary up again before
    listing the secondaries, and pushes to the new primary within its
    ``deadline`` (12 s: a 2 s handshake, a 3 s lookup; less than the 30 s
    ``timeout`` a listing on the silent primary's READY channel waited
    out)."""
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 2.0)
    cluster = "pysilentgrads"
    etcd, hubs = start_cluster(rlhub_bin, tmp_path, cluster, ("--reduce-batch-size", "1"))
    listed = ",".join(h.addr for h in hubs.values())
    w = {"w": np.zeros(4, dtype=np.float32)}
    try:
        old, _ = wait_leader(etcd, cluster)
        _seed(hubs[old].addr, w, 1)
        with GradClient(listed, "py", timeout=30.0, deadline=12.0, refresh_every=0) as g:
            g.register("m", {"kind": "sgd", "lr": 1.0}, reduction="sum")
            assert [a for a, _ in g.secondaries()] == [hubs[old].addr]  # over gRPC: no data-plane connection
            hub = g._channel(listed)
            assert isinstance(hub, _channel.FollowingChannel)
            old, new = _silence_the_primary(etcd, hubs, cluster, hub)
            base = _model_on(hubs[new].addr)
            with GradClient(hubs[new].addr, "op", timeout=20.0) as op:
                op.register("m", {"kind": "sgd", "lr": 1.0}, reduction="sum")  # replicated: a no-op
            r = g.push("m", base, {"w": np.ones(4, np.float32)})
            assert r.addr == hubs[new].addr and not r.duplicate, r
            assert g.unknown() == 0
    finally:
        stop_cluster(etcd, hubs)
