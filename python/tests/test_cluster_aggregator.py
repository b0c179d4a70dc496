"""The learner aggregator's task follows the cluster's primary (issue 15).

One real etcd and three real `rlhub serve --etcd` processes. Two Python
learners and a coordinator, all given ``etcd://``, run a task; the primary
is SIGKILLed twice. Each time the learners attach to the new primary by
themselves and are started on the same task (its id and info were
replicated with the hub's data), and the coordinator's next ``learn``
splits by the recorded demand without a new ``start``.
"""

from __future__ import annotations

import shutil
import signal
import time

import numpy as np
import pytest

import rlhub
from rlhub import _channel
from rlhub.aggregator import AggregatorClient
from etcdproc import sigstop, start_cluster, stop_cluster
from test_learner import RowLearner, batch

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")

CLUSTER = "pyagg"


def live_primary(etcd, hubs, after: int) -> tuple[str, int]:
    return live_primary_of(etcd, CLUSTER, hubs, after)


def live_primary_of(etcd, cluster: str, hubs, after: int) -> tuple[str, int]:
    """(member id, epoch) of a primary elected after epoch ``after`` whose
    process is alive."""
    deadline = time.monotonic() + 30
    while True:
        lead = etcd.leader(cluster)
        if lead is not None and lead[1] > after and hubs[lead[0]].proc.poll() is None:
            return lead
        assert time.monotonic() < deadline, f"no live primary after epoch {after} within 30 s"
        time.sleep(0.05)


def started_on(direct: AggregatorClient, task: str) -> list[str]:
    """The learners that the hub ``direct`` names started on ``task``; none
    while it still answers with a standby's refusal. Its election key is in
    etcd before it has opened the hub on its copy, and until then it
    refuses every call naming the primary it followed (seen under load: a
    status() 25 ms after the election, refused naming the stopped hub)."""
    try:
        st = direct.status()
    except rlhub.Unavailable as e:
        if _channel.refusal(str(e)) is None:
            raise
        return []
    return sorted(l.learner_id for l in st.learners if l.started_task == task)


def test_aggregator_task_survives_two_primary_kills(rlhub_bin, tmp_path):
    etcd, hubs = start_cluster(rlhub_bin, tmp_path, CLUSTER)
    target = _channel.etcd_target(etcd.url, CLUSTER)
    try:
        with AggregatorClient(target, timeout=60.0) as agg, \
                RowLearner(target, "a", 3) as a, RowLearner(target, "b", 5) as b:
            epoch = live_primary(etcd, hubs, 0)[1]
            deadline = time.monotonic() + 30
            while len(agg.resources()) < 2:
                assert time.monotonic() < deadline, "learners did not attach"
                time.sleep(0.05)
            info = {"lr": 0.5, "round": "one"}
            assert agg.start("t1", info).task_id == "t1"
            d = agg.get_data_demand("t1")
            assert sorted(zip(d.learners, d.batch_sizes)) == [("a", 3), ("b", 5)]
            for rnd in range(3):
                # The learners attach to the new primary by themselves,
                # and it starts them on the task it has from the old one.
                deadline = time.monotonic() + 60
                while sorted(l.learner_id for l in agg.status().learners if l.started_task == "t1") != ["a", "b"]:
                    assert time.monotonic() < deadline, f"round {rnd}: learners not started on t1 within 60 s"
                    time.sleep(0.05)
                # The demand recorded before the kills splits 16 rows 6:10.
                res = agg.learn("t1", batch(16), metadata={"step": str(rnd)})
                assert res.failed == []
                assert res.info["rows"] == list(range(16))
                assert {s.learner_id: s.rows for s in res.shares} == {"a": 6, "b": 10}, (rnd, res.shares)
                assert res.info["task_id"] == "t1" and res.info["learner_step"] == rnd
                # Every start a learner saw, across the hubs, was this task.
                assert {t for t, _ in a.started} == {t for t, _ in b.started} == {"t1"}
                assert all(i == {"lr": 0.5, "round": "one"} for _, i in a.started + b.started)
                if rnd < 2:
                    pid, epoch = live_primary(etcd, hubs, epoch - 1)
                    hubs[pid].proc.send_signal(signal.SIGKILL)
                    hubs[pid].proc.wait()
                    epoch = live_primary(etcd, hubs, epoch)[1]
            # Each learner was started again by each new primary.
            assert len(a.started) >= 3 and len(b.started) >= 3, (a.started, b.started)
    finally:
        for h in hubs.values():
            h.stop()
        etcd.stop()


def test_learn_refused_by_a_deposed_primary_is_sent_to_the_new_one(rlhub_bin, tmp_path):
    """A coordinator given the hub list holds a connection to the primary;
    that primary is SIGSTOPped until a standby takes over, then SIGCONTed
    and deposed. The coordinator's next call is a ``learn``: the deposed
    hub refuses it (nothing applied) and the client sends it to the new
    primary, where the learners already run the replicated task."""
    etcd, hubs = start_cluster(rlhub_bin, tmp_path, CLUSTER + "2")
    target = _channel.etcd_target(etcd.url, CLUSTER + "2")
    listed = ",".join(h.addr for h in hubs.values())
    try:
        with AggregatorClient(listed, timeout=60.0) as agg, \
                RowLearner(target, "a", 3) as a, RowLearner(target, "b", 5) as b:
            old, epoch = live_primary_of(etcd, CLUSTER + "2", hubs, 0)
            deadline = time.monotonic() + 30
            while len(agg.resources()) < 2:
                assert time.monotonic() < deadline, "learners did not attach"
                time.sleep(0.05)
            agg.start("t1", {"lr": 0.5})
            agg.get_data_demand("t1")
            assert agg._channel.primary() == (hubs[old].addr, epoch)
            sigstop(hubs[old].proc)
            new, _ = live_primary_of(etcd, CLUSTER + "2", hubs, epoch)
            with AggregatorClient(hubs[new].addr, timeout=10.0) as direct:
                deadline = time.monotonic() + 30
                while started_on(direct, "t1") != ["a", "b"]:
                    assert time.monotonic() < deadline, "the learners were not started on t1 by the new primary"
                    time.sleep(0.05)
            hubs[old].proc.send_signal(signal.SIGCONT)
            with rlhub.StoreClient(hubs[old].addr, timeout=5.0, retries=0) as direct_old:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        direct_old.list()
                    except rlhub.Unavailable as e:
                        if _channel.refusal(str(e)) is not None:
                            break
                    assert time.monotonic() < deadline, "the SIGCONTed primary did not step down within 30 s"
                    time.sleep(0.05)
            # The coordinator's channel still holds the deposed hub.
            assert agg._channel.primary() == (hubs[old].addr, epoch)
            res = agg.learn("t1", batch(8), metadata={"step": "1"})
            assert {s.learner_id: s.rows for s in res.shares} == {"a": 3, "b": 5}
            assert res.info["rows"] == list(range(8))
            assert agg._channel.primary()[0] == hubs[new].addr
    finally:
        stop_cluster(etcd, hubs)
