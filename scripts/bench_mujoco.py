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


def timed(chunk, seconds):
    """Calls chunk() — it steps an env and returns how many steps it took —
    until `seconds` of wall time have passed. Returns (steps per CPU-second
    of this process, user + system; steps per wall-clock second)."""
    steps = 0
    start, cpu0 = time.perf_counter(), time.process_time()
    while True:
        steps += chunk()
        now = time.perf_counter()
        if now - start >= seconds:
            break
    return steps / (time.process_time() - cpu0), steps / (now - start)


def bench_gymnasium(seconds, stepper):
    """Steps/s of every task under this interpreter's Gymnasium, stepped
    through gymnasium.make(task) ("make", with its default wrappers, as users
    step it) and env.unwrapped ("unwrapped", the bare MuJoCo env).
    stepper(task, env, step) returns the chunk that timed() calls: env is the
    made env (reset it with env.reset), step the step function to time."""
    import gymnasium as gym
    import mujoco

    out = {"mujoco": mujoco.__version__, "gymnasium": gym.__version__, "python": sys.version.split()[0], "tasks": {}}
    for task in TASKS:
        res = {}
        for mode in ("make", "unwrapped"):
            env = gym.make(task)
            chunk = stepper(task, env, env.step if mode == "make" else env.unwrapped.step)
            env.reset(seed=1)
            res[mode], res[mode + "_wall"] = timed(chunk, seconds)
            env.close()
        out["tasks"][task] = res
    return out


def random_actions(task, env, step):
    """256 steps a chunk from a fixed table of 1024 uniform random actions,
    resetting whenever an episode ends."""
    import numpy as np

    rng = np.random.default_rng(1)
    sp = env.action_space
    acts = [rng.uniform(sp.low, sp.high).astype(np.float32) for _ in range(1024)]
    steps = episode_steps = 0

    def chunk():
        nonlocal steps, episode_steps
        for _ in range(256):
            _, _, term, trunc, _ = step(acts[steps % 1024])
            steps += 1
            episode_steps += 1
            # The unwrapped env has no TimeLimit: apply Gymnasium's 1000.
            if term or trunc or episode_steps >= 1000:
                env.reset()
                episode_steps = 0
        return 256
    return chunk


def bench_python(seconds):
    """Steps/s of every task under this interpreter's Gymnasium, random actions."""
    return bench_gymnasium(seconds, random_actions)


def go_bench_rates(out, bench, who):
    """{task: {"cpu": steps per CPU-second, "wall": steps/s}} from the output
    of a Go benchmark `bench` whose sub-benchmarks are TASKS (as
    internal/env/mjenv's BenchmarkStep and BenchmarkReplayLong report them).
    Exits naming `who` when a task is missing."""
    res = {}
    for line in out.splitlines():
        m = re.match(bench + r"/(\S+?)(?:-\d+)?\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) steps/cpu-s\s+([\d.]+) steps/s", line)
        if m:
            res[m.group(1)] = {"cpu": float(m.group(2)), "wall": float(m.group(3))}
    if set(res) != set(TASKS):
        sys.exit(f"{who}: could not parse the Go benchmark output:\n{out}")
    return res


def bench_go(seconds):
    env = dict(os.environ, GOEXPERIMENT="simd")
    cmd = ["go", "test", "-tags", "mujoco", "-run", "^$", "-bench", "^BenchmarkStep$", "-cpu", "1",
           "-benchtime", f"{seconds}s", "-count", "1", "./internal/env/mjenv"]
    print("$", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return go_bench_rates(out, "BenchmarkStep", "bench_mujoco")


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
