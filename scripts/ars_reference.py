#!/usr/bin/env python3
"""An independent ARS reference on Gymnasium's MuJoCo v5 tasks (issue 8).

Follows the ARS authors' training loop (modestyachts/ARS, code/ars.py with
one worker, policies.py, filter.py; Mania, Guy & Recht 2018, Algorithm 2)
step by step, in one process, with numpy and gymnasium only, deterministic
given the seed. It counts training episodes to the paper's threshold with
the evaluation rule of `rlhub bench ars-paper`, so its per-seed table can be
set next to rlhub's (docs/benchlog/2026-11-30-sessions-1-4.md, "2026-11-30 session 2").

What it does per iteration j (θ is the linear policy, zero at start):

1. For each of N directions: an offset into a fixed noise table (numpy
   RandomState(12345) normals; the authors use 250 M entries, this script
   --table entries) drawn by RandomState(seed + 7), δ = table[i:i+dim];
   one episode of θ + νδ then one of θ − νδ, each from the next reset of one
   environment seeded once with `seed` (so + and − start from different
   states, as in the authors' code). Every reward has `shift` subtracted.
   Every state the policy acts on is pushed into the running statistics.
2. Keep the directions whose max(r+, r−) is ≥ the 100·(1 − b/N) percentile
   of the N maxima (np.percentile, linear interpolation: b directions unless
   ties); divide the kept 2b rewards by their population std;
   θ += α/b' · Σ (r+ − r−) δ over the b' kept directions.
3. V2: after the update the filter's std becomes the running std over all
   training states so far (sample variance; a component with std < 1e-7 is
   treated as infinite, i.e. normalised to 0), and states are normalised as
   (x − mean)/(std + 1e-8). In the authors' filter the mean used for
   normalising is the running-mean array itself, so it moves with every
   training state a worker pushes, while the std changes only at the sync
   (once per iteration). With one worker that mean is the running mean of
   all training states so far. --frozen-mean freezes it with the std
   instead (Algorithm 2 as written, and rlhub). Iteration 0 uses mean 0,
   std 1. Evaluation never updates the statistics.

--crn starts both rollouts of a direction from the same state (a reset
seed drawn per direction from RandomState(seed + 11)), as rlhub does;
with --crn --frozen-mean the script runs rlhub's variant of the algorithm.

Evaluation (--protocol, as `rlhub train ars --protocol`): at iterations
0, K, 2K, … and once after the last iteration the budget allows, θ_j is
run for E episodes with no shift and the statistics not updated, on a
separate evaluation environment (seeded seed + 1_000_003, so evaluation
does not change training); the run succeeds at the first mean ≥
threshold, and its episodes are the training episodes behind θ_j (2N·j).
`paper` (the default; the paper's and the authors' code's rule, and
rlhub's default): K = 10, E = 100, and a policy that reaches the
threshold is evaluated again on 100 fresh episodes (a third environment,
seeded seed + 2_000_003), reported as confirm_eval / held, as rlhub's
summary does. `fast` (rlhub's earlier, optimistic rule): K ≈ 5% of the
paper's episodes (the table below, internal/ars/defaults.go), E = 10, no
re-evaluation. The budget is --budget-factor × the paper's episodes;
training stops at the last whole iteration inside it. The
hyperparameters are the paper's appendix values, as rlhub's.

    nice -n 19 python3 scripts/ars_reference.py --task Hopper-v5 --seeds 1-10 \\
        --budget-factor 2 --out docs/results/ars-reference-hopper-v5-paper.json

Writes a JSON report (per seed: episodes to threshold or null, best and
final evaluation, evaluation curve, steps, wall and CPU seconds) and prints
a Markdown row per seed.
"""
import argparse
import json
import multiprocessing
import os
import platform
import sys
import time

import numpy as np

# The paper's values as rlhub uses them (internal/ars/defaults.go):
# version, N, b, alpha, nu, shift, threshold, paper episodes, K.
PAPER = {
    "Swimmer-v5": dict(v2=False, N=1, b=1, alpha=0.02, nu=0.01, shift=0.0, threshold=325.0, episodes=100, K=3),
    "Hopper-v5": dict(v2=True, N=8, b=4, alpha=0.01, nu=0.025, shift=1.0, threshold=3120.0, episodes=1973, K=6),
    "HalfCheetah-v5": dict(v2=True, N=32, b=4, alpha=0.02, nu=0.03, shift=0.0, threshold=3430.0, episodes=1707, K=1),
    "Walker2d-v5": dict(v2=True, N=40, b=30, alpha=0.03, nu=0.025, shift=1.0, threshold=4390.0, episodes=24000, K=15),
}
# (K, E, confirm episodes) per protocol; fast takes K from PAPER.
PROTOCOLS = {"paper": (10, 100, 100), "fast": (None, 10, 0)}


