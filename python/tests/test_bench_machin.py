"""The learner-loop benchmark's Machin arm (scripts/bench_learner_loop.py).

The benchmark's reference for issue 18 is Machin 0.4.2's PushPullGradServer
measured in the same run; this runs that arm alone, small (a 3-process
Machin World per mode, loop and sync, 4 iterations per learner), and checks
that Machin's server really reduced and published what the learners pushed:
gradients were counted in both modes, and in sync mode, where 2 learners push 2
gradients each per round and wait for the next version, every round made
exactly one version (Machin's primary reducer batches 2 secondary batches
of 2), the untimed first round included. Skipped only when Machin is not
installed in .cache/machin (scripts/setup_machin.sh, run by
scripts/setup.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

MACHIN = REPO / ".cache" / "machin"


@pytest.mark.skipif(not (MACHIN / "machin" / "parallel").is_dir(),
                    reason="Machin is not installed in .cache/machin (scripts/setup_machin.sh)")
def test_machin_arm_pushes_and_publishes_versions(tmp_path):
    out = tmp_path / "results.json"
    iters = 4
    p = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_learner_loop.py"), "--arms", "machin", "--reps", "1",
         "--iters", str(iters), "--modes", "loop,sync", "--no-warmup", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "Machin 0.4.2" in p.stdout, p.stdout
    got = json.loads(out.read_text())
    assert got["arms"] == ["machin"]
    for mode in ("loop", "sync"):
        (rep,) = got["results"][f"machin/{mode}"]
        assert rep["grads_per_s"] > 0, (mode, rep)
    sync = got["results"]["machin/sync"][0]
    rounds = iters // 2
    assert sync["rounds"] == rounds, sync
    assert sync["pulls"] == 2 * rounds, sync
    assert 0 < sync["p50_ms"] <= sync["p99_ms"], sync
    (runs,) = [v for v in got["machin_versions"] if v["mode"] == "sync"]
    # rounds timed + the untimed first one, one version each, seen by both learners
    assert runs["final_versions"] == [rounds + 1, rounds + 1], runs
    for v in got["machin_versions"]:
        assert len(v["final_versions"]) == 2, v
