"""pull_into / watch_into keep the plan of their target's tensors between
versions (tensors.TargetCache) and must still notice a module whose tensors
were replaced, reallocated or reshaped in between."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import rlhub
from rlhub.tensors import TargetCache, save_bytes


def _version(sd):
    return bytearray(save_bytes({k: v.detach().numpy() for k, v in sd.items()}))


def test_the_plan_is_reused_while_the_tensors_are_unchanged():
    m = torch.nn.Linear(6, 3)
    c = TargetCache()
    t0 = c.get(m)  # seen once: not kept
    t = c.get(m)  # twice in a row: kept
    assert t is not t0 and c.get(m) is t
    m.weight.data.add_(1.0)  # values change in place: same memory, same plan
    assert c.get(m) is t


def test_a_module_seen_once_is_not_kept_alive():
    c = TargetCache()
    m = torch.nn.Linear(6, 3)
    r = weakref.ref(m.weight)
    c.get(m)
    del m
    gc.collect()
    assert r() is None, "a module pulled into once is held by the cache"
    m = torch.nn.Linear(6, 3)
    r = weakref.ref(m.weight)
    c.get(m)
    c.get(m)  # kept now
    c.get(torch.nn.Linear(6, 3))  # a miss drops it
    del m
    gc.collect()
    assert r() is None, "a miss left the previous module's tensors held by the cache"


@pytest.mark.parametrize("change", ["parameter", "data", "reshape", "dtype", "transpose", "new-key"])
def test_a_changed_module_gets_a_new_plan_that_writes_its_current_tensors(change):
    torch.manual_seed(3)
    m = torch.nn.Linear(6, 3)
    c = TargetCache()
    c.get(m)
    old = c.get(m)  # kept
    old_weight = m.weight.detach().clone()
    if change == "parameter":  # a new Parameter object with new memory
        m.weight = torch.nn.Parameter(torch.zeros(3, 6))
    elif change == "data":  # same Parameter object, new memory
        m.weight.data = torch.zeros(3, 6)
    elif change == "reshape":  # same number of bytes, another shape
        m.weight.data = torch.zeros(6, 3)
    elif change == "dtype":
        m.weight.data = torch.zeros(3, 6, dtype=torch.float64)
    elif change == "transpose":  # same memory, other strides
        m.weight.data = m.weight.data.t().contiguous().t()
    else:
        m.register_buffer("extra", torch.zeros(2))
    new = c.get(m)
    assert new is not old
    want = {"weight": torch.randn(3, 6), "bias": torch.randn(3)}
    if change == "new-key":
        want["extra"] = torch.randn(2)
    blob = _version(want)
    if change in ("reshape", "dtype"):
        before = {k: v.clone() for k, v in m.state_dict().items()}
        with pytest.raises(rlhub.InvalidArgument, match="does not fit the target"):
            new.write(blob)
        for k, v in m.state_dict().items():
            assert torch.equal(v, before[k]), f"{k} changed by a refused version"
        return
    new.write(blob)
    for k, v in want.items():
        assert torch.equal(m.state_dict()[k], v), k
    if change in ("parameter", "data"):
        # The tensor the module no longer holds was left alone.
        assert torch.equal(old._tensors["weight"], old_weight)


def test_numpy_targets_are_rebuilt_every_time():
    d = {"w": np.zeros(4, np.float32)}
    c = TargetCache()
    assert c.get(d) is not c.get(d)
    d["w"] = np.zeros(4, np.float32)
    d["w"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.get(d)


def test_pull_into_follows_a_module_whose_tensors_change_between_pulls(hub):
    torch.manual_seed(4)
    src = torch.nn.Linear(40, 30)
    dst = torch.nn.Linear(40, 30)
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("m", src.state_dict(), version=1, expect=0)
        # Twice with the same tensors, so the plan is kept from here on.
        assert sc.pull_into("m", dst) == 1 and sc.pull_into("m", dst) == 1
        assert torch.equal(dst.weight, src.weight)

        # Replaced by a new Parameter: the next version lands in it.
        dst.weight = torch.nn.Parameter(torch.zeros(30, 40))
        v2 = {k: v + 1 for k, v in src.state_dict().items()}
        sc.push("m", v2, version=2)
        assert sc.pull_into("m", dst) == 2
        assert torch.equal(dst.weight, v2["weight"]) and torch.equal(dst.bias, v2["bias"])
        dst.weight.data.zero_()
        assert sc.pull_into("m", dst) == 2  # the new plan, now kept
        assert torch.equal(dst.weight, v2["weight"])

        # New memory under the same Parameter.
        dst.bias.data = torch.zeros(30)
        v3 = {k: v + 2 for k, v in src.state_dict().items()}
        sc.push("m", v3, version=3)
        assert sc.pull_into("m", dst) == 3
        assert torch.equal(dst.bias, v3["bias"]) and torch.equal(dst.weight, v3["weight"])

        # Reshaped: refused, nothing written; back to the model's shape: taken.
        dst.weight.data = torch.full((40, 30), 7.0)
        before = {k: v.clone() for k, v in dst.state_dict().items()}
        with pytest.raises(rlhub.InvalidArgument, match="does not fit the target"):
            sc.pull_into("m", dst)
        for k, v in dst.state_dict().items():
            assert torch.equal(v, before[k]), f"{k} changed by a refused version"
        dst.weight.data = torch.zeros(30, 40)
        assert sc.pull_into("m", dst) == 3
        assert torch.equal(dst.weight, v3["weight"])

        # Another module through the same client, then the first again.
        other = torch.nn.Linear(40, 30)
        assert sc.pull_into("m", other) == 3
        assert torch.equal(other.weight, v3["weight"])
        dst.weight.data.zero_()
        assert sc.pull_into("m", dst) == 3
        assert torch.equal(dst.weight, v3["weight"])


def test_watch_into_follows_a_tensor_replaced_during_the_watch(hub):
    target = {"w": torch.zeros(1000)}
    with rlhub.StoreClient(hub.addr) as sc:
        sc.push("m", {"w": torch.full((1000,), 1.0)}, version=1, expect=0)
        w = sc.watch_into("m", target, after=0, timeout=60)
        try:
            assert next(w) == 1 and float(target["w"][0]) == 1.0
            sc.push("m", {"w": torch.full((1000,), 1.5)}, version=2)
            assert next(w) == 2 and float(target["w"][0]) == 1.5  # the same tensor twice: its plan is kept
            first = target["w"]
            target["w"] = torch.zeros(1000)
            sc.push("m", {"w": torch.full((1000,), 2.0)}, version=3)
            assert next(w) == 3
            assert float(target["w"][999]) == 2.0 and float(first[0]) == 1.5
            target["w"] = torch.zeros(10)
            sc.push("m", {"w": torch.full((1000,), 3.0)}, version=4)
            with pytest.raises(rlhub.InvalidArgument, match="does not fit the target"):
                next(w)
            assert float(target["w"].abs().sum()) == 0.0
        finally:
            w.close()


def test_watch_into_refuses_a_target_that_is_not_tensors_before_any_version(hub):
    with rlhub.StoreClient(hub.addr) as sc:
        with pytest.raises(TypeError, match="want an nn.Module or a dict"):
            next(sc.watch_into("m", [1, 2, 3], after=0, timeout=5))
