"""rlhub.tensorboard: event files that tensorboard's own reader reads back,
and a hub's reducer counters and collector lag logged from a real hub."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

import rlhub
from rlhub import tensorboard, wsync
from rlhub.grads import GradClient

# Imported, not importorskip'd: a missing tensorboard fails the suite
# (scripts/setup.sh installs python/requirements-dev.txt, which pins it).
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read(logdir: str) -> dict:
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_reads_what_the_writer_wrote(tmp_path):
    with tensorboard.EventWriter(str(tmp_path)) as tb:
        for step in range(20):
            tb.add_scalars(step * 5, {"eval/return": -50 + 3.5 * step, "train/lag": step % 3})
        tb.add_scalar("big/step", math.e, 1 << 40)
    got = read(str(tmp_path))
    assert set(got) == {"eval/return", "train/lag", "big/step"}
    assert got["eval/return"] == [(s * 5, pytest.approx(-50 + 3.5 * s)) for s in range(20)]
    assert got["train/lag"] == [(s * 5, float(s % 3)) for s in range(20)]
    assert got["big/step"] == [(1 << 40, pytest.approx(math.e, rel=1e-6))]
    with pytest.raises(ValueError):
        tb.add_scalar("late", 1.0, 1)
    with tensorboard.EventWriter(str(tmp_path / "bad")) as tb, pytest.raises(ValueError):
        tb.add_scalar("", 1.0, 1)


def test_hub_scalars_log_gradients_applied_and_lag(hub, tmp_path):
    w = {"w": np.zeros(4, np.float32)}
    with rlhub.StoreClient(hub.addr) as s:
        s.push("pol", w, version=1, expect=0)
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        for i in range(6):
            g.push("pol", 1, {"w": np.full(4, i, np.float32)})
        deadline = time.monotonic() + 30
        while not g.stats().accounted() and time.monotonic() < deadline:
            time.sleep(0.05)
        st = g.stats()
        assert st.accounted(), st
    with rlhub.StoreClient(hub.addr) as s:
        newest = s.pull("pol").version
    wsync.report(hub.addr, "slow", "pol", 1, "shm")
    wsync.report(hub.addr, "fresh", "pol", newest, "push")

    with tensorboard.EventWriter(str(tmp_path)) as tb:
        with tensorboard.HubScalars(hub.addr, tb, model="pol") as h:
            logged = h.log(7)
    got = read(str(tmp_path))
    assert got["reducer/gradients_pushed"] == [(7, 6.0)]
    assert got["reducer/gradients_applied"] == [(7, float(st.total.applied))]
    assert got["reducer/gradients_applied"][0][1] + got["reducer/gradients_dropped"][0][1] + \
        got["reducer/gradients_lost"][0][1] == 6.0
    assert got["reducer/steps"] == [(7, float(newest - 1))]
    assert got["sync/pol/lag/slow"] == [(7, float(newest - 1))]
    assert got["sync/pol/lag/fresh"] == [(7, 0.0)]
    assert got["sync/pol/max_lag"] == [(7, float(newest - 1))]
    assert logged["sync/pol/lag/slow"] == newest - 1



def test_train_ars_tensorboard_matches_curve_csv(rlhub_bin, tmp_path):
    """`train ars --tensorboard DIR` during a short run: tensorboard's own
    reader finds one point per curve.csv row, at step = iteration, with the
    row's values."""
    import csv
    import subprocess

    out, tb = tmp_path / "run", tmp_path / "tb"
    res = subprocess.run([rlhub_bin, "train", "ars", "--env", "CartPole-v1", "--workers", "1", "--seed", "3",
                          "--max-iterations", "12", "--eval-every", "4", "--eval-episodes", "5",
                          "--out", str(out), "--tensorboard", str(tb), "--no-progress"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(out / "curve.csv")))
    assert rows, "curve.csv is empty"
    got = read(str(tb))
    rows = [r for r in rows if r["confirm"] != "true"]  # a re-evaluation has its own tag
    # An iteration trained when it ran episodes past those behind its policy
    # (the last, evaluation-only row did not: no train_return point).
    train = [(int(r["iteration"]), float(r["train_return"])) for r in rows
             if int(r["training_episodes"]) > int(r["policy_training_episodes"])]
    evals = [(int(r["iteration"]), float(r["eval_mean"])) for r in rows if r["eval_mean"]]
    episodes = [(int(r["iteration"]), float(r["training_episodes"])) for r in rows]
    assert len(evals) >= 2 and len(train) >= 10
    for tag, want in (("ars/train_return", train), ("ars/eval_return", evals), ("ars/training_episodes", episodes)):
        have = got.get(tag, [])
        assert [s for s, _ in have] == [s for s, _ in want], f"{tag}: steps {have} vs curve.csv {want}"
        for (_, h), (_, w) in zip(have, want):
            assert math.isclose(h, w, rel_tol=1e-5, abs_tol=1e-4), f"{tag}: {h} vs curve.csv {w}"


