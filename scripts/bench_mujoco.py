#!/usr/bin/env python3
"""Env steps per second on one core for the MuJoCo locomotion tasks: the Go
environments (internal/env/mjenv, Debian's MuJoCo) next to the same tasks
stepped by Gymnasium in Python, measured in one run on the same machine.

Protocol, identical on both sides: one process, one thread; a fixed table of
1024 uniformly random actions within the bounds; Reset whenever an episode
terminates or truncates (its time included); a fixed number of seconds per
task. Two rates: steps per CPU-second of the process (user + system; what
one core delivers, and little disturbed by other load on a shared machine)
and steps per wall-clock second. Go: BenchmarkStep via `go test -cpu 1
-benchtime`. Python: gymnasium.make(task) (with its default wrappers, as
users step it) and, separately, env.unwrapped (the bare MuJoCo env). The
whole set is measured --rounds times, interleaved, and the best round of
each is reported.

    python3 scripts/bench_mujoco.py [--seconds 2] [--rounds 2] [--python /path/to/other/python ...]

Each --python interpreter (for example a virtualenv with another MuJoCo
release) is measured too. Needs go, Debian's libmujoco-dev and
pip install 'gymnasium[mujoco]'. Prints a Markdown table.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

TASKS = ["HalfCheetah-v5", "Hopper-v5", "Swimmer-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def bench_python(seconds):
    """Steps/s of every task under this interpreter's Gymnasium."""
    import gymnasium as gym
    import mujoco
    import numpy as np

    out = {"mujoco": mujoco.__version__, "gymnasium": gym.__version__, "python": sys.version.split()[0], "tasks": {}}
    for task in TASKS:
        res = {}
        for mode in ("make", "unwrapped"):
            env = gym.make(task)
            step_env = env if mode == "make" else env.unwrapped
            rng = np.random.default_rng(1)
            sp = env.action_space
            acts = [rng.uniform(sp.low, sp.high).astype(np.float32) for _ in range(1024)]
            env.reset(seed=1)
            steps, episode_steps = 0, 0
            start, cpu0 = time.perf_counter(), time.process_time()
            deadline = start + seconds
            while True:
                for _ in range(256):
                    _, _, term, trunc, _ = step_env.step(acts[steps % 1024])
                    steps += 1
                    episode_steps += 1
                    # The unwrapped env has no TimeLimit: apply Gymnasium's 1000.
                    if term or trunc or episode_steps >= 1000:
                        env.reset()
                        episode_steps = 0
                now = time.perf_counter()
                if now >= deadline:
                    break
            res[mode] = steps / (time.process_time() - cpu0)
            res[mode + "_wall"] = steps / (now - start)
            env.close()
        out["tasks"][task] = res
    return out


def bench_go(seconds):
    env = dict(os.environ, GOEXPERIMENT="simd")
    cmd = ["go", "test", "-tags", "mujoco", "-run", "^$", "-bench", "^BenchmarkStep$", "-cpu", "1",
           "-benchtime", f"{seconds}s", "-count", "1", "./internal/env/mjenv"]
    print("$", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.match(r"BenchmarkStep/(\S+?)(?:-\d+)?\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) steps/cpu-s\s+([\d.]+) steps/s", line)
        if m:
            res[m.group(1)] = {"cpu": float(m.group(2)), "wall": float(m.group(3))}
    if set(res) != set(TASKS):
        sys.exit(f"bench_mujoco: could not parse the Go benchmark output:\n{out}")
    return res


def best(a, b):
    """Per-key maximum of two results of the same shape."""
    if a is None:
        return b
    if isinstance(a, dict):
        return {k: best(a[k], b[k]) for k in a}
    return max(a, b) if isinstance(a, float) else a


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="measuring time per task and variant")
    p.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; the best is reported")
    p.add_argument("--python", action="append", default=[], help="another interpreter to measure as well")
    p.add_argument("--python-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    # MuJoCo's Python bindings append warnings to MUJOCO_LOG.TXT in the
    # working directory; keep that out of the repository.
    os.chdir(tempfile.mkdtemp(prefix="bench_mujoco."))
    if args.python_only:
        json.dump(bench_python(args.seconds), sys.stdout)
        return

    load_before = os.getloadavg()
    go, pys = None, [None] * (1 + len(args.python))
    for _ in range(args.rounds):
        go = best(go, bench_go(args.seconds))
        pys[0] = best(pys[0], bench_python(args.seconds))
        for i, interp in enumerate(args.python):
            print("$", interp, __file__, "--python-only", file=sys.stderr)
            r = subprocess.run([interp, os.path.abspath(__file__), "--python-only", "--seconds", str(args.seconds)],
                               check=True, capture_output=True, text=True)
            pys[i + 1] = best(pys[i + 1], json.loads(r.stdout))
    load_after = os.getloadavg()

    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs; "
          f"Python {pys[0]['python']}; best of {args.rounds} rounds of {args.seconds:g} s per measurement")
    for metric, title in (("cpu", "steps per CPU-second (one core)"), ("wall", "steps per wall-clock second")):
        sfx = "" if metric == "cpu" else "_wall"
        head = "| task | Go, MuJoCo 2.2.2 (Debian) |"
        sep = "| --- | ---: |"
        for py in pys:
            head += f" Gymnasium {py['gymnasium']} make, MuJoCo {py['mujoco']} | unwrapped | Go ÷ make |"
            sep += " ---: | ---: | ---: |"
        print(f"\n{title}\n\n{head}\n{sep}")
        for task in TASKS:
            row = f"| {task} | {go[task][metric]:,.0f} |"
            for py in pys:
                t = py["tasks"][task]
                row += f" {t['make' + sfx]:,.0f} | {t['unwrapped' + sfx]:,.0f} | {go[task][metric] / t['make' + sfx]:.2f} |"
            print(row)


if __name__ == "__main__":
    main()
