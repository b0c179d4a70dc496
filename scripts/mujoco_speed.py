#!/usr/bin/env python3
"""Env steps per second of rlhub's Go MuJoCo ports against Gymnasium's own
v5 environments, on the same policy and the same steps (issue 21).

Both sides replay the committed closed-loop episodes of
internal/env/mjenv/testdata/long-mujoco-2.3.7 (scripts/mujoco_longcheck.py:
Gymnasium's initial states, a random linear policy on the normalised
observation plus noise, Gymnasium's recorded actions; 300 steps per task,
Humanoid 100), episode after episode, for --seconds per measurement:

- Go: `BenchmarkReplayLong` (internal/env/mjenv, -cpu 1), built twice: linked
  against Debian's libmujoco 2.2.2 (the default build) and against the
  libmujoco 2.3.7 of pip's mujoco wheel (scripts/mujoco_fast.sh);
- Python: gymnasium.make(task) (with its default wrappers, as users step it)
  and env.unwrapped, each episode from env.reset() then set_state(qpos, qvel).

Two rates: steps per CPU-second of the process (user + system; what one
core delivers, and little disturbed by other load on a shared machine) and
steps per wall-clock second. Rounds are interleaved and the best of each is
reported. Run it with the interpreter of the mujoco 2.3.7 virtualenv:

    ~/.cache/rlhub/venv-mujoco-2.3.7/bin/python scripts/mujoco_speed.py [--seconds 3] [--rounds 2]

Prints a Markdown table (docs/mujoco.md, "Speed").
"""
import argparse
import gzip
import json
import os
import subprocess
import tempfile

# The timing loop, the Go benchmark parser and the task list are
# bench_mujoco.py's: the two scripts differ only in what a chunk of steps is.
from bench_mujoco import ROOT, TASKS, bench_gymnasium, best, go_bench_rates

LONG = os.path.join(ROOT, "internal/env/mjenv/testdata/long-mujoco-2.3.7")


def records(task):
    with gzip.open(os.path.join(LONG, task + ".json.gz")) as f:
        return json.load(f)


def replay(task, env, step):
    """One chunk: every recorded episode of the task, each from env.reset()
    then set_state(qpos, qvel), stepped with its recorded actions."""
    import numpy as np

    recs = [(np.array(r["qpos"]), np.array(r["qvel"]), [np.array(a) for a in r["actions"]]) for r in records(task)]
    u = env.unwrapped

    def chunk():
        steps = 0
        for qpos, qvel, acts in recs:
            env.reset()
            u.set_state(qpos, qvel)
            for a in acts:
                step(a)
            steps += len(acts)
        return steps
    return chunk


def build_go(fast):
    """A test binary of internal/env/mjenv, linked to Debian's or the wheel's libmujoco."""
    exe = os.path.join(tempfile.gettempdir(), f"mujoco_speed.{os.getpid()}.{'fast' if fast else 'debian'}.test")
    env = dict(os.environ, GOEXPERIMENT="simd")
    if fast:
        out = subprocess.run(["bash", "-c", "source scripts/mujoco_fast.sh >&2 && echo \"$CGO_CFLAGS\" && echo \"$CGO_LDFLAGS\""],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout.splitlines()
        env["CGO_CFLAGS"], env["CGO_LDFLAGS"] = out[0], out[1]
    subprocess.run(["go", "test", "-tags", "mujoco", "-c", "-o", exe, "./internal/env/mjenv"], cwd=ROOT, env=env, check=True)
    return exe


def bench_go(exe, seconds):
    cmd = [exe, "-test.run", "^$", "-test.bench", "^BenchmarkReplayLong$", "-test.cpu", "1",
           "-test.benchtime", f"{seconds}s", "-test.count", "1"]
    out = subprocess.run(cmd, cwd=os.path.join(ROOT, "internal/env/mjenv"), check=True, capture_output=True, text=True).stdout
    return go_bench_rates(out, "BenchmarkReplayLong", "mujoco_speed")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time per task and variant")
    p.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; the best is reported")
    args = p.parse_args()
    exes = {"debian": build_go(False), "fast": build_go(True)}
    os.chdir(tempfile.mkdtemp(prefix="mujoco_speed."))  # MUJOCO_LOG.TXT stays out of the repository
    load_before = os.getloadavg()
    go = {"debian": None, "fast": None}
    py = None
    for _ in range(args.rounds):
        for k, exe in exes.items():
            go[k] = best(go[k], bench_go(exe, args.seconds))
        py = best(py, bench_gymnasium(args.seconds, replay))
    load_after = os.getloadavg()
    for exe in exes.values():
        os.remove(exe)
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs; "
          f"Gymnasium {py['gymnasium']} on MuJoCo {py['mujoco']}; best of {args.rounds} rounds of {args.seconds:g} s")
    for metric, title in (("cpu", "steps per CPU-second (one core)"), ("wall", "steps per wall-clock second")):
        sfx = "" if metric == "cpu" else "_wall"
        print(f"\n{title}\n")
        print("| task | Go, MuJoCo 2.2.2 (Debian) | Go, MuJoCo 2.3.7 (wheel) | Gymnasium make | Gymnasium unwrapped "
              "| Go 2.2.2 ÷ make | Go 2.3.7 ÷ make |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for task in TASKS:
            d, f, t = go["debian"][task][metric], go["fast"][task][metric], py["tasks"][task]
            print(f"| {task} | {d:,.0f} | {f:,.0f} | {t['make' + sfx]:,.0f} | {t['unwrapped' + sfx]:,.0f} "
                  f"| {d / t['make' + sfx]:.2f} | {f / t['make' + sfx]:.2f} |")


if __name__ == "__main__":
    main()