class RunningStat:
    """Welford mean and sum of squared deviations; var is S/(n−1), and for
    n ≤ 1 the square of the mean (as the authors' RunningStat)."""

    def __init__(self, dim):
        self.n = 0
        self.mean = np.zeros(dim)
        self.s = np.zeros(dim)

    def push(self, x):
        self.n += 1
        if self.n == 1:
            self.mean[...] = x  # in place: an alias of mean sees it
        else:
            d = x - self.mean
            self.mean[...] += d / self.n
            self.s[...] += d * d * (self.n - 1) / self.n

    def std(self):
        var = self.s / (self.n - 1) if self.n > 1 else np.square(self.mean)
        return np.sqrt(var)


class Filter:
    """The V2 state normaliser: x ↦ (x − mean)/(std + 1e-8)."""

    def __init__(self, dim, normalise, frozen_mean):
        self.normalise = normalise
        self.frozen_mean = frozen_mean
        self.rs = RunningStat(dim)
        self.mean = np.zeros(dim)
        self.std = np.ones(dim)
        self.update = True

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64)
        if not self.normalise:
            return x
        if self.update:
            self.rs.push(x)
        return (x - self.mean) / (self.std + 1e-8)

    def sync(self):
        """Once per iteration, after the update."""
        if not self.normalise:
            return
        self.mean = self.rs.mean.copy() if self.frozen_mean else self.rs.mean
        std = self.rs.std()
        std[std < 1e-7] = np.inf
        self.std = std


def rollout(env, w, flt, shift, reset_seed=None):
    ob, _ = env.reset(seed=reset_seed)
    total, steps = 0.0, 0
    while True:
        a = w @ flt(ob)
        ob, r, term, trunc, _ = env.step(a)
        total += r - shift
        steps += 1
        if term or trunc:
            return total, steps


def run_seed(task, seed, budget_factor, table_size, frozen_mean, crn, progress=False, protocol="paper"):
    import gymnasium as gym

    t0, c0 = time.time(), time.process_time()
    p = PAPER[task]
    K, E, confirm_n = PROTOCOLS[protocol]
    K = K or p["K"]
    env = gym.make(task)
    eval_env = gym.make(task)
    env.reset(seed=seed)
    eval_env.reset(seed=seed + 1_000_003)
    obs_dim = env.observation_space.shape[0]
    act_dim = env.action_space.shape[0]
    dim = obs_dim * act_dim
    table = np.random.RandomState(12345).randn(table_size)
    rg = np.random.RandomState(seed + 7)
    crn_rg = np.random.RandomState(seed + 11)
    w = np.zeros((act_dim, obs_dim))
    flt = Filter(obs_dim, p["v2"], frozen_mean)
    N, b, alpha, nu, shift = p["N"], p["b"], p["alpha"], p["nu"], p["shift"]
    budget = int(budget_factor * p["episodes"])
    episodes = train_steps = eval_steps = 0
    curve, best, reached = [], -np.inf, None

    def evaluate(on=eval_env, n_ep=E):
        nonlocal eval_steps
        flt.update = False
        rets = []
        for _ in range(n_ep):
            r, n = rollout(on, w, flt, 0.0)
            rets.append(r)
            eval_steps += n
        flt.update = True
        return float(np.mean(rets)), float(np.std(rets))

    confirm = None
    j = 0
    while True:
        last = episodes + 2 * N > budget
        if j % K == 0 or last:
            m, _ = evaluate()
            curve.append([episodes, round(m, 2)])
            best = max(best, m)
            if m >= p["threshold"]:
                reached = episodes
                if confirm_n:
                    confirm_env = gym.make(task)
                    confirm_env.reset(seed=seed + 2_000_003)
                    cm, cs = evaluate(confirm_env, confirm_n)
                    confirm = {"episodes": confirm_n, "mean": round(cm, 2), "std": round(cs, 2), "held": cm >= p["threshold"]}
                break
        if last:
            break
        idx = [rg.randint(0, table_size - dim + 1) for _ in range(N)]
        rewards = np.zeros((N, 2))
        for d, i in enumerate(idx):
            delta = (nu * table[i:i + dim]).reshape(w.shape)
            rs = int(crn_rg.randint(0, 2**31 - 1)) if crn else None
            rewards[d, 0], n1 = rollout(env, w + delta, flt, shift, rs)
            rewards[d, 1], n2 = rollout(env, w - delta, flt, shift, rs)
            train_steps += n1 + n2
        episodes += 2 * N
        maxr = rewards.max(axis=1)
        keep = np.arange(N)[maxr >= np.percentile(maxr, 100 * (1 - b / N))]
        rk = rewards[keep] / np.std(rewards[keep])
        g = np.zeros(dim)
        for k, i in zip(range(len(keep)), np.asarray(idx)[keep]):
            g += (rk[k, 0] - rk[k, 1]) * table[i:i + dim]
        w += alpha * (g / len(keep)).reshape(w.shape)
        flt.sync()
        j += 1
        if progress:
            print(f"{task} seed {seed} iteration {j}: {episodes} episodes, {train_steps} steps,"
                  f" train mean {rewards.mean():.2f}, last eval {curve[-1][1]}, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return {
        "task": task, "seed": seed, "protocol": protocol, "eval_every": K, "eval_episodes": E,
        "reached": reached is not None, "episodes": reached, "confirm": confirm,
        "best_eval": round(best, 2), "final_eval": curve[-1][1], "iterations": j,
        "training_episodes": episodes, "train_steps": train_steps, "eval_steps": eval_steps,
        "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
        "curve": curve,
    }


