"""The example's worker processes: PPO learners served by the hub's
aggregator (pushing gradients to the reducer) and collectors that sync
weights from the model store and step CartPole."""

from __future__ import annotations

import signal
import threading
from typing import Any, Dict, List

import numpy as np
import torch

import rlhub
from rlhub.grads import GradClient
from rlhub.learner import Demand, LearnTask, Learner

from ppo import ActorCritic, Hyper, Rollouts, ppo_loss

MODEL = "cartpole-ppo"  # the model's name on a hub the example starts itself


class PPOLearner(Learner):
    """Learns on its share of each batch: for every epoch and minibatch it
    computes the PPO gradient on the newest weights, pushes it to the
    reducer with that base version, and waits for the step it is part of."""

    def __init__(self, hub: str, learner_id: str, h: Hyper, seed: int, model: str = MODEL):
        super().__init__(hub, learner_id, resources={"role": "ppo-learner"}, framework="torch")
        self.h = h
        self.model = model
        self.net = ActorCritic(hidden=h.hidden)
        self.store = rlhub.StoreClient(hub)
        self.grads = GradClient(hub, learner_id)
        self.gen = torch.Generator().manual_seed(seed)
        self.version = 0
        self.pushed = 0

    def on_demand(self, task_id: str) -> Demand:
        return Demand(self.h.envs_per_collector * self.h.steps, {"obs_dim": 4})

    def _load(self, v: rlhub.ModelVersion) -> None:
        self.net.load_state_dict(v.tensors)
        self.version = v.version

    def _sync_newest(self) -> None:
        v = self.store.pull(self.model, if_newer_than=self.version, framework="torch")
        if v is not None:
            self._load(v)

    def _wait_newer(self, than: int) -> None:
        """Blocks until the store holds a version newer than ``than`` (the
        step our gradient went into) and loads it."""
        self._sync_newest()
        if self.version > than:
            return
        for v in self.store.watch(self.model, after=than, framework="torch", timeout=60):
            self._load(v)
            return
        raise rlhub.Unavailable(f"no version after {than} within 60s")

    def on_learn(self, task: LearnTask) -> Dict[str, Any]:
        h, data = self.h, task.batch
        n = task.rows
        mbs = n // h.minibatches
        self._sync_newest()
        stats: Dict[str, List[float]] = {}
        for _ in range(h.epochs):
            perm = torch.randperm(n, generator=self.gen)
            for m in range(h.minibatches):
                idx = perm[m * mbs:(m + 1) * mbs]
                base = self.version
                self.net.zero_grad()
                loss, info = ppo_loss(self.net, {k: v[idx] for k, v in data.items()}, h)
                loss.backward()
                self.grads.push(self.model, base, self.net)
                self.pushed += 1
                for k, x in info.items():
                    stats.setdefault(k, []).append(x)
                self._wait_newer(base)
        out: Dict[str, Any] = {k: float(np.mean(v)) for k, v in stats.items()}
        out.update(grads_pushed=self.pushed, version=self.version,
                   learner_step=int(task.metadata.get("step", "0")), task_id=task.task_id)
        return out


def learner_main(hub: str, learner_id: str, h: Hyper, seed: int, model: str = MODEL) -> None:
    """Entry point of a learner process; SIGTERM stops it cleanly."""
    torch.set_num_threads(1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lr = PPOLearner(hub, learner_id, h, seed, model)
    lr.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        lr.close()
        lr.grads.close()
        lr.store.close()


def collector_main(conn, hub: str, h: Hyper, seed: int, collector_id: str, sync: str = "pull",
                   model: str = MODEL) -> None:
    """Entry point of a collector process. For each request (the minimum
    model version to run) it brings its policy up to date with an
    ``rlhub.wsync.Receiver`` — over the store (``sync="pull"``: pull if
    newer, then watch) or the hub's push fan-out (``sync="push"``) — which
    applies only newer versions, in place, and reports the version run so
    the lag shows on the hub. Then it collects a rollout and sends it back
    with the episodes that finished and the version it ran."""
    import rlhub.wsync as ws

    torch.set_num_threads(1)
    net = ActorCritic(hidden=h.hidden)
    roll = Rollouts(h.envs_per_collector, seed)
    gen = torch.Generator().manual_seed(seed)
    src = ws.StoreSource(hub, model) if sync == "pull" else ws.PushSource(hub, model, collector_id=collector_id)
    with ws.Receiver(net, src, collector_id=collector_id, hub=hub) as r:
        while True:
            want = conn.recv()
            if want is None:
                break
            r.poll()
            while r.version < want:
                if not r.wait(timeout=60):
                    raise RuntimeError(f"version {want} never arrived (have {r.version})")
            data = roll.collect(net, h, gen)
            conn.send((data, roll.take_finished(), r.version))
    conn.close()