def test_a_value_beyond_float32_is_stored_as_inf_as_go_does(tmp_path):
    """Go's tblog stores float32(v): a diverged loss of 1e39 reads +Inf in
    TensorBoard. The Python writer must not crash the training loop."""
    with tensorboard.EventWriter(str(tmp_path)) as tb:
        tb.add_scalar("train/loss", 1.0, 1)
        tb.add_scalar("train/loss", 1e39, 2)
        tb.add_scalar("train/loss", -1e39, 3)
    got = read(str(tmp_path))
    assert got["train/loss"] == [(1, 1.0), (2, math.inf), (3, -math.inf)]


def test_flushed_within_flush_secs_with_explicit_wall_times(tmp_path):
    """Events are flushed at least every flush_secs seconds, also when the
    caller stamps them with its own (past) wall times: nothing reached the
    file before close then."""
    tb = tensorboard.EventWriter(str(tmp_path), flush_secs=0.2)
    try:
        size0 = os.path.getsize(tb.path)
        t0 = time.time() - 3600  # events recorded an hour ago
        for i in range(10):
            tb.add_scalar("replay/x", float(i), i, wall_time=t0 + i)
            time.sleep(0.05)
        assert os.path.getsize(tb.path) > size0, "0.5 s of events, none flushed"
    finally:
        tb.close()


def test_the_last_event_is_flushed_within_flush_secs_when_no_more_come(tmp_path):
    """A learner that logs a point and then goes quiet (a long evaluation,
    a stall, the end of a run not yet closed): TensorBoard reads the point
    within flush_secs, as torch's SummaryWriter(flush_secs=) does, not only
    once another point is written."""
    tb = tensorboard.EventWriter(str(tmp_path), flush_secs=0.2)
    try:
        tb.add_scalar("train/loss", 1.5, 1)
        time.sleep(0.3)
        tb.add_scalar("train/loss", 1.0, 2)  # flushed with this call: 0.3 s since the last flush
        tb.add_scalar("train/loss", 0.5, 3)  # then nothing more
        deadline = time.monotonic() + 5
        while read(str(tmp_path)).get("train/loss", [])[-1:] != [(3, 0.5)]:
            assert time.monotonic() < deadline, f"after 5 s TensorBoard reads {read(str(tmp_path))}"
            time.sleep(0.1)
    finally:
        tb.close()
    assert read(str(tmp_path))["train/loss"] == [(1, 1.5), (2, 1.0), (3, 0.5)]


def test_the_module_example_runs_after_import_rlhub(hub, tmp_path):
    """The module doc's example as written, in a fresh interpreter that
    imported only ``rlhub``: ``rlhub.tensorboard`` is imported on first
    use."""
    import subprocess
    import sys

    from conftest import REPO

    script = (
        "import sys, rlhub\n"
        "hub_addr, logdir = sys.argv[1], sys.argv[2]\n"
        "with rlhub.tensorboard.EventWriter(logdir) as tb:\n"
        "    hub_scalars = rlhub.tensorboard.HubScalars(hub_addr, tb, model='policy')\n"
        "    for step in range(3):\n"
        "        tb.add_scalar('train/loss', 1.0 / (step + 1), step)\n"
        "        hub_scalars.log(step)\n"
        "    hub_scalars.close()\n")
    r = subprocess.run([sys.executable, "-c", script, hub.addr, str(tmp_path / "runs")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert r.returncode == 0, r.stderr[-2000:]
    got = read(str(tmp_path / "runs"))
    assert [s for s, _ in got["train/loss"]] == [0, 1, 2]
    assert [s for s, _ in got["reducer/gradients_pushed"]] == [0, 1, 2]
