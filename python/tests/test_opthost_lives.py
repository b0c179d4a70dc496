"""rlhub.OptimizerHost across a model's lives, against the real hub: the
checkpoint of a step of a model deleted while the host was stepping it is
refused, so the model pushed again never finds the deleted one's state."""

from __future__ import annotations

import threading

import pytest
import torch

import rlhub
from rlhub.grads import GradClient
from opthost_proc import make_net
from test_grads import fill_grads, setup_model


def test_checkpoint_of_a_step_of_a_deleted_model_is_refused(hub):
    """The host is in its optimizer's step (held by a pre-hook) when an
    administrator deletes the model (`rlhub model rm`); the step then ends
    and the host checkpoints it. The checkpoint landed: pol/host-state,
    deleted with its model, was created again with the deleted model's
    state at version 2, where the model pushed again found it (its own
    host's checkpoint there refused as stale, a host welcomed at 2 loading
    the deleted model's state). The host now names the step's life in the
    checkpoint, the hub refuses it, nothing is stored, and the host stops
    on its stream's ABORTED naming the delete."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    stepping, go = threading.Event(), threading.Event()

    def hold(*_):
        stepping.set()
        assert go.wait(60)

    opt.register_step_pre_hook(hold)
    h = rlhub.OptimizerHost(hub.addr, "pol", opt, module=net, backoff=0.05).start()
    try:
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
            assert h.attached.wait(60)
            learner = make_net(seed=99)
            fill_grads(learner, seed=0)
            g.push("pol", 1, learner)
            assert stepping.wait(60)
            hub.run_cli("model", "rm", "--hub", hub.addr, "--name", "pol")
            go.set()
            h._thread.join(30)
            assert not h._thread.is_alive(), "the host of the deleted model did not stop"
            assert isinstance(h.error, rlhub.Aborted) and "deleted" in str(h.error), h.error
            with pytest.raises(rlhub.NotFound):
                s.pull("pol/host-state")
    finally:
        go.set()
        h.close()
