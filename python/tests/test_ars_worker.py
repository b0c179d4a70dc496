"""The Python ARS worker against the real hub, checked against the Go worker.

* A run on CartPole-v1 served only by ``python -m rlhub.ars_worker``
  (Gymnasium's CartPole) and started by ``rlhub train ars --workers 0``
  reaches the target.
* Bit-identity with the Go worker: Gymnasium resets episodes with its own
  generator, so on Gymnasium's envs the two workers see different start
  states. ``GoCartPole`` and ``GoPendulum`` below are line-by-line ports of
  internal/env's envs (Go's PCG reset, Go's sin/cos); a Python worker on
  them must produce the same policy bytes and curve (returns, σ_R,
  evaluations) as a Go worker on the Go env, which checks the noise, the
  filter statistics and normalisation, the shift, discrete and Box actions,
  evaluation episodes and the update end to end.
* A Python worker SIGKILLed while holding a lease: its tasks are handed to
  another worker and the run ends with the undisturbed run's policy.
* A worker started for another environment skips the run and serves others;
  a stopped worker stops mid-episode and reports what it finished.
* A Gymnasium env the hub has no implementation of runs (``--obs-dim``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import pathlib
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any, List, Optional, Tuple

import grpc
import numpy as np
import pytest

import gymnasium  # python/requirements-dev.txt (the worker itself imports it lazily)

from rlhub import ars_worker, errors
from rlhub._proto.rlhub.v1 import ars_pb2, ars_pb2_grpc

from conftest import REPO, Hub

PYENV = dict(os.environ, PYTHONPATH=str(REPO / "python"))

_M64 = (1 << 64) - 1


# Go's math.Sin / math.Cos (src/math/sin.go, Cephes polynomials; pure Go on
# amd64, no FMA at GOAMD64=v1) for |x| < 2²⁹: glibc's sin/cos differ from
# them in the last bit now and then, enough to change a CartPole episode.
_SIN = (1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
        -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1)
_COS = (-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
        2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2)
_PI4A, _PI4B, _PI4C = 7.85398125648498535156e-1, 3.77489470793079817668e-8, 2.69515142907905952645e-15
_FOUR_OVER_PI = struct.unpack("<d", struct.pack("<Q", 0x3FF45F306DC9C883))[0]  # Go's exact 4/Pi rounded


def _poly(c: Tuple[float, ...], zz: float) -> float:
    return (((((c[0] * zz) + c[1]) * zz + c[2]) * zz + c[3]) * zz + c[4]) * zz + c[5]


def _reduce(x: float) -> Tuple[int, float]:
    assert x < 1 << 29, x
    j = int(x * _FOUR_OVER_PI)
    y = float(j)
    if j & 1:
        j += 1
        y += 1
    j &= 7
    return j, ((x - y * _PI4A) - y * _PI4B) - y * _PI4C


def go_sin(x: float) -> float:
    if x == 0 or math.isnan(x):
        return x
    sign = x < 0
    j, z = _reduce(abs(x))
    if j > 3:
        sign, j = not sign, j - 4
    zz = z * z
    y = 1.0 - 0.5 * zz + zz * zz * _poly(_COS, zz) if j in (1, 2) else z + z * zz * _poly(_SIN, zz)
    return -y if sign else y


def go_cos(x: float) -> float:
    sign = False
    j, z = _reduce(abs(x))
    if j > 3:
        j, sign = j - 4, not sign
    if j > 1:
        sign = not sign
    zz = z * z
    y = z + z * zz * _poly(_SIN, zz) if j in (1, 2) else 1.0 - 0.5 * zz + zz * zz * _poly(_COS, zz)
    return -y if sign else y


class GoPCG:
    """Go's math/rand/v2 PCG (128-bit LCG, DXSM output) and Rand.Float64."""

    _MUL = 2549297995355413924 << 64 | 4865540595714422341
    _INC = 6364136223846793005 << 64 | 1442695040888963407

    def __init__(self, seed1: int, seed2: int):
        self.state = seed1 << 64 | seed2

    def uint64(self) -> int:
        self.state = (self.state * self._MUL + self._INC) & ((1 << 128) - 1)
        hi, lo = self.state >> 64, self.state & _M64
        hi ^= hi >> 32
        hi = hi * 0xDA942042E4DD58B5 & _M64
        hi ^= hi >> 48
        return hi * (lo | 1) & _M64

    def float64(self) -> float:
        return float(self.uint64() & ((1 << 53) - 1)) / (1 << 53)


