"""A relay's segment names its life (docs/shm-layout.md, "Lives")."""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest
import torch

import rlhub
from rlhub import wsync as ws


@pytest.fixture
def shm_path():
    p = f"/dev/shm/rlhub-pytest-lives-{os.getpid()}-{time.monotonic_ns()}"
    yield p
    if os.path.exists(p):
        os.unlink(p)


def test_shm_source_follows_a_model_deleted_and_pushed_again(hub, shm_path):
    """hub → `rlhub relay` → shared memory → ShmSource. The model is
    deleted (`rlhub model rm`) and pushed again from version 1: the relay
    starts a new segment of the new life, the source reopens it, and asked
    with the life it runs it returns the new model's v1 at once; asked
    without one it keeps the older rule (nothing past v5 yet)."""
    from conftest import free_port

    w = lambda x: {"w": np.full(8, x, np.float32)}  # noqa: E731
    with rlhub.StoreClient(hub.addr) as store:
        for v in range(1, 6):
            store.push("pol", w(float(v)), version=v)
        relay = subprocess.Popen([hub.binary, "relay", "--upstream", hub.addr, "--model", "pol", "--id", "relay-lives",
                                  "--listen", f"127.0.0.1:{free_port()}", "--shm", shm_path],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(shm_path):  # the relay creates the segment on its first version
                assert time.monotonic() < deadline, "the relay made no segment"
                time.sleep(0.05)
            src = ws.ShmSource(shm_path, model="pol")
            wv = src.wait_newer(0, timeout=30)
            assert wv is not None and wv.version == 5
            old = src.life
            assert old != 0, "the relay's segment names no life"
            subprocess.run([hub.binary, "model", "rm", "--hub", hub.addr, "--name", "pol"], check=True,
                           stdout=subprocess.DEVNULL)
            store.push("pol", w(101.0), version=1)
            wv = src.wait_newer(5, timeout=30, life=old)
            assert wv is not None and wv.version == 1 and src.life not in (0, old)
            np.testing.assert_array_equal(wv.tensors()["w"], w(101.0)["w"])
            assert wv.life == src.life
            assert src.get_if_newer(5) is None  # the older rule: nothing past v5
            src.close()

            # A Receiver over the segment passes the life it runs: deleted
            # and pushed again once more, it applies the third life's v1.
            mod = torch.nn.Module()
            mod.w = torch.nn.Parameter(torch.zeros(8))
            with ws.Receiver(mod, ws.ShmSource(shm_path, model="pol")) as r:
                assert r.wait(30) and r.version == 1 and r.life not in (0, old)
                second = r.life
                subprocess.run([hub.binary, "model", "rm", "--hub", hub.addr, "--name", "pol"], check=True,
                               stdout=subprocess.DEVNULL)
                store.push("pol", w(202.0), version=1)
                deadline = time.monotonic() + 30
                while r.life in (second,) and time.monotonic() < deadline:
                    r.wait(1.0)
                assert r.version == 1 and r.life not in (0, old, second)
                assert bool((mod.w == 202.0).all())
        finally:
            relay.terminate()
            relay.wait(timeout=30)
