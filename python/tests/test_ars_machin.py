"""rlhub's ARS update options checked against Machin's arithmetic with torch.

scripts/gen_ars_machin_vectors.py computes ARS updates as Machin's
distributed ARS does (top-b by percentile, rewards over their std, the mean
of (r− − r+)·δ as the gradient, clip_grad_norm_ as its gradient_max is
written, any torch optimizer and lr scheduler). Its output is committed as
internal/ars/testdata/machin_update.json and replayed by rlhub's trainer in
internal/ars (TestUpdateMatchesMachin). Here the reference is recomputed
with the installed torch and must equal the committed vectors, so the Go
test checks against torch as it is, not a stale file.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np

from conftest import REPO


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_ars_machin_vectors", REPO / "scripts" / "gen_ars_machin_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_machin_vectors_are_torchs():
    gen = load_generator()
    fresh = gen.generate()
    committed = json.loads((REPO / "internal" / "ars" / "testdata" / "machin_update.json").read_text())
    assert [c["name"] for c in fresh["cases"]] == [c["name"] for c in committed["cases"]]
    for f, c in zip(fresh["cases"], committed["cases"]):
        assert {k: v for k, v in f.items() if k != "iterations"} == {k: v for k, v in c.items() if k != "iterations"}
        for i, (fi, ci) in enumerate(zip(f["iterations"], c["iterations"])):
            assert fi["rplus"] == ci["rplus"] and fi["rminus"] == ci["rminus"], (f["name"], i)
            # torch's float32 kernels take other vector paths on other CPUs
            # (ATEN_CPU_CAPABILITY avx512, avx2, default): θ then differs
            # by ~1e-7 of its largest entry (measured 5e-8 and 1e-7 against
            # the committed file), so a near-zero entry cannot meet a
            # relative bound alone. The absolute bound is scaled to θ, ten
            # times that roundoff: any change in the arithmetic moves θ by
            # far more.
            atol = 1e-6 * float(np.abs(ci["theta"]).max())
            np.testing.assert_allclose(fi["theta"], ci["theta"], rtol=1e-6, atol=atol, err_msg=f"{f['name']} iteration {i}")
        # θ moved, and clipping took part where it is set.
        assert f["iterations"][-1]["theta"] != f["theta0"], f["name"]
