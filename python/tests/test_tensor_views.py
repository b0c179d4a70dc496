"""Tensors whose memory is not their values: a conjugate view (``x.conj()``
of a complex tensor) and a tensor with the negative bit set (``.imag`` of
a conjugate view). Pushed as state dicts (data plane and gRPC) and as
gradients (both transports) against the real binary, they arrive as the
values they read as; a pull_into target that is one is refused clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlhub
from rlhub import tensors
from rlhub.grads import GradClient

from conftest import Hub


def _views():
    x = torch.tensor([1 + 2j, -3 - 4j, 5 + 0.5j], dtype=torch.complex64)
    conj = x.conj()
    neg = x.conj().imag  # float32 with the negative bit, not contiguous
    flat_neg = torch._neg_view(torch.tensor([1.5, -2.0, 0.0, 7.0]))  # contiguous with the negative bit
    assert conj.is_conj() and neg.is_neg() and flat_neg.is_neg() and flat_neg.is_contiguous()
    return {"conj": conj, "neg": neg, "flat_neg": flat_neg}


@pytest.mark.parametrize("extra,transport", [((), "auto"), (("--no-store-data-plane",), "auto"), ((), "grpc")],
                         ids=["data-plane", "grpc-fallback", "grpc"])
def test_state_dict_of_views_round_trips_resolved(rlhub_bin, tmp_path, extra, transport):
    h = Hub(rlhub_bin, tmp_path, extra=extra)
    try:
        with rlhub.StoreClient(h.addr, retries=1, transport=transport) as sc:
            sd = _views()
            sc.push("m", sd, version=1, expect=0)
            got = sc.pull("m", framework="torch").tensors
            for k, t in sd.items():
                want = t.resolve_conj().resolve_neg()
                assert got[k].dtype == want.dtype and torch.equal(got[k], want), (k, got[k], want)
            assert torch.equal(got["conj"], torch.tensor([1 - 2j, -3 + 4j, 5 - 0.5j], dtype=torch.complex64))
            assert torch.equal(got["neg"], torch.tensor([-2.0, 4.0, -0.5]))
            on_dp = transport == "auto" and not extra
            assert sc.stats["push_bulk" if on_dp else "push_grpc"] == 1, sc.stats
    finally:
        h.stop()


def test_parts_of_a_negative_view_are_not_kept_stale():
    """PartsCache reuses views of a tensor's memory; a negative view's bytes
    are a resolved copy, which must be made again on every push."""
    base = torch.tensor([1.0, 2.0, 3.0])
    g = {"w": torch._neg_view(base)}
    cache = tensors.PartsCache()
    for i in range(3):
        base.add_(10.0)  # the same view, new values
        head, bufs = cache.get(g)
        assert np.frombuffer(bufs[0], np.float32).tolist() == (-base).tolist(), i


def test_a_view_target_is_refused_by_name():
    x = torch.zeros(3, dtype=torch.complex64)
    with pytest.raises(ValueError, match="'conj'.*conjugate or negative view"):
        tensors.Target({"conj": x.conj()})


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_gradient_with_the_negative_bit_is_applied_resolved(hub, transport):
    w0 = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    with rlhub.StoreClient(hub.addr) as s, GradClient(hub.addr, transport=transport) as g:
        s.push("m", {"w": w0}, version=1, expect=0)
        g.register("m", optimizer={"kind": "sgd", "lr": 1.0})
        base = torch.tensor([0.5, -1.0, 2.0, 0.0])
        grad = torch._neg_view(base)  # reads as [-0.5, 1, -2, -0]
        version = 1
        for step in range(3):  # the same tensor a third time: parts the client kept would be reused
            r = g.push("m", version, {"w": grad})
            assert r.version == version
            v = s.pull("m", if_newer_than=version) or next(iter(s.watch("m", after=version, timeout=30)))
            w_before = s.pull("m", version=version).tensors["w"]
            np.testing.assert_array_equal(v.tensors["w"], w_before - (-base.numpy()))  # SGD, lr 1: w - grad
            version = v.version
            base.mul_(3.0)
        stats = g.transport_stats()
        assert stats["bulk" if transport == "auto" else "grpc"] == 3, stats
