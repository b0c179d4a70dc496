"""A Python learner re-attaches by itself to a hub process that was SIGKILLed
and restarted on its --data; the learn task in flight at the kill fails with a
clear error (never a hang) and the coordinator's retry succeeds."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from rlhub import errors
from rlhub.aggregator import AggregatorClient
from rlhub.learner import Demand, LearnTask, Learner
from conftest import free_port
from test_grads_restart import eventually, kill, serve, wait_ready


class HeldLearner(Learner):
    """Holds its first share until released."""

    def __init__(self, addr: str):
        super().__init__(addr, "held", backoff=0.05)
        self.reached = threading.Event()
        self.release = threading.Event()

    def on_demand(self, task_id):
        return Demand(4, {})

    def on_learn(self, task: LearnTask):
        self.reached.set()
        self.release.wait(60)
        return {"n": task.rows}


def test_learner_reattaches_and_task_is_retried_after_hub_kill(rlhub_bin, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    args = ("--listen", addr, "--data", str(tmp_path / "data"))
    hub = serve(rlhub_bin, tmp_path / "hub.log", *args)
    try:
        wait_ready(addr)
        batch = {"x": np.zeros((4, 2), dtype=np.float32)}
        with HeldLearner(addr) as lrn, AggregatorClient(addr, timeout=60) as agg:
            eventually(lambda: len(agg.resources()) == 1, "the learner to attach")
            agg.start("t")
            out: queue.Queue = queue.Queue()
            t = threading.Thread(target=lambda: out.put(_try(lambda: agg.learn("t", batch))))
            t.start()
            assert lrn.reached.wait(30), "the task never reached the learner"
            kill(hub)
            res = out.get(timeout=30)  # bounded: never a hang
            assert isinstance(res, errors.Unavailable), res
            lrn.release.set()
            t.join(30)

            hub = serve(rlhub_bin, tmp_path / "hub.log", *args)
            wait_ready(addr)
            eventually(lambda: len(_try(agg.resources) or []) == 1, "the learner to re-attach by itself")
            eventually(lambda: not isinstance(_try(lambda: agg.start("t")), Exception), "the retried task to start")
            assert agg.learn("t", batch).info["n"] == [4]
    finally:
        kill(hub)


def _try(fn):
    try:
        return fn()
    except errors.RlhubError as e:
        return e
