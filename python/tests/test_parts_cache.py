"""GradClient.push keeps the encoding of its last gradient (header and views
of the tensors' memory, tensors.PartsCache) and must still send the current
values, and notice tensors replaced, reallocated or reshaped between pushes."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import rlhub
from rlhub.grads import GradClient
from rlhub.tensors import PartsCache, save_bytes, save_parts

from test_grads import wait_version


def _joined(parts):
    head, bufs = parts
    return bytes(head) + b"".join(bytes(b) for b in bufs)


def test_parts_are_reused_and_always_match_save_bytes():
    g = {"w": torch.zeros(3, 4), "b": torch.zeros(3)}
    c = PartsCache()
    p0 = c.get(g)  # seen once: not kept
    assert _joined(p0) == save_bytes(g)
    p1 = c.get(g)  # seen twice in a row: kept
    assert p1 is not p0 and _joined(p1) == save_bytes(g)
    g["w"].fill_(2.0)  # in place: the same parts, the new values
    p2 = c.get(g)
    assert p2 is p1 and _joined(p2) == save_bytes(g)
    g["w"] = torch.ones(3, 4)  # replaced
    p3 = c.get(g)
    assert p3 is not p1 and _joined(p3) == save_bytes(g)
    g["w"] = torch.ones(4, 3)  # reshaped
    assert _joined(c.get(g)) == save_bytes(g)
    g["w"] = g["w"].view(3, 4)  # the same memory, another shape
    assert _joined(c.get(g)) == save_bytes(g)
    g["x"] = torch.ones(1)  # another tensor
    assert _joined(c.get(g)) == save_bytes(g)


@pytest.mark.parametrize("kind", ["numpy", "strided", "f64"])
def test_values_that_are_copied_or_not_torch_are_encoded_every_time(kind):
    if kind == "numpy":
        g = {"w": np.zeros(12, np.float32)}
    elif kind == "strided":
        g = {"w": torch.zeros(4, 3).t()}
    else:
        g = {"w": torch.zeros(12, dtype=torch.float64)}
    c = PartsCache()
    c.get(g)
    p1 = c.get(g)
    if kind == "strided":  # its bytes are a copy: a cached one would go stale
        g["w"].fill_(5.0)
    elif kind == "numpy":
        g["w"][:] = 5.0
    else:
        g["w"].fill_(5.0)
    p2 = c.get(g)
    assert _joined(p2) == save_bytes(g) == _joined(save_parts(g))
    if kind != "f64":
        assert p2 is not p1
    else:
        assert p2 is p1  # contiguous CPU torch: views of the memory, reused


def test_fresh_tensors_every_push_are_not_kept_alive():
    """A module's .grad after zero_grad(set_to_none=True) is a new tensor
    every step: the cache must not hold the previous one."""
    c = PartsCache()
    g = {"w": torch.zeros(1000)}
    r = weakref.ref(g["w"])
    c.get(g)
    del g
    gc.collect()
    assert r() is None, "a gradient seen once is held by the cache"
    g = {"w": torch.zeros(1000)}
    r = weakref.ref(g["w"])
    c.get(g)
    c.get(g)  # kept now: the same tensors twice in a row
    g2 = {"w": torch.zeros(1000)}
    c.get(g2)  # a miss drops what was kept
    del g
    gc.collect()
    assert r() is None, "a miss left the previous gradient held by the cache"


def _register(addr: str, name: str, n: int) -> None:
    with rlhub.StoreClient(addr) as s:
        s.push(name, {"w": torch.zeros(n)}, version=1, expect=0)
    with GradClient(addr) as g:
        g.register(name, optimizer={"kind": "sgd", "lr": 1.0}, reduction="sum")


def test_push_sends_the_current_tensors_after_each_change(hub):
    """SGD with lr 1 and batches of one: every version is the previous one
    minus exactly the gradient the hub received."""
    n = 100_000
    _register(hub.addr, "m", n)
    grads = {"w": torch.full((n,), 1.0)}
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
        def step(base: int, want: float) -> None:
            g.push("m", base, grads)
            v = wait_version(s, "m", base)
            assert v.version == base + 1
            w = v.tensors["w"]
            assert float(w.min()) == float(w.max()) == want, (float(w.min()), float(w.max()), want)

        step(1, -1.0)
        grads["w"].fill_(2.0)  # the same tensor, new values
        step(2, -3.0)
        grads["w"] = torch.full((n,), 3.0)  # replaced
        step(3, -6.0)
        # A NaN written in place is sent, and refused; the model is unchanged.
        grads["w"][n // 2] = float("nan")
        with pytest.raises(rlhub.InvalidArgument):
            g.push("m", 4, grads)
        grads["w"][n // 2] = 3.0
        # Another shape (the same number of bytes): refused, then back.
        grads["w"] = torch.zeros(10, n // 10)
        with pytest.raises(rlhub.InvalidArgument):
            g.push("m", 4, grads)
        grads["w"] = grads["w"].reshape(n).fill_(4.0)  # the same memory, the model's shape
        step(4, -10.0)
        assert s.pull("m").version == 5
