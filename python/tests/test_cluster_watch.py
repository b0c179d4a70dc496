"""Python clients given ``etcd://`` watch the election (issue 15, the
client half; the Go seam's follower does the same): a call in flight on a
primary that stops answering — SIGSTOPped here, as a machine cut off by a
partition is: its connections stay open and silent — ends when a standby is
elected instead of at its own deadline. A read is sent again to the new
primary; a write is raised as ``Unavailable`` naming the move (its outcome
is unknown). Without the watch each call below would wait out its 60 s
timeout and fail.

One real etcd and three real `rlhub serve --etcd` processes.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import signal
import threading
import time
from typing import Iterator

import numpy as np
import pytest

import rlhub
from rlhub import _channel
from rlhub.grads import GradClient, OutcomeUnknown
from rlhub.wsync import DataPlaneSource
from conftest import Hub
from etcdproc import Etcd, sigstop, start_cluster

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")

CLUSTER = "pywatch"


def _live_leader(etcd: Etcd, hubs: dict[str, Hub], stopped: set[str]) -> tuple[str, int]:
    deadline = time.monotonic() + 30
    while True:
        lead = etcd.leader(CLUSTER)
        if lead is not None and lead[0] not in stopped and hubs[lead[0]].proc.poll() is None:
            return lead
        assert time.monotonic() < deadline, "no live primary elected within 30 s"
        time.sleep(0.05)


@contextlib.contextmanager
def _cluster(rlhub_bin: str, tmp_path: pathlib.Path) -> Iterator[tuple[Etcd, dict[str, Hub]]]:
    """One etcd and three hubs (1 s lease); every hub SIGKILLed at the end
    (stopped ones too)."""
    etcd, hubs = start_cluster(rlhub_bin, tmp_path, CLUSTER)
    try:
        yield etcd, hubs
    finally:
        for h in hubs.values():
            h.proc.send_signal(signal.SIGKILL)
            h.stop()
        etcd.stop()


def test_calls_in_flight_on_a_stopped_primary_follow_the_election(rlhub_bin, tmp_path):
    stopped: set[str] = set()
    with _cluster(rlhub_bin, tmp_path) as (etcd, hubs):
        target = _channel.etcd_target(etcd.url, CLUSTER)
        store = rlhub.StoreClient(target, timeout=60.0, retries=0)
        grads = GradClient(target, "py", timeout=60.0)
        fc = store._channel
        assert isinstance(fc, _channel.FollowingChannel)
        try:
            pid, epoch = _live_leader(etcd, hubs, stopped)
            store.push("m", {"w": np.array([1.0, -1.0], dtype=np.float32)}, version=1, expect=0)
            grads.register("m", {"kind": "sgd", "lr": 0.5})
            assert fc.primary() == (hubs[pid].addr, epoch)
            old_channel = fc._ch

            # A read in flight on the stopped primary is sent again to the
            # standby elected in its place, which has the model (acks all).
            sigstop(hubs[pid].proc)
            stopped.add(pid)
            names = [m.name for m in store.list()]
            assert names == ["m"]
            new = fc.primary()
            assert new is not None and new[1] > epoch and new[0] != hubs[pid].addr
            assert fc.moved(old_channel) is not None
            pid2, epoch2 = _live_leader(etcd, hubs, stopped)
            assert new == (hubs[pid2].addr, epoch2)

            # A write in flight there is given up with the move named, not
            # left to its deadline; the remaining standby is elected. (A
            # publish through the second primary first, acknowledged by
            # every standby: the third must serve it after the takeover.)
            store.push("m2", {"w": np.array([2.0, -2.0], dtype=np.float32)}, version=1, expect=0)
            grads.stats()  # the gradient client's connection to the new primary is up
            assert grads._channel(grads.hub_addr).primary() == new
            sigstop(hubs[pid2].proc)
            stopped.add(pid2)
            with pytest.raises(rlhub.Unavailable) as ei:
                grads.register("m", {"kind": "sgd", "lr": 0.5})
            msg = str(ei.value)
            assert f"moved from {hubs[pid2].addr} (epoch {epoch2})" in msg and "outcome is unknown" in msg, msg
            pid3, epoch3 = _live_leader(etcd, hubs, stopped)
            # The register may or may not have reached the stopped hub; sent
            # again, it is a no-op on the new primary (same config).
            got = grads.register("m", {"kind": "sgd", "lr": 0.5})
            assert got.version == 1
            assert sorted(m.name for m in store.list()) == ["m", "m2"]
            assert fc.primary() == (hubs[pid3].addr, epoch3)
        finally:
            store.close()
            grads.close()
        # The channel's watcher is stopped and waited for by close.
        assert fc._watcher_thread is not None and not fc._watcher_thread.is_alive()


def test_data_plane_requests_in_flight_end_when_the_primary_moves(rlhub_bin, tmp_path):
    """The data plane (plain TCP, not gRPC) too: a pull in flight on the
    stopped primary ends and is retried on the new one; a gradient push in
    flight there is given up as OutcomeUnknown (at most once: never resent
    to the new primary)."""
    stopped: set[str] = set()
    with _cluster(rlhub_bin, tmp_path) as (etcd, hubs):
        target = _channel.etcd_target(etcd.url, CLUSTER)
        with rlhub.StoreClient(target, timeout=60.0, retries=4) as store, \
                GradClient(target, "py2", timeout=60.0, deadline=60.0) as grads:
            pid, epoch = _live_leader(etcd, hubs, stopped)
            store.push("m", {"w": np.array([1.0, -1.0], dtype=np.float32)}, version=1, expect=0)
            grads.register("m", {"kind": "sgd", "lr": 0.5})
            g = {"w": np.array([1.0, 1.0], dtype=np.float32)}
            grads.push("m", 1, g)  # each client now holds a data-plane connection to the primary
            assert store.pull("m").version >= 1
            assert store.stats["bulk"] >= 1 and grads.transport_stats()["bulk"] == 1

            sigstop(hubs[pid].proc)
            stopped.add(pid)
            v = store.pull("m")
            assert v.version >= 1 and v.epoch == epoch
            new = store._channel.primary()
            assert new is not None and new[1] > epoch and new[0] != hubs[pid].addr

            store.push("m2", {"w": np.array([2.0, -2.0], dtype=np.float32)}, version=1, expect=0)  # s2 follows
            pid2, epoch2 = _live_leader(etcd, hubs, stopped)
            assert new == (hubs[pid2].addr, epoch2)
            grads.push("m", v.version, g)  # a connection to the new primary
            sigstop(hubs[pid2].proc)
            stopped.add(pid2)
            with pytest.raises(OutcomeUnknown) as ei:
                grads.push("m", v.version, g)
            assert "outcome is unknown" in str(ei.value) and "primary moved" in str(ei.value), ei.value
            assert grads.unknown() == 1


def test_a_hub_list_target_starts_no_watcher(hub):
    with rlhub.StoreClient(hub.addr + "," + hub.addr, timeout=10.0) as store:
        fc = store._channel
        assert isinstance(fc, _channel.FollowingChannel)
        assert fc._watcher_thread is None
        store.list()


def test_a_collectors_poll_held_by_a_stopped_primary_moves_to_the_new_one(rlhub_bin, tmp_path):
    """A weight-sync collector on the data plane long-polls the primary (up
    to 5 s, plus 10 s of socket slack): held by a stopped primary, its poll
    would end only after 15 s, past this wait's 12 s. Ended by the move, it
    polls the new primary, which publishes version 2."""
    stopped: set[str] = set()
    with _cluster(rlhub_bin, tmp_path) as (etcd, hubs):
        target = _channel.etcd_target(etcd.url, CLUSTER)
        with rlhub.StoreClient(target, timeout=60.0) as store, DataPlaneSource(target, "m") as src:
            pid, epoch = _live_leader(etcd, hubs, stopped)
            store.push("m", {"w": np.array([1.0, -1.0], dtype=np.float32)}, version=1, expect=0)
            got = src.wait_newer(0, timeout=30)
            assert got is not None and (got.version, got.epoch) == (1, epoch)

            def publish_on_the_new_primary() -> None:
                _live_leader(etcd, hubs, stopped)
                store.push("m", {"w": np.array([2.0, -2.0], dtype=np.float32)}, version=2, expect=1)

            sigstop(hubs[pid].proc)
            stopped.add(pid)
            t = threading.Thread(target=publish_on_the_new_primary)
            t.start()
            try:
                got = src.wait_newer(1, timeout=12)
            finally:
                t.join()
            assert got is not None and got.version == 2 and got.epoch > epoch, got
