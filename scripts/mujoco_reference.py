#!/usr/bin/env python3
"""Record reference trajectories of Gymnasium's MuJoCo v5 tasks for the Go
environments in internal/env/mjenv to replay (TestReferenceTrajectories).

For each task and each of two action scales: gym.make(task),
reset(seed=SEED), record the initial (qpos, qvel) and observation, then
apply up to HORIZON actions drawn uniformly from scale x the action bounds
and record observation, reward, terminated and truncated after each step,
stopping at termination. Scale 1.2 goes beyond the bounds (exercising
MuJoCo's control clamping and the cost of out-of-range actions) and makes
the unstable robots fall within a few steps (exercising termination);
scale 0.2 keeps them up longer.

    python3 scripts/mujoco_reference.py [--horizon 40] [--out DIR]

The default DIR is internal/env/mjenv/testdata/mujoco-<MuJoCo version>.
Needs: pip install 'gymnasium[mujoco]'. The files committed were made with
Gymnasium 1.4.0 and two MuJoCo releases, each in its own virtualenv:

    python3 -m venv --system-site-packages /tmp/mj237
    /tmp/mj237/bin/pip install mujoco==2.3.7
    /tmp/mj237/bin/python scripts/mujoco_reference.py
    python3 scripts/mujoco_reference.py          # with mujoco 4.0.0
"""
import argparse
import json
import os
import tempfile

import gymnasium as gym
import mujoco
import numpy as np

TASKS = ["HalfCheetah-v5", "Hopper-v5", "Swimmer-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]
SEED = 7
SCALES = [1.2, 0.2]
# Humanoid's observation has 348 values; fewer steps keep its file small.
MAX_STEPS = {"Humanoid-v5": 20}


def r(xs):
    # 12 significant digits: far below any tolerance the comparison uses,
    # and it keeps Humanoid's 348-value observations small.
    return [float(f"{x:.12g}") for x in np.asarray(xs, dtype=np.float64).ravel()]


def record(task, scale, horizon):
    env = gym.make(task)
    obs, _ = env.reset(seed=SEED)
    u = env.unwrapped
    rec = {
        "task": task,
        "gymnasium_version": gym.__version__,
        "mujoco_version": mujoco.__version__,
        "seed": SEED,
        "action_scale": scale,
        "qpos": [float(x) for x in u.data.qpos],
        "qvel": [float(x) for x in u.data.qvel],
        "obs0": r(obs),
        "actions": [],
        "obs": [],
        "reward": [],
        "terminated": [],
        "truncated": [],
    }
    rng = np.random.default_rng(SEED)
    low, high = env.action_space.low.astype(np.float64), env.action_space.high.astype(np.float64)
    for _ in range(horizon):
        a = rng.uniform(scale * low, scale * high)
        obs, reward, terminated, truncated, _ = env.step(a)
        rec["actions"].append([float(x) for x in a])
        rec["obs"].append(r(obs))
        rec["reward"].append(float(reward))
        rec["terminated"].append(bool(terminated))
        rec["truncated"].append(bool(truncated))
        if terminated or truncated:
            break
    env.close()
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--horizon", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "internal", "env", "mjenv",
                                   "testdata", "mujoco-" + mujoco.__version__)
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    # MuJoCo's Python bindings append warnings to MUJOCO_LOG.TXT in the
    # working directory; keep that out of the repository.
    os.chdir(tempfile.mkdtemp(prefix="mujoco_reference."))
    for task in TASKS:
        recs = [record(task, s, min(args.horizon, MAX_STEPS.get(task, args.horizon))) for s in SCALES]
        path = os.path.join(out, task + ".json")
        with open(path, "w") as f:
            json.dump(recs, f, separators=(",", ":"))
            f.write("\n")
        steps = ", ".join(f"scale {r['action_scale']}: {len(r['reward'])} steps" for r in recs)
        print(f"{path}: {steps}; mujoco {mujoco.__version__}, gymnasium {gym.__version__}")


if __name__ == "__main__":
    main()
