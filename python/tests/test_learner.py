"""Python learners served by the real hub's aggregator: demand merge, Learn
split and info merge, failures, data-parallel gradients, re-attach."""

from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import pytest
import torch

import rlhub
from rlhub.aggregator import AggregatorClient
from rlhub.grads import GradClient
from rlhub.learner import Demand, LearnTask, Learner
from conftest import Hub


class RowLearner(Learner):
    """Reports which rows it got; fails on purpose when told to."""

    def __init__(self, addr: str, lid: str, demand: int, fields=None, fail_learn: bool = False, **kw):
        super().__init__(addr, lid, resources={"kind": "test", "id": lid}, **kw)
        self.demand, self.fields, self.fail_learn = demand, fields or {"obs_dim": 2}, fail_learn
        self.started: list = []

    def on_start(self, task_id, info):
        if info.get("refuse") == self.learner_id:
            raise ValueError("refusing on purpose")
        self.started.append((task_id, info))

    def on_demand(self, task_id):
        return Demand(self.demand, self.fields)

    def on_learn(self, task: LearnTask):
        if self.fail_learn:
            raise RuntimeError("learn failed on purpose")
        x = task.batch["x"]
        assert x.shape == (task.rows, 2)
        return {"rows": task.batch["row"].tolist(), "n": task.rows, "learner": self.learner_id,
                "x_sum": np.float32(x.sum()), "learner_step": int(task.metadata["step"]), "task_id": task.task_id}


