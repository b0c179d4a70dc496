#!/usr/bin/env python3
"""Record long, closed-loop, multi-episode trajectories of Gymnasium's MuJoCo
v5 tasks for the Go environments in internal/env/mjenv to replay
(TestLongTrajectories, and TestReferenceReport with RLHUB_MJ_REFDIR).

Where scripts/mujoco_reference.py records two 40-step open-loop runs per
task, this records episodes back to back until --steps steps per task:
each episode starts from Gymnasium's own next reset (reset(seed=SEED) once,
then reset() with the environment's generator, so the reset noise of every
episode is Gymnasium's), and its actions come from a closed-loop policy of
the kind ARS trains: a = W·(obs − mean)/std + u, with W a random linear
policy drawn per episode, the observation normalised by fixed per-task
statistics taken from the first episode's states, and u uniform noise of a
per-episode scale in [0, 0.6] × the action bounds. The policy exercises
what ARS training does: long episodes, ground contacts, actions beyond the
bounds (MuJoCo's clamping and the control cost of out-of-range actions),
terminations and, where an episode lasts, the 1000-step truncation.

Each record holds the initial (qpos, qvel) in full precision, the actions
in full precision, every observation (12 significant digits), reward and
terminated/truncated, and every SYNC steps the full state (see SYNC). The
Go test sets the same initial state, applies the same actions and, at each
sync point, restarts from Gymnasium's state; it also reports how long each
episode agrees without the restarts.

    /tmp/mj237/bin/python scripts/mujoco_longcheck.py --steps 300 --cap \\
        --out internal/env/mjenv/testdata/long-mujoco-2.3.7
    /tmp/mj237/bin/python scripts/mujoco_longcheck.py --steps 5000 --out /tmp/long   # make mujoco-check

Files are gzipped JSON (TASK.json.gz), a list of episode records.
"""
import argparse
import gzip
import json
import os
import tempfile

import gymnasium as gym
import mujoco
import numpy as np

TASKS = ["Walker2d-v5", "Ant-v5", "Hopper-v5", "HalfCheetah-v5", "Swimmer-v5", "Humanoid-v5"]
SEED = 21
# Humanoid's observation has 348 values: fewer steps keep the committed file small.
CAP = {"Humanoid-v5": 100}
# Every SYNC steps of an episode the full simulation state (qpos, qvel and
# the solver's warm start qacc_warmstart) is recorded in full precision, so
# the Go replay can restart from Gymnasium's exact state: contact dynamics
# are chaotic, and rounding differences of 1e-12 grow past any fixed
# tolerance within ~100 steps of a contact-rich episode (Ant).
SYNC = 25


def r(xs):
    return [float(f"{x:.12g}") for x in np.asarray(xs, dtype=np.float64).ravel()]


def record(task, steps, max_episode_steps):
    env = gym.make(task, max_episode_steps=max_episode_steps) if max_episode_steps else gym.make(task)
    rng = np.random.default_rng(SEED)
    low, high = env.action_space.low.astype(np.float64), env.action_space.high.astype(np.float64)
    recs, total, seed = [], 0, SEED
    mean = std = None
    while total < steps:
        obs, _ = env.reset(seed=seed)
        seed = None  # later episodes: the environment's own generator
        u = env.unwrapped
        rec = {"task": task, "gymnasium_version": gym.__version__, "mujoco_version": mujoco.__version__,
               "seed": SEED, "episode": len(recs), "qpos": [float(x) for x in u.data.qpos],
               "qvel": [float(x) for x in u.data.qvel], "obs0": r(obs),
               "actions": [], "obs": [], "reward": [], "terminated": [], "truncated": [], "sync": []}
        first = mean is None
        if first:  # the first episode: open-loop noise, to collect statistics
            w, scale, seen = None, 0.3, [obs]
        else:
            w = rng.normal(0.0, 0.3, size=(low.size, obs.size))
            scale = rng.uniform(0.0, 0.6)
        while total < steps:
            k = len(rec["actions"])
            if k > 0 and k % SYNC == 0:
                rec["sync"].append({"step": k, "qpos": [float(x) for x in u.data.qpos],
                                    "qvel": [float(x) for x in u.data.qvel],
                                    "qacc_warmstart": [float(x) for x in u.data.qacc_warmstart]})
            a = rng.uniform(scale * low, scale * high)
            if w is not None:
                a = a + w @ ((obs - mean) / std) * (high - low) / 2
            obs, reward, terminated, truncated, _ = env.step(a)
            total += 1
            if first:
                seen.append(obs)
            rec["actions"].append([float(x) for x in a])
            rec["obs"].append(r(obs))
            rec["reward"].append(float(reward))
            rec["terminated"].append(bool(terminated))
            rec["truncated"].append(bool(truncated))
            if terminated or truncated:
                break
        if first:
            s = np.asarray(seen)
            mean, std = s.mean(axis=0), s.std(axis=0) + 1e-2
        recs.append(rec)
    env.close()
    return recs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per task (episodes back to back)")
    p.add_argument("--cap", action="store_true", help="Humanoid-v5 at most 100 steps (the committed files)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.chdir(tempfile.mkdtemp(prefix="mujoco_longcheck."))  # MUJOCO_LOG.TXT stays out of the repository
    for task in args.tasks.split(","):
        recs = record(task, min(args.steps, CAP.get(task, args.steps)) if args.cap else args.steps, None)
        path = os.path.join(out, task + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps(recs, separators=(",", ":")).encode() + b"\n")
        lens = [len(x["reward"]) for x in recs]
        ends = sum(x["terminated"][-1] for x in recs if x["terminated"])
        print(f"{path}: {sum(lens)} steps in {len(recs)} episodes (longest {max(lens)}, {ends} terminated);"
              f" mujoco {mujoco.__version__}, gymnasium {gym.__version__}", flush=True)


if __name__ == "__main__":
    main()