class GoCartPole:
    """internal/env/cartpole.go in Python, Gymnasium-shaped.

    ``reset(seed=w1 + 2⁶⁴·w2)`` seeds a Go PCG with (w1, w2), as the Go
    worker seeds its env; sin and cos are Go's (``go_sin``, ``go_cos``).
    """

    def __init__(self):
        self.action_space = gymnasium.spaces.Discrete(2)
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.gravity, self.masscart, self.masspole = 9.8, 1.0, 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self.theta_threshold = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        self.state = [0.0] * 4
        self.steps = 0
        self.beyond = -1

    def _obs(self) -> np.ndarray:
        return np.array(self.state, dtype=np.float32)

    def reset(self, seed: Optional[int] = None) -> Tuple[np.ndarray, dict]:
        rng = GoPCG(seed & _M64, seed >> 64)
        self.state = [-0.05 + (0.05 - -0.05) * rng.float64() for _ in range(4)]
        self.steps, self.beyond = 0, -1
        return self._obs(), {}

    def step(self, a: int):
        assert a in (0, 1), a
        self.steps += 1
        truncated = self.steps >= 500
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if a == 1 else -self.force_mag
        costheta, sintheta = go_cos(theta), go_sin(theta)
        temp = (force + self.polemass_length * (theta_dot * theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * (costheta * costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = [x, x_dot, theta, theta_dot]
        terminated = (x < -self.x_threshold or x > self.x_threshold
                      or theta < -self.theta_threshold or theta > self.theta_threshold)
        reward = 1.0
        if terminated:
            if self.beyond < 0:
                self.beyond = 0
            else:
                self.beyond += 1
                reward = 0.0
        return self._obs(), reward, terminated, truncated, {}


class GoPendulum:
    """internal/env/pendulum.go in Python: float32 action and cost terms as
    Gymnasium's dtypes give them, Go's sin/cos, Go's PCG reset."""

    def __init__(self):
        self.action_space = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.observation_space = gymnasium.spaces.Box(-8.0, 8.0, (3,), np.float32)
        self.max_speed, self.max_torque, self.dt = 8.0, np.float32(2.0), 0.05
        self.g, self.m, self.l = 10.0, 1.0, 1.0
        self.th, self.thdot, self.steps = 0.0, 0.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([go_cos(self.th), go_sin(self.th), self.thdot], dtype=np.float32)

    def reset(self, seed: Optional[int] = None) -> Tuple[np.ndarray, dict]:
        rng = GoPCG(seed & _M64, seed >> 64)
        self.th = -math.pi + (math.pi - -math.pi) * rng.float64()
        self.thdot = -1 + (1 - -1) * rng.float64()
        self.steps = 0
        return self._obs(), {}

    def step(self, action: np.ndarray):
        assert action.dtype == np.float32 and action.shape == (1,), action
        self.steps += 1
        th, thdot = self.th, self.thdot
        u = action[0]
        u = -self.max_torque if u < -self.max_torque else self.max_torque if u > self.max_torque else u
        m = math.fmod(th + math.pi, 2 * math.pi)  # numpy's floored modulo, as pyMod
        if m != 0:
            if m < 0:
                m += 2 * math.pi
        else:
            m = 0.0
        an = m - math.pi
        costs = an * an + 0.1 * (thdot * thdot) + float(np.float32(0.001) * (u * u))
        newthdot = thdot + (3 * self.g / (2 * self.l) * go_sin(th)
                            + float(np.float32(3.0 / (self.m * self.l * self.l)) * u)) * self.dt
        newthdot = -self.max_speed if newthdot < -self.max_speed else self.max_speed if newthdot > self.max_speed \
            else newthdot
        self.th, self.thdot = th + newthdot * self.dt, newthdot
        return self._obs(), -costs, False, self.steps >= 200, {}


def train(hub: Hub, out: pathlib.Path, *args: str) -> dict:
    """`rlhub train ars --hub ... --workers 0` to the end; returns summary.json."""
    r = subprocess.run([hub.binary, "train", "ars", "--hub", hub.addr, "--workers", "0", "--no-progress",
                        "--out", str(out), *args], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr + r.stdout
    return json.loads((out / "summary.json").read_text())


def curve(out: pathlib.Path) -> List[List[str]]:
    """curve.csv without the two timing columns (wall and hub seconds)."""
    with open(out / "curve.csv") as f:
        rows = list(csv.reader(f))
    drop = {i for i, h in enumerate(rows[0]) if "second" in h or "wall" in h}
    return [[v for i, v in enumerate(r) if i not in drop] for r in rows]


class ThreadWorker:
    """An in-process ARSWorker on its own thread."""

    def __init__(self, addr: str, env_id: str, **kw: Any):
        self.worker = ars_worker.ARSWorker(addr, env_id, wait=0.2, **kw)
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> ars_worker.WorkerStats:
        self.worker.stop()
        self.thread.join(timeout=30)
        self.worker.close()
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.worker.stats


def test_go_pcg_port_known_answers():
    """Values printed by Go's math/rand/v2 (rand.New(rand.NewPCG(...)))."""
    r = GoPCG(1, 2)
    assert [r.uint64() for _ in range(3)] == [14192431797130687760, 11371241257079532652, 14470142590855381128]
    r = GoPCG(0xDEADBEEFCAFEBABE, 0x0123456789ABCDEF)
    assert [r.float64(), r.float64()] == [0.740586204785819, 0.8534896489441095]


def test_go_sin_cos_port_known_answers():
    """Bits printed by Go's math.Sin and math.Cos."""
    want = {0.1: (0x3FB98EAECB8BCB2C, 0x3FEFD712F9A817C0), -0.2: (0xBFC96DFF233DD2BC, 0x3FEF5CB49577627A),
            0.0123456789: (0x3F894886E168FFBA, 0x3FEFFF602EB7DE5E), 1.3: (0x3FEED577F9C51E4B, 0x3FD11EB3682A4C5F),
            -2.9: (0xBFCE9FB8D64830E2, 0xBFEF1216DBA340C9), 5.5: (0xBFE693C94E0AB057, 0x3FE6AD6C3C07D448),
            0.7853981: (0x3FE6A09E4E6E03C8, 0x3FE6A09E7E9073B8)}
    bits = lambda v: struct.unpack("<Q", struct.pack("<d", v))[0]  # noqa: E731
    for x, (s, c) in want.items():
        assert (bits(go_sin(x)), bits(go_cos(x))) == (s, c), x


def test_python_worker_alone_solves_cartpole(hub, tmp_path):
    w = subprocess.Popen([sys.executable, "-m", "rlhub.ars_worker", "--hub", hub.addr, "--env", "CartPole-v1",
                          "--name", "py-0"], env=PYENV, stderr=subprocess.PIPE, text=True)
    try:
        s = train(hub, tmp_path / "run", "--env", "CartPole-v1", "--seed", "1", "--target", "475")
    finally:
        w.send_signal(signal.SIGINT)
        _, err = w.communicate(timeout=30)
    assert w.returncode == 0, err
    assert s["stop_reason"] == "target" and s["reached_target"], s
    assert s["final_eval_mean"] >= 475, s
    assert "tasks" in err and "policy pulls" in err, err


def run_go_worker(hub: Hub, out: pathlib.Path, spec: List[str]) -> None:
    w = subprocess.Popen([hub.binary, "worker", "ars", "--hub", hub.addr], stderr=subprocess.DEVNULL)
    try:
        train(hub, out, *spec)
    finally:
        w.send_signal(signal.SIGINT)
        w.wait(timeout=30)


# V2-t with a shift: the filter statistics, their normalisation, the shift,
# evaluation episodes and top-b all take part.
CASES = {
    "CartPole-v1": (GoCartPole, ["--seed", "7", "--max-iterations", "6", "--eval-every", "2", "--eval-episodes", "3",
                                 "--directions", "8", "--top", "4", "--shift", "0.5"]),
    "Pendulum-v1": (GoPendulum, ["--seed", "5", "--max-iterations", "3", "--eval-every", "2", "--eval-episodes", "2",
                                 "--directions", "6", "--top", "3", "--shift", "0.25", "--version", "V2-t"]),
}


@pytest.mark.parametrize("env_id", sorted(CASES))
def test_bit_identical_to_go_worker(rlhub_bin, tmp_path, env_id):
    """Go worker on the Go env vs Python worker on its port: same bytes."""
    port, args = CASES[env_id]
    spec = ["--env", env_id, *args]
    go_hub = Hub(rlhub_bin, (tmp_path / "go").mkdir() or tmp_path / "go")
    try:
        run_go_worker(go_hub, tmp_path / "go" / "run", spec)
    finally:
        go_hub.stop()
    py_hub = Hub(rlhub_bin, (tmp_path / "py").mkdir() or tmp_path / "py")
    try:
        w = ThreadWorker(py_hub.addr, env_id, make_env=port)
        try:
            train(py_hub, tmp_path / "py" / "run", *spec)
        finally:
            st = w.stop()
    finally:
        py_hub.stop()
    assert st.tasks > 0
    go_curve, py_curve = curve(tmp_path / "go" / "run"), curve(tmp_path / "py" / "run")
    assert py_curve == go_curve
    go_blob = (tmp_path / "go" / "run" / "policy.safetensors").read_bytes()
    py_blob = (tmp_path / "py" / "run" / "policy.safetensors").read_bytes()
    p = ars_worker.decode_policy(py_blob)
    assert p.iteration > 0 and p.count > 0 and np.any(p.theta != 0), p
    assert py_blob == go_blob


def test_killed_python_worker_tasks_are_reassigned(rlhub_bin, hub, tmp_path):
    """SIGKILL a Python worker holding a lease; a second one finishes the run."""
    spec = ["--env", "CartPole-v1", "--seed", "3", "--max-iterations", "3", "--eval-every", "3",
            "--eval-episodes", "2", "--directions", "8", "--top", "4"]
    # Reference: the same run served by one undisturbed Python worker.
    ref_hub = Hub(rlhub_bin, (tmp_path / "ref").mkdir() or tmp_path / "ref")
    try:
        w = ThreadWorker(ref_hub.addr, "CartPole-v1")
        try:
            train(ref_hub, tmp_path / "ref" / "run", *spec)
        finally:
            w.stop()
    finally:
        ref_hub.stop()

    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, hub.addr], env=PYENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trainer = subprocess.Popen([hub.binary, "train", "ars", "--hub", hub.addr, "--workers", "0", "--no-progress",
                                "--out", str(tmp_path / "run"), *spec], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    survivor = None
    try:
        line = child.stdout.readline().strip()
        assert line.startswith("LEASED "), (line, child.stderr.read() if child.poll() is not None else "")
        held = int(line.split()[1])
        assert held > 0
        child.kill()
        child.wait(timeout=10)
        survivor = ThreadWorker(hub.addr, "CartPole-v1")
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, err + out
    finally:
        for p in (child, trainer):
            if p.poll() is None:
                p.kill()
                p.wait()
        if survivor is not None:
            st = survivor.stop()
    # The survivor computed every task, the killed worker's included.
    assert st.tasks >= 3 * 2 * 8 // 2, st
    assert (tmp_path / "run" / "policy.safetensors").read_bytes() == \
        (tmp_path / "ref" / "run" / "policy.safetensors").read_bytes()
    assert curve(tmp_path / "run") == curve(tmp_path / "ref" / "run")


# The child: a Python worker that prints LEASED <tasks> at its first lease
# and then hangs holding it until killed.
KILLED_CHILD = r"""
import sys, time
from rlhub import ars_worker
def hold(lease):
    print("LEASED", len(lease.tasks), flush=True)
    time.sleep(3600)
ars_worker.ARSWorker(sys.argv[1], "CartPole-v1", max_tasks=2, after_lease=hold).run()
"""


def _wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_worker_for_another_env_skips_the_run(hub, caplog):
    """A worker started for another environment gives the run back at once,
    says what to start instead, and goes on serving the hub's other runs (as
    the Go worker does); it used to exit, leaving every other run without it."""
    ch = grpc.insecure_channel(hub.addr)
    client = ars_pb2_grpc.ARSStub(ch)
    client.StartRun(ars_pb2.ARSStartRunRequest(spec=ars_pb2.ARSRunSpec(env="CartPole-v1", seed=1, max_iterations=1)))
    caplog.set_level(logging.WARNING, logger="rlhub.ars_worker")
    acro = ThreadWorker(hub.addr, "Acrobot-v1")
    try:
        _wait_for(lambda: acro.worker.skipped == ["run-1"], "the Acrobot worker to skip run-1")
        assert acro.thread.is_alive() and acro.error is None
        assert any("skipping run run-1" in r.getMessage() and "--env CartPole-v1" in r.getMessage()
                   for r in caplog.records), caplog.text
        cart = ThreadWorker(hub.addr, "CartPole-v1")
        try:
            prog = list(client.WatchRun(ars_pb2.ARSWatchRunRequest(run_id="run-1"), timeout=60))
        finally:
            cart.stop()
        assert prog[-1].done, prog[-1]
        # The skipping worker is still there for a run of its own environment.
        client.StartRun(ars_pb2.ARSStartRunRequest(spec=ars_pb2.ARSRunSpec(env="Acrobot-v1", seed=1, max_iterations=1)))
        prog = list(client.WatchRun(ars_pb2.ARSWatchRunRequest(run_id="run-2"), timeout=120))
        assert prog[-1].done, prog[-1]
    finally:
        st = acro.stop()
        ch.close()
    assert st.tasks > 0 and acro.worker.skipped == ["run-1"], (st, acro.worker.skipped)


class Endless(gymnasium.Env):
    """A 1-D env whose episodes last ``short`` steps while ``shorts`` of them
    are left, then (almost) for ever; ``on_step(n)`` sees the long episode's
    step count."""

    def __init__(self, shorts: int = 1 << 62, on_step=None):
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.shorts, self.on_step = shorts, on_step
        self.t, self.limit, self.long_steps = 0, 0, 0

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t = 0
        self.limit = 10 if self.shorts > 0 else 1 << 40
        self.shorts -= 1
        return np.zeros(1), {}

    def step(self, action):
        self.t += 1
        if self.limit > 10:
            self.long_steps += 1
            if self.on_step is not None:
                self.on_step(self.long_steps)
        return np.zeros(1), 1.0, False, self.t >= self.limit, {}


gymnasium.register("rlhubtest/Endless-v0", entry_point=Endless)


def test_stopped_worker_stops_mid_episode_and_reports_what_it_finished(hub):
    """stop() (SIGTERM) in the middle of a lease's episode: the worker stops
    within 256 steps, reports the task it finished and detaches, so another
    worker runs only the rest; it used to finish the episode first (here one
    of 2⁴⁰ steps) and drop the finished results."""
    spec = dict(env="rlhubtest/Endless-v0", env_spec=ars_worker.EnvAdapter(Endless()).spec(), seed=1,
                version="V1", directions=4, top=4, step_size=0.01, noise=0.01, eval_every=1, eval_episodes=1,
                max_iterations=1)
    ch = grpc.insecure_channel(hub.addr)
    client = ars_pb2_grpc.ARSStub(ch)
    try:
        # The whole run's task count, from an undisturbed run.
        client.StartRun(ars_pb2.ARSStartRunRequest(spec=ars_pb2.ARSRunSpec(**spec)))
        ref = ThreadWorker(hub.addr, "rlhubtest/Endless-v0", make_env=Endless)
        try:
            assert list(client.WatchRun(ars_pb2.ARSWatchRunRequest(run_id="run-1"), timeout=60))[-1].done
        finally:
            total = ref.stop().tasks
        assert total >= 5

        client.StartRun(ars_pb2.ARSStartRunRequest(spec=ars_pb2.ARSRunSpec(**spec)))
        stopped_at: List[int] = []
        holder: List[ars_worker.ARSWorker] = []

        def on_step(n: int) -> None:
            if n == 300:  # the task after the first, 300 steps into its episode
                stopped_at.append(n)
                holder[0].stop()

        env = Endless(shorts=2, on_step=on_step)
        first = ThreadWorker(hub.addr, "rlhubtest/Endless-v0", make_env=lambda: env, max_tasks=8)
        holder.append(first.worker)
        _wait_for(lambda: not first.thread.is_alive(), "the stopped worker to return")
        st = first.stop()
        assert stopped_at == [300]
        assert env.long_steps - 300 <= 256, env.long_steps
        assert st.tasks == 1, st
        rest = ThreadWorker(hub.addr, "rlhubtest/Endless-v0", make_env=Endless)
        try:
            assert list(client.WatchRun(ars_pb2.ARSWatchRunRequest(run_id="run-2"), timeout=60))[-1].done
        finally:
            # The finished task was reported: the rest is all that was left.
            assert rest.stop().tasks == total - 1
    finally:
        ch.close()


def test_decode_policy_rejects_bad_blobs():
    from rlhub.tensors import save_bytes
    meta = {"ars.env": "CartPole-v1", "ars.version": "V2-t", "ars.iteration": "0", "ars.seed": "1",
            "ars.hidden": "", "ars.discrete": "2", "ars.obs_dim": "4", "ars.out_dim": "2",
            "ars.directions": "8", "ars.top": "4", "ars.step_size": "0.02", "ars.noise": "0.03", "ars.shift": "0"}
    good = {"policy.weight": np.zeros((2, 4)), "filter.count": np.zeros(1), "filter.mean": np.zeros(4),
            "filter.m2": np.zeros(4)}
    p = ars_worker.decode_policy(save_bytes(good, meta))
    assert p.num_params == 8 and p.discrete
    bad_cases = [
        (dict(good, **{"policy.weight": np.zeros((4, 2))}), meta),
        (dict(good, **{"policy.weight": np.full((2, 4), np.nan)}), meta),
        (dict(good, **{"filter.m2": -np.ones(4)}), meta),
        (dict(good, extra=np.zeros(1)), meta),
        (good, dict(meta, **{"ars.version": "V3"})),
        (good, dict(meta, **{"ars.discrete": "3"})),
    ]
    for sd, md in bad_cases:
        with pytest.raises(errors.InvalidArgument):
            ars_worker.decode_policy(save_bytes(sd, md))
    with pytest.raises(errors.InvalidArgument):
        ars_worker.decode_policy(b"\x00" * 7)


class Drift(gymnasium.Env):
    """A Gymnasium env the hub has no implementation of: steer x to 0.

    x₀ ~ U(−1, 1); x ← x + 0.2·clip(a, −1, 1); reward −x²; 20 steps.
    """

    def __init__(self):
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x, self.t = 0.0, 0

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-1, 1)), 0
        return np.array([self.x]), {}

    def step(self, action):
        self.x += 0.2 * float(np.clip(action[0], -1, 1))
        self.t += 1
        return np.array([self.x]), -self.x * self.x, False, self.t >= 20, {}


gymnasium.register("rlhubtest/Drift-v0", entry_point=Drift)


def test_run_on_an_env_only_python_knows(hub, tmp_path):
    """`train ars --obs-dim/--act-dim` starts a run on a user's Gymnasium env."""
    r = hub.run_cli("train", "ars", "--hub", hub.addr, "--workers", "0", "--env", "rlhubtest/Drift-v0",
                    "--out", str(tmp_path / "x"), check=False)
    assert r.returncode != 0 and "--obs-dim" in r.stderr, r.stderr
    sp = ars_worker.EnvAdapter(gymnasium.make("rlhubtest/Drift-v0")).spec()
    assert (sp.obs_dim, sp.discrete, sp.act_dim) == (1, 0, 1)
    w = ThreadWorker(hub.addr, "rlhubtest/Drift-v0")
    try:
        s = train(hub, tmp_path / "run", "--env", "rlhubtest/Drift-v0", "--obs-dim", "1", "--act-dim", "1",
                  "--version", "V1", "--seed", "2", "--directions", "8", "--step-size", "0.5", "--noise", "0.5",
                  "--max-iterations", "8", "--eval-every", "7", "--eval-episodes", "20")
    finally:
        st = w.stop()
    assert st.tasks > 0 and s["stop_reason"] == "budget", s
    rows = curve(tmp_path / "run")
    col = rows[0].index("eval_mean")
    evals = [float(r[col]) for r in rows[1:] if r[col]]
    p = ars_worker.decode_policy((tmp_path / "run" / "policy.safetensors").read_bytes())
    assert (p.env, p.obs_dim, p.out_dim, p.discrete) == ("rlhubtest/Drift-v0", 1, 1, False)
    # θ₀ = 0 does nothing (return −Σx² ≈ −6.7); the learnt gain steers to 0.
    assert p.theta[0] < -1, p.theta
    assert evals[-1] > evals[0] + 2, evals


def test_discrete_action_is_gos_argmax():
    """Ties go to the lowest index; NaN never wins unless it is output 0."""
    cases = [([1.0, 1.0, 0.5], 0), ([0.0, 2.0, 2.0], 1), ([1.0, np.nan, 3.0], 2), ([np.nan, 5.0], 0),
             ([-np.inf, np.nan], 0), ([-0.0, 0.0], 0)]
    for out, want in cases:
        assert ars_worker._argmax_go(np.array(out)) == want, out


def test_worker_and_train_ride_out_a_hub_kill(rlhub_bin, tmp_path, monkeypatch):
    """The hub is SIGKILLed right after an iteration is recorded and restarted
    on the same --data and address: the Python worker and `train ars --hub`
    reconnect, and the policy is byte-identical to an undisturbed run's."""
    spec = ["--env", "CartPole-v1", "--seed", "3", "--directions", "8", "--top", "4",
            "--max-iterations", "6", "--eval-every", "3", "--eval-episodes", "4"]
    (tmp_path / "ref").mkdir()
    ref = Hub(rlhub_bin, tmp_path / "ref")
    w = ThreadWorker(ref.addr, "CartPole-v1")
    try:
        train(ref, tmp_path / "a", *spec)
    finally:
        w.stop()
        ref.stop()

    d = tmp_path / "dur"
    d.mkdir()
    monkeypatch.setenv("RLHUB_TEST_ARS_CRASH", "iteration:2")
    h = Hub(rlhub_bin, d)
    monkeypatch.delenv("RLHUB_TEST_ARS_CRASH")
    w = ThreadWorker(h.addr, "CartPole-v1", retry_for=60.0)
    p = subprocess.Popen([rlhub_bin, "train", "ars", "--hub", h.addr, "--workers", "0", "--no-progress",
                          "--out", str(tmp_path / "b"), *spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    h2 = None
    try:
        assert h.proc.wait(timeout=120) == -signal.SIGKILL
        h.log.close()
        h2 = Hub(rlhub_bin, d, addr=h.addr)
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, out + err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        w.stop()
        if h2 is not None:
            h2.stop()
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["hub_reconnects"] >= 1, s
    assert (tmp_path / "a" / "policy.safetensors").read_bytes() == (tmp_path / "b" / "policy.safetensors").read_bytes()
    assert [r[0] for r in curve(tmp_path / "b")[1:]] == [str(i) for i in range(7)]


class _RefusingARS:
    """A hub's ARS service answering every Attach with one code, counting them."""

    def __init__(self, code: grpc.StatusCode):
        self.code, self.attachs = code, 0

    def Attach(self, request, context):
        self.attachs += 1
        context.abort(self.code, "refused by the test")


def _serve_refusing(code: grpc.StatusCode):
    from concurrent import futures

    svc = _RefusingARS(code)
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler("rlhub.v1.ARS", {
        "Attach": grpc.unary_unary_rpc_method_handler(
            svc.Attach,
            request_deserializer=ars_worker.ars_pb2.ARSAttachRequest.FromString,
            response_serializer=ars_worker.ars_pb2.ARSAttachResponse.SerializeToString),
    })
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    return svc, srv, f"127.0.0.1:{port}"


def test_worker_does_not_retry_a_permanent_refusal():
    """A worker whose credentials lack the right gets PermissionDenied once
    and raises it, instead of retrying it for retry_for (60 s here); an
    Unavailable hub is retried."""
    svc, srv, addr = _serve_refusing(grpc.StatusCode.PERMISSION_DENIED)
    try:
        with ars_worker.ARSWorker(addr, "CartPole-v1", retry_for=60.0) as w:
            with pytest.raises(errors.PermissionDenied):
                w.run()
        assert svc.attachs == 1
    finally:
        srv.stop(None)
    svc, srv, addr = _serve_refusing(grpc.StatusCode.UNAVAILABLE)
    try:
        with ars_worker.ARSWorker(addr, "CartPole-v1", retry_for=1.0) as w:
            with pytest.raises(errors.Unavailable):
                w.run()
        assert svc.attachs > 1
    finally:
        srv.stop(None)
# ---------------------------------------------------------------------------
# Dict observation spaces (issue 19: Machin's per-key MeanStdFilter)


class GoDictReach(gymnasium.Env):
    """internal/env/dictreach in Python with a Gymnasium ``Dict`` observation
    space {goal, position, velocity} and Go's PCG reset: a Python worker on it
    must give the Go worker's bytes on the Go env."""

    def __init__(self):
        box = lambda: gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float64)  # noqa: E731
        # A plain dict: Gymnasium sorts its keys, the order it flattens in.
        self.observation_space = gymnasium.spaces.Dict({"velocity": box(), "goal": box(), "position": box()})
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float64)
        self.goal, self.pos, self.vel, self.t = [0.0] * 2, [0.0] * 2, [0.0] * 2, 0

    def _obs(self) -> dict:
        return {"goal": np.array(self.goal), "position": np.array(self.pos), "velocity": np.array(self.vel)}

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        rng = GoPCG(seed & _M64, seed >> 64)
        self.goal = [-3 + 6 * rng.float64() for _ in range(2)]
        self.pos = [-0.5 + 1.0 * rng.float64() for _ in range(2)]
        self.vel, self.t = [0.0, 0.0], 0
        return self._obs(), {}

    def step(self, action):
        cost = 0.0
        for i in range(2):
            a = max(-1.0, min(1.0, float(action[i])))
            cost += 0.01 * a * a
            self.vel[i] = max(-2.0, min(2.0, self.vel[i] + 0.2 * a))
            self.pos[i] += 0.1 * self.vel[i]
        dx, dy = self.pos[0] - self.goal[0], self.pos[1] - self.goal[1]
        self.t += 1
        return self._obs(), -0.1 * math.sqrt(dx * dx + dy * dy) - cost, False, self.t >= 100, {}


gymnasium.register("rlhubtest/DictReach-v0", entry_point=GoDictReach)

DICT_KEYS = (("goal", 2), ("position", 2), ("velocity", 2))
DICT_SPEC = ["--seed", "3", "--version", "V2", "--directions", "6", "--step-size", "0.05", "--noise", "0.05",
             "--max-iterations", "10", "--eval-every", "5", "--eval-episodes", "8"]


def test_dict_env_bit_identical_to_go_worker(rlhub_bin, tmp_path):
    """Go worker on DictReach-v0 vs Python worker on its Gymnasium Dict port,
    with Adam and clipping: same policy bytes (per-key filters included)."""
    spec = ["--env", "DictReach-v0", *DICT_SPEC, "--optimizer", "adam", "--gradient-max", "0.5"]
    go_hub = Hub(rlhub_bin, (tmp_path / "go").mkdir() or tmp_path / "go")
    try:
        run_go_worker(go_hub, tmp_path / "go" / "run", spec)
    finally:
        go_hub.stop()
    py_hub = Hub(rlhub_bin, (tmp_path / "py").mkdir() or tmp_path / "py")
    try:
        w = ThreadWorker(py_hub.addr, "DictReach-v0", make_env=GoDictReach)
        try:
            s = train(py_hub, tmp_path / "py" / "run", *spec)
        finally:
            st = w.stop()
    finally:
        py_hub.stop()
    assert st.tasks > 0
    assert curve(tmp_path / "py" / "run") == curve(tmp_path / "go" / "run")
    py_blob = (tmp_path / "py" / "run" / "policy.safetensors").read_bytes()
    assert py_blob == (tmp_path / "go" / "run" / "policy.safetensors").read_bytes()
    p = ars_worker.decode_policy(py_blob)
    assert p.obs_keys == DICT_KEYS and p.count > 0, p.obs_keys
    assert s["optimizer"]["kind"] == "adam" and s["gradient_max"] == 0.5, s
    assert sorted(s["filters"]) == ["goal", "position", "velocity"], s


def test_dict_env_filters_identical_across_python_worker_counts(hub, rlhub_bin, tmp_path):
    """A Gymnasium Dict env the hub does not know (``--obs-keys``) trains from
    1, 2 and 3 Python workers to byte-identical policies, and each key's
    filter in summary.json is the policy's statistics for that key."""
    sp = ars_worker.EnvAdapter(gymnasium.make("rlhubtest/DictReach-v0")).spec()
    assert [(k.name, k.dim) for k in sp.obs_keys] == list(DICT_KEYS) and sp.obs_dim == 6
    r = subprocess.run([sys.executable, "-c", "import test_ars_worker, sys; from rlhub import ars_worker; "
                        "sys.exit(ars_worker.main(['--env', 'rlhubtest/DictReach-v0', '--print-env-spec']))"],
                       env=dict(PYENV, PYTHONPATH=str(REPO / "python") + os.pathsep + str(REPO / "python" / "tests")),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().endswith("--obs-dim 6 --act-dim 2 --obs-keys goal:2,position:2,velocity:2"), r.stdout + r.stderr
    blobs, sums = [], []
    for n in (1, 2, 3):
        h = Hub(rlhub_bin, (tmp_path / f"h{n}").mkdir() or tmp_path / f"h{n}")
        try:
            ws = [ThreadWorker(h.addr, "rlhubtest/DictReach-v0") for _ in range(n)]
            try:
                sums.append(train(h, tmp_path / f"run{n}", "--env", "rlhubtest/DictReach-v0", "--obs-dim", "6",
                                  "--act-dim", "2", "--obs-keys", "goal:2,position:2,velocity:2", *DICT_SPEC))
            finally:
                stats = [w.stop() for w in ws]
        finally:
            h.stop()
        assert all(s.tasks > 0 for s in stats) or n == 1, [s.tasks for s in stats]
        blobs.append((tmp_path / f"run{n}" / "policy.safetensors").read_bytes())
    assert blobs[0] == blobs[1] == blobs[2]
    rows = curve(tmp_path / "run1")
    col = rows[0].index("eval_mean")
    evals = [float(r[col]) for r in rows[1:] if r[col]]
    assert evals[-1] > evals[0] + 2, evals  # θ₀ = 0 stays put (≈ −22); it learns to reach
    p = ars_worker.decode_policy(blobs[0])
    assert p.obs_keys == DICT_KEYS
    for name, (count, mean, m2) in p.filters_by_key().items():
        f = sums[0]["filters"][name]
        assert f["count"] == count and f["mean"] == list(mean), (name, f)
        assert np.allclose(f["std"], np.sqrt(m2 / (count - 1)), rtol=0, atol=0), name
    # The keys' scales differ, so their filters do: the goal spreads over
    # [-3, 3], the velocity starts at rest.
    by = sums[0]["filters"]
    assert by["goal"]["std"][0] > 2 * by["velocity"]["std"][0], by
    # A layout that disagrees with the env's is refused by the worker.
    bad = dataclasses.replace(p, obs_keys=(("position", 2), ("goal", 2), ("velocity", 2)))
    with pytest.raises(errors.InvalidArgument, match="observation keys"):
        ars_worker.EnvAdapter(gymnasium.make("rlhubtest/DictReach-v0")).check(bad)


def test_per_key_filters_equal_machins_running_stats():
    """A direction task's statistics, split by key, are Machin's per-key
    filter statistics (one RunningStat per state key, pushed every state the
    policy acts on) over the same states, in torch float64."""
    import torch
    from rlhub.tensors import save_bytes

    class Recording(GoDictReach):
        def __init__(self):
            super().__init__()
            self.episodes: List[List[dict]] = []

        def reset(self, **kw):
            obs, info = super().reset(**kw)
            self.episodes.append([obs])
            return obs, info

        def step(self, action):
            out = super().step(action)
            self.episodes[-1].append(out[0])
            return out

    meta = {"ars.env": "DictReach-v0", "ars.version": "V2", "ars.iteration": "0", "ars.seed": "9", "ars.hidden": "",
            "ars.discrete": "0", "ars.obs_dim": "6", "ars.out_dim": "2", "ars.directions": "4", "ars.top": "4",
            "ars.step_size": "0.02", "ars.noise": "0.5", "ars.shift": "0",
            "ars.obs_keys": json.dumps([{"name": n, "dim": d} for n, d in DICT_KEYS])}
    rng = np.random.default_rng(1)
    blob = save_bytes({"policy.weight": rng.normal(0, 0.5, (2, 6)), "filter.count": np.zeros(1),
                       "filter.mean": np.zeros(6), "filter.m2": np.zeros(6)}, meta)
    p = ars_worker.decode_policy(blob)
    env = Recording()
    res = ars_worker.run_task(p, ars_worker.EnvAdapter(env), 1, 2)
    # Machin's RunningStat, restated: n, M (mean), S (variance·(n − 1));
    # the first state sets M, later ones add δ/n to M and δ²·(n−1)/n to S.
    machin = {}
    for episode in env.episodes:
        for obs in episode[:-1]:  # the final state is never acted on
            for k, v in obs.items():
                x = torch.tensor(v, dtype=torch.float64)
                n, m, s = machin.get(k, (0, torch.zeros_like(x), torch.zeros_like(x)))
                n += 1
                if n == 1:
                    m = x.clone()
                else:
                    d = x - m
                    m = m + d / n
                    s = s + d * d * (n - 1) / n
                machin[k] = (n, m, s)
    got = dataclasses.replace(p, count=res.stats.count, mean=np.array(res.stats.mean), m2=np.array(res.stats.m2))
    by = got.filters_by_key()
    assert list(by) == [k for k, _ in DICT_KEYS] == sorted(machin)
    for k, (count, mean, m2) in by.items():
        n, m, s = machin[k]
        assert count == n == res.steps, (k, count, n)
        np.testing.assert_allclose(mean, m.numpy(), rtol=1e-12, atol=1e-15, err_msg=k)
        np.testing.assert_allclose(m2, s.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