def _run(args):
    return run_seed(*args)


def parse_seeds(s):
    out = []
    for part in s.split(","):
        if "-" in part:
            a, z = part.split("-")
            out += range(int(a), int(z) + 1)
        else:
            out.append(int(part))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", required=True, choices=sorted(PAPER))
    ap.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    ap.add_argument("--budget-factor", type=float, default=2.0)
    ap.add_argument("--table", type=int, default=10_000_000, help="noise table entries")
    ap.add_argument("--frozen-mean", action="store_true", help="freeze the filter mean with the std (Algorithm 2 as written)")
    ap.add_argument("--crn", action="store_true", help="start both rollouts of a direction from the same state (common random numbers, as rlhub)")
    ap.add_argument("--procs", type=int, default=1, help="seeds run in parallel processes")
    ap.add_argument("--threshold", type=float, help="override the paper's threshold (for checking the script)")
    ap.add_argument("--progress", action="store_true", help="one line per iteration on stderr")
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="paper",
                    help="paper: every 10 iterations over 100 episodes, reached policies re-evaluated on 100 fresh ones (default); fast: rlhub's earlier K, 10 episodes")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import gymnasium
    import mujoco

    seeds = parse_seeds(a.seeds)
    if a.threshold is not None:
        PAPER[a.task] = dict(PAPER[a.task], threshold=a.threshold)
    jobs = [(a.task, s, a.budget_factor, a.table, a.frozen_mean, a.crn, a.progress, a.protocol) for s in seeds]
    t0 = time.time()
    results = []
    p = PAPER[a.task]

    def write():  # at the start and after every seed, so an interrupted run keeps what finished
        report = {
            "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            "task": a.task, "hyper": p, "budget_episodes": int(a.budget_factor * p["episodes"]),
            "frozen_mean": a.frozen_mean, "crn": a.crn, "noise_table": a.table, "protocol": a.protocol,
            "eval_every": PROTOCOLS[a.protocol][0] or p["K"], "eval_episodes": PROTOCOLS[a.protocol][1],
            "confirm_episodes": PROTOCOLS[a.protocol][2], "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "python": platform.python_version(), "numpy": np.__version__,
            "gymnasium": gymnasium.__version__, "mujoco": mujoco.__version__,
            "wall_s": round(time.time() - t0, 1), "seeds_requested": seeds, "procs": a.procs,
            "seeds": sorted(results, key=lambda r: r["seed"]),
        }
        with open(a.out + ".tmp", "w") as f:  # replaced whole: a reader never sees half a report
            json.dump(report, f, indent=1)
            f.write("\n")
        os.replace(a.out + ".tmp", a.out)

    write()  # at once: the seeds requested, none finished (the pool starts them in that order)
    with multiprocessing.Pool(a.procs) as pool:
        for r in pool.imap_unordered(_run, jobs):
            results.append(r)
            write()
            held = f", confirm {r['confirm']['mean']}" if r["confirm"] else ""
            print(f"{r['task']} seed {r['seed']}: {'reached at ' + str(r['episodes']) + held if r['reached'] else 'not reached'}"
                  f" (best {r['best_eval']}, {r['training_episodes']} episodes, {r['wall_s']} s)", flush=True)
    results.sort(key=lambda r: r["seed"])
    cells = [str(r["episodes"]) if r["reached"] else f"— ({r['best_eval']:.0f})" for r in results]
    n = sum(r["reached"] for r in results)
    print(f"| {a.task} (mujoco {mujoco.__version__}) | " + " | ".join(cells) + f" | {n}/{len(results)} |")


if __name__ == "__main__":
    main()