def wait_attached(agg: AggregatorClient, n: int, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if len(agg.resources()) == n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{n} learners did not attach: {agg.resources()}")


def batch(n: int):
    return {"x": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "row": np.arange(n, dtype=np.int64)}


def test_demand_merge_split_and_info_merge_with_two_learners(hub):
    with AggregatorClient(hub.addr) as agg, RowLearner(hub.addr, "a", 3) as a, RowLearner(hub.addr, "b", 5) as b:
        wait_attached(agg, 2)
        assert {r.learner_id: dict(r.resources) for r in agg.resources()} == {
            "a": {"kind": "test", "id": "a"}, "b": {"kind": "test", "id": "b"}}
        st = agg.start("t1", {"lr": 0.5, "layers": [4, 4]})
        assert st.task_id == "t1" and sorted(st.learners) == ["a", "b"]
        assert a.started == b.started == [("t1", {"lr": 0.5, "layers": [4.0, 4.0]})]
        d = agg.get_data_demand("t1")
        assert d.demand.batch_size == 8 and d.demand.fields == {"obs_dim": 2.0}
        assert sorted(zip(d.learners, d.batch_sizes)) == [("a", 3), ("b", 5)]
        for step, rows in ((7, 8), (8, 16)):  # exact demand, then proportional
            res = agg.learn("t1", batch(rows), metadata={"step": str(step)})
            assert res.failed == []
            assert res.info["rows"] == list(range(rows))  # every row once, in row order
            assert res.info["learner_step"] == step and res.info["task_id"] == "t1"  # homogeneous: single
            order = [s.learner_id for s in res.shares]
            assert order == d.learners and res.info["learner"] == order
            sizes = {s.learner_id: s.rows for s in res.shares}
            assert sizes == ({"a": 3, "b": 5} if rows == 8 else {"a": 6, "b": 10})
            assert res.info["n"] == [sizes[i] for i in order]
            assert sum(res.info["x_sum"]) == pytest.approx(float(batch(rows)["x"].sum()))
        st = agg.status()
        assert st.learn_ok == 2 and {l.learner_id: l.tasks_done for l in st.learners} == {"a": 2, "b": 2}


def test_refusals_disagreement_and_failed_learn_are_named(hub):
    with AggregatorClient(hub.addr) as agg, RowLearner(hub.addr, "a", 4) as a, \
            RowLearner(hub.addr, "b", 4, fields={"obs_dim": 3}) as b:
        wait_attached(agg, 2)
        with pytest.raises(rlhub.Aborted, match='"b"'):
            agg.start("t0", {"refuse": "b"})
        agg.start("t1", {})
        with pytest.raises(rlhub.InvalidArgument, match="obs_dim"):
            agg.get_data_demand("t1")
        with pytest.raises(rlhub.StaleVersion):  # FailedPrecondition: no such task
            agg.get_data_demand("other")
        b.fields = {"obs_dim": 2}
        b.fail_learn = True
        agg.get_data_demand("t1")
        res = agg.learn("t1", batch(8), metadata={"step": "1"})
        # b's callback failed: its rows were re-split onto a, b stays attached.
        assert res.failed == ["b"] and res.info["rows"] == list(range(8))
        assert set(res.info["learner"]) == {"a"}
        assert len(agg.resources()) == 2
        with pytest.raises(rlhub.InvalidArgument):
            agg.learn("t1", {"x": np.zeros((4, 2), np.float32), "row": np.arange(3)}, metadata={"step": "2"})


@pytest.fixture
def hub_batch2(rlhub_bin, tmp_path):
    """A hub whose batches are exactly 2 gradients, however far apart they
    come (the default forwards a batch after 5 ms: two learners on a loaded
    machine then make two steps)."""
    h = Hub(rlhub_bin, tmp_path, extra=("--reduce-batch-size", "2", "--max-wait", "60s"))
    yield h
    h.stop()


def test_two_torch_learners_push_grads_and_the_step_is_the_full_batch_step(hub_batch2):
    """Data parallel: each learner pushes the gradient of its rows; with sum
    reduction the hub's SGD step equals torch's on the whole batch."""
    hub = hub_batch2
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 1)
    with rlhub.StoreClient(hub.addr) as s:
        s.push("lin", ref.state_dict(), version=1, expect=0)
    grads = GradClient(hub.addr)
    grads.register("lin", optimizer=torch.optim.SGD(ref.parameters(), lr=0.1), reduction="sum")

    def make(lid):
        store, gc, net = rlhub.StoreClient(hub.addr), GradClient(hub.addr, lid), torch.nn.Linear(3, 1)

        def on_learn(t: LearnTask):
            v = store.pull("lin", framework="torch")
            net.load_state_dict(v.tensors)
            net.zero_grad()
            loss = ((net(t.batch["x"]).squeeze(1) - t.batch["y"]) ** 2).sum()
            loss.backward()
            r = gc.push("lin", v.version, net)
            return {"loss": loss.item(), "version": v.version, "admitted_at": r.version}

        return Learner(hub.addr, lid, on_demand=lambda task: 6, on_learn=on_learn, framework="torch")

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 3, generator=g), torch.randn(12, generator=g)
    with AggregatorClient(hub.addr) as agg, make("p1"), make("p2"), rlhub.StoreClient(hub.addr) as s:
        wait_attached(agg, 2)
        task = agg.start().task_id
        agg.get_data_demand(task)
        res = agg.learn(task, {"x": x, "y": y})
        assert res.info["version"] == [1.0, 1.0] and len(res.shares) == 2
        for v in s.watch("lin", after=1, framework="torch", timeout=30):
            break
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        loss = ((ref(x).squeeze(1) - y) ** 2).sum()
        assert sum(res.info["loss"]) == pytest.approx(loss.item(), rel=1e-5)  # the shares tile the batch
        loss.backward()
        opt.step()
        assert v.version == 2
        for k, w in ref.state_dict().items():
            torch.testing.assert_close(v.tensors[k], w, rtol=1e-5, atol=1e-6)
        st = grads.stats()
        assert (st.total.pushed, st.total.applied, st.total.steps) == (2, 2, 1)
    grads.close()


def test_reattaches_after_a_hub_restart_and_threads_are_owned(rlhub_bin, tmp_path):
    h = Hub(rlhub_bin, tmp_path)
    lr = RowLearner(h.addr, "a", 2, backoff=0.05)
    lr.start()
    try:
        assert lr.attached.wait(20)
        h.stop()
        end = time.monotonic() + 20
        while lr.attached.is_set() and time.monotonic() < end:
            time.sleep(0.02)
        assert not lr.attached.is_set()
        # The same address again (a restarted hub).
        h2log = open(tmp_path / "hub2.log", "wb")
        p = subprocess.Popen([rlhub_bin, "serve", "--listen", h.addr, "--data", str(tmp_path / "data2")],
                             stdout=h2log, stderr=subprocess.STDOUT)
        try:
            with AggregatorClient(h.addr) as agg:
                assert lr.attached.wait(30)
                wait_attached(agg, 1)
                assert lr.sessions == 2
                agg.start("t", {})
                agg.get_data_demand("t")
                assert agg.learn("t", batch(4), metadata={"step": "0"}).info["rows"] == [0, 1, 2, 3]
        finally:
            lr.close()
            p.terminate()
            p.wait(20)
            h2log.close()
    finally:
        lr.close()
    names = [t.name for t in threading.enumerate()]
    assert not any(n.startswith(("rlhub-learner-", "rlhub-heartbeat-")) for n in names), names


_SLOW_LEARNER = r'''
import sys, time
from rlhub.learner import Learner

def on_learn(task):
    print("learn-begin", task.row_start, task.rows, flush=True)
    time.sleep(120)
    return {}

l = Learner(sys.argv[1], "k", on_demand=lambda t: (4, {"obs_dim": 2}), on_learn=on_learn)
l.start()
while not l.attached.is_set():
    time.sleep(0.01)
print("attached", flush=True)
time.sleep(600)
'''


def test_learner_process_killed_mid_learn_is_excluded_and_its_rows_resplit(hub):
    import os
    import signal
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    k = subprocess.Popen([sys.executable, "-c", _SLOW_LEARNER, hub.addr], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert k.stdout.readline().strip() == "attached"
        with AggregatorClient(hub.addr) as agg, RowLearner(hub.addr, "a", 4):
            wait_attached(agg, 2)
            agg.start("t", {})
            d = agg.get_data_demand("t")
            assert sorted(d.learners) == ["a", "k"] and d.demand.batch_size == 8
            out = {}
            th = threading.Thread(target=lambda: out.update(res=agg.learn("t", batch(8), metadata={"step": "1"})))
            th.start()
            assert k.stdout.readline().startswith("learn-begin")
            k.send_signal(signal.SIGKILL)
            th.join(60)
            assert not th.is_alive()
            res = out["res"]
            assert res.failed == ["k"]
            assert res.info["rows"] == list(range(8))  # k's rows were re-split onto a
            assert set(res.info["learner"]) == {"a"} and sum(s.rows for s in res.shares) == 8
            assert [r.learner_id for r in agg.resources()] == ["a"]
            assert agg.status().resplits == 1
    finally:
        if k.poll() is None:
            k.kill()
        k.wait()


def test_heartbeats_hold_the_lease_through_a_hook_longer_than_it(hub):
    """The hook outlasts the lease; the heartbeat thread keeps the learner."""
    slow = {"secs": 0.0}

    def on_learn(task: LearnTask):
        time.sleep(slow["secs"])
        return {"rows": task.rows}

    with AggregatorClient(hub.addr) as agg, Learner(hub.addr, "slow", on_demand=lambda t: 2, on_learn=on_learn) as lr:
        # The hub lists the learner before its Welcome reaches the learner's
        # thread, so wait for the learner's side of the attach as well.
        wait_attached(agg, 1)
        assert lr.attached.wait(20)
        assert 0 < lr.lease_ms <= 20_000, "a lease this long would make the test slow"
        # Past the lease plus the hub's check period (a quarter lease) and a margin.
        slow["secs"] = lr.lease_ms / 1000 * 1.25 + 1.5
        agg.start("t", {})
        agg.get_data_demand("t")
        res = agg.learn("t", batch(2), metadata={"step": "0"})
        assert res.failed == [] and res.info["rows"] == [2.0]
        st = agg.status()
        assert [l.learner_id for l in st.learners] == ["slow"] and st.removed_total == 0 and lr.sessions == 1


def test_a_permanent_refusal_is_not_retried(hub):
    """The hub refuses a learner id with an unprintable character
    (InvalidArgument): no re-attach can change it, so run() raises it and a
    started learner's thread ends, instead of retrying every backoff."""
    def learner():
        return Learner(hub.addr, "a\tb", on_demand=lambda t: 1, on_learn=lambda t: {}, backoff=0.05)

    with learner() as lr:  # served on its own thread
        lr._thread.join(60)
        assert not lr._thread.is_alive(), "the learner kept re-attaching after a permanent refusal"
        assert isinstance(lr.error, rlhub.InvalidArgument) and lr.sessions == 0
    lr = learner()
    try:
        with pytest.raises(rlhub.InvalidArgument, match="unprintable"):
            lr.run()
        assert lr.error is not None
    finally:
        lr.close()


def test_a_message_the_learner_does_not_know_is_retried():
    """A hub message the learner does not understand (a newer hub's new
    message, here an empty one) is not a refusal: the learner re-attaches
    after its backoff, as after a broken stream, instead of giving up."""
    from concurrent import futures

    import grpc

    from rlhub._proto.rlhub.v1 import aggregator_pb2, aggregator_pb2_grpc

    attaches = []

    class NewerHub(aggregator_pb2_grpc.LearnerAggregatorServicer):
        def Attach(self, request_iterator, context):  # noqa: N802 - gRPC's name
            next(request_iterator)
            attaches.append(1)
            yield aggregator_pb2.AggregatorMessage(welcome=aggregator_pb2.Welcome(lease_ms=10000))
            yield aggregator_pb2.AggregatorMessage()
            while context.is_active():
                time.sleep(0.01)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    aggregator_pb2_grpc.add_LearnerAggregatorServicer_to_server(NewerHub(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Learner(f"127.0.0.1:{port}", "l1", on_demand=lambda t: 1, on_learn=lambda t: {}, backoff=0.02) as lr:
            deadline = time.monotonic() + 30
            while len(attaches) < 3 and time.monotonic() < deadline:
                assert lr._thread.is_alive(), f"the learner gave up: {lr.error!r}"
                time.sleep(0.01)
            assert len(attaches) >= 3 and lr.error is None
    finally:
        server.stop(0)


def test_a_share_over_max_share_bytes_fails_that_share_and_keeps_the_learner(hub):
    """A share larger than the learner's max_share_bytes is refused like a
    hook's error: the learner reads past it, replies with an error naming
    the limit and stays attached, so every later Learn does not detach it
    again."""
    with AggregatorClient(hub.addr) as agg, RowLearner(hub.addr, "a", 4, max_share_bytes=256) as a, \
            RowLearner(hub.addr, "b", 4) as b:
        wait_attached(agg, 2)
        agg.start("t1", {})
        agg.get_data_demand("t1")
        for step in (1, 2):
            res = agg.learn("t1", batch(64), metadata={"step": str(step)})
            assert res.failed == ["a"] and res.info["rows"] == list(range(64))
        st = agg.status()
        assert a.sessions == 1 and st.removed_total == 0, f"a re-attached {a.sessions - 1} time(s)"
        assert {l.learner_id: l.tasks_failed for l in st.learners} == {"a": 2, "b": 0}
    assert "max_share_bytes" in (hub.data_dir / "hub.log").read_text()


class BigInfoLearner(RowLearner):
    """Replies with info over the hub's 4 MiB message bound on its first share."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.shares = 0

    def on_learn(self, task: LearnTask):
        info = super().on_learn(task)
        self.shares += 1
        if self.shares == 1:
            info["log"] = "x" * (5 << 20)  # under the learner's 8 MiB send limit, over the hub's 4 MiB
        return info


def test_a_reply_over_the_message_bound_fails_that_share_and_keeps_the_learner(hub):
    """Info over the hub's message bound fails that share alone, with an
    error naming the bound: the hub would refuse the message and end the
    learner's stream, failing the share as a lost learner and detaching it."""
    with AggregatorClient(hub.addr) as agg, BigInfoLearner(hub.addr, "a", 4) as a, \
            RowLearner(hub.addr, "b", 4) as b:
        wait_attached(agg, 2)
        agg.start("t1", {})
        agg.get_data_demand("t1")
        res = agg.learn("t1", batch(8), metadata={"step": "1"})
        assert res.failed == ["a"] and res.info["rows"] == list(range(8))  # b took a's rows too
        res = agg.learn("t1", batch(8), metadata={"step": "2"})  # a takes the next share
        assert res.failed == [] and res.info["rows"] == list(range(8))
        assert sorted(s.learner_id for s in res.shares) == ["a", "b"]  # in the order they answered
        st = agg.status()
        assert a.sessions == 1 and st.removed_total == 0, f"a re-attached {a.sessions - 1} time(s)"
        assert {l.learner_id: l.tasks_failed for l in st.learners} == {"a": 1, "b": 0}
    log = (hub.data_dir / "hub.log").read_text()
    assert "exceeds the hub's message bound of 4194304 bytes" in log and "x" * 1024 not in log
