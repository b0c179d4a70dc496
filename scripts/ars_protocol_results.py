#!/usr/bin/env python3
"""Collect the paper-protocol ARS runs of issue 21 into one results file and
a Markdown table: rlhub (`rlhub bench ars-paper`, each task's OUT/ars-paper.json,
rewritten after every seed) next to the authors' loop (scripts/ars_reference.py
--protocol paper, its JSON, written at its start and after every seed) on the
same seeds. Only seeds that finished are counted; the table says which ran,
and which are still running.

    python3 scripts/ars_protocol_results.py --runs runs/s8 \\
        --previous docs/results/ars-paper-protocol-2026-12-01.json \\
        --out docs/results/ars-paper-protocol-2026-12-01.json > /tmp/table.md

--runs holds rlhub-TASK/ars-paper.json and ref-TASK.json (task in lower
case without the version, e.g. rlhub-halfcheetah, ref-halfcheetah.json),
as a session's queue writes them (docs/benchlog/2026-12-01-s7-paper.md,
2026-12-01-s8-paper.md). --previous is an earlier output of this script:
its finished seeds are kept (the raw runs of an earlier session need not
exist any more), and a seed that --runs also holds is taken from --runs.
Every loop lists its `runs` (command, MuJoCo, load) and every seed names
the run it came from. Runs of one task and loop must share the budget and
the MuJoCo release, or the script refuses to merge them. --out may be the
--previous file: collecting again as more seeds finish is idempotent.

A seed is `running` when its job has started and not finished it: for
rlhub the seed directory bench ars-paper made is there without a result
(it runs one seed at a time), for the authors' loop the report lists it as
requested and it is among the first --procs unfinished ones (its pool
starts seeds in the order requested). A job that was stopped looks the
same; the table is a snapshot.
"""
import argparse
import json
import os
import re
import statistics

TASKS = ["Hopper-v5", "HalfCheetah-v5", "Swimmer-v5", "Walker2d-v5"]
PAPER_EPISODES = {"Hopper-v5": 1973, "HalfCheetah-v5": 1707, "Swimmer-v5": 100, "Walker2d-v5": 24000}
LOOPS = ("rlhub", "authors_loop")


def fisher_two_sided(a, n1, b, n2):
    """Two-sided Fisher exact p for a/n1 against b/n2 successes."""
    from math import comb
    k, n = a + b, n1 + n2
    if n1 == 0 or n2 == 0:
        return None
    def p(x):
        return comb(n1, x) * comb(n2, k - x) / comb(n, k)
    obs = p(a)
    return min(1.0, sum(p(x) for x in range(max(0, k - n2), min(k, n1) + 1) if p(x) <= obs * (1 + 1e-9)))


def short(task):
    return task.split("-")[0].lower()


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def summarise(seeds):
    reached = [s for s in seeds if s["reached"]]
    eps = [s["episodes"] for s in reached]
    return {
        "seeds_run": [s["seed"] for s in seeds],
        "reached": len(reached),
        "held": sum(1 for s in reached if s.get("held")),
        "success_rate": len(reached) / len(seeds) if seeds else None,
        "episodes_median": statistics.median(eps) if eps else None,
        "episodes_min": min(eps) if eps else None,
        "episodes_max": max(eps) if eps else None,
    }


def requested_rlhub_seeds(command, task):
    """The seeds a bench ars-paper command asks of task (--tasks TASK:N or --seeds N, --first-seed F)."""
    def flag(name, default):
        m = re.search(rf"--{name}[ =](\S+)", command or "")
        return m.group(1) if m else default
    n = int(flag("seeds", "10"))
    for t in flag("tasks", "").split(","):
        name, _, k = t.partition(":")
        if name == task and k:
            n = int(k)
    first = int(flag("first-seed", "1"))
    return list(range(first, first + n))


def rlhub_job(runs, task):
    """(run record, finished seeds, running seeds) of --runs' bench ars-paper job for task."""
    out = os.path.join(runs, f"rlhub-{short(task)}")
    rep = load(os.path.join(out, "ars-paper.json"))
    started = set()
    for seed in requested_rlhub_seeds((rep or {}).get("command"), task) if rep else []:
        if os.path.isdir(os.path.join(out, task, f"seed-{seed}")):
            started.add(seed)
    if rep is None:
        # No seed finished yet: the report is written after the first.
        started = {int(d[5:]) for d in os.listdir(os.path.join(out, task))
                   if d.startswith("seed-") and d[5:].isdigit()} if os.path.isdir(os.path.join(out, task)) else set()
        return None, [], sorted(started)
    for t in rep.get("tasks", []):
        if t["task"] == task:
            seeds = [{"seed": s["seed"], "reached": s["reached"], "episodes": s["episodes"],
                      "confirm_eval": s.get("confirm_eval"), "held": s.get("held"), "best_eval": s["best_eval"],
                      "wall_seconds": round(s["wall_seconds"], 1), "env_steps": s["env_steps"],
                      "worker_cpu_seconds": s.get("worker_cpu_seconds")} for s in t["per_seed"]]
            run = {"command": rep.get("command"), "mujoco": rep.get("mujoco") or None,
                   "mujoco_library": rep.get("mujoco_library"), "workers": rep.get("workers"),
                   "budget_episodes": t["budget_episodes"], "threshold": t["threshold"],
                   "load_average_at_last_write": rep.get("load_average_at_end")}
            done = {s["seed"] for s in seeds}
            return run, seeds, sorted(started - done)
    return None, [], sorted(started)


def ref_job(runs, task):
    """(run record, finished seeds, running seeds) of --runs' authors'-loop job for task."""
    rep = load(os.path.join(runs, f"ref-{short(task)}.json"))
    if rep is None:
        return None, [], []
    seeds = []
    for s in rep.get("seeds", []):
        c = s.get("confirm") or {}
        seeds.append({"seed": s["seed"], "reached": s["reached"], "episodes": s["episodes"] if s["reached"] else s["training_episodes"],
                      "confirm_eval": c.get("mean"), "held": c.get("held"), "best_eval": s["best_eval"],
                      "wall_seconds": s["wall_s"], "env_steps": s["train_steps"] + s["eval_steps"], "cpu_seconds": s.get("cpu_s")})
    done = {s["seed"] for s in seeds}
    unfinished = [s for s in rep.get("seeds_requested", []) if s not in done]
    run = {"command": rep.get("command"), "mujoco": rep.get("mujoco"), "gymnasium": rep.get("gymnasium"),
           "numpy": rep.get("numpy"), "procs": rep.get("procs"), "budget_episodes": rep.get("budget_episodes"),
           "threshold": rep.get("hyper", {}).get("threshold"), "load_average_at_last_write": rep.get("load_average")}
    return run, seeds, unfinished[:rep.get("procs") or 1]


def previous_loop(prev, task, loop):
    """(runs, seeds) of task's loop in an earlier output of this script; its
    first format had one command per loop and no run index per seed."""
    for t in (prev or {}).get("tasks", []):
        if t["task"] != task:
            continue
        L = t.get(loop) or {}
        if "runs" in L:
            runs = L["runs"]
            return runs, [dict(s, run=runs[s["run"]]) for s in L.get("per_seed", [])]
        keys = ("command", "mujoco", "mujoco_library", "gymnasium", "workers", "budget_episodes", "threshold", "load_average_at_last_write")
        run = {k: L[k] for k in keys if L.get(k) is not None}
        return [run], [dict(s, run=run) for s in L.get("per_seed", [])]
    return [], []


def merge(task, loop, old_seeds, new_run, new_seeds):
    """Seeds of both, --runs winning a seed both hold; the runs they came from."""
    by = {s["seed"]: s for s in old_seeds}
    for s in new_seeds:
        by[s["seed"]] = dict(s, run=new_run)
    seeds = [by[k] for k in sorted(by)]
    runs = []
    for s in seeds:
        if s["run"] not in runs:
            runs.append(s["run"])
    for key in ("budget_episodes", "mujoco"):
        vals = {r.get(key) for r in runs if r.get(key) is not None}
        if len(vals) > 1:
            raise SystemExit(f"{task} {loop}: runs with different {key} {sorted(vals)}; not merged")
    return runs, [dict({k: v for k, v in s.items() if k != "run"}, run=runs.index(s["run"])) for s in seeds]


def cell(s, running):
    if s is None:
        return "running" if running else "·"
    if s["reached"]:
        c = s["confirm_eval"]
        return f"{s['episodes']} ({c:.0f})" if c is not None else str(s["episodes"])
    return f"— ({s['best_eval']:.0f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--previous", help="an earlier output of this script whose seeds are kept")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    prev = None
    if a.previous:
        prev = load(a.previous)
        if prev is None:
            raise SystemExit(f"--previous {a.previous}: cannot read it")
    res = {"protocol": "paper: evaluation every 10 iterations over 100 episodes, filter frozen, shift 0, training episodes "
                       "counted; a policy that reaches the threshold is evaluated again on 100 fresh episodes",
           "tasks": []}
    md = []
    for task in TASKS:
        jobs = {"rlhub": rlhub_job(a.runs, task), "authors_loop": ref_job(a.runs, task)}
        entry = {"task": task, "paper_episodes": PAPER_EPISODES[task]}
        for loop in LOOPS:
            old_runs, old_seeds = previous_loop(prev, task, loop)
            run, seeds, running = jobs[loop]
            runs, merged = merge(task, loop, old_seeds, run, seeds)
            running = [s for s in running if s not in {m["seed"] for m in merged}]
            first = runs[0] if runs else {}
            entry[loop] = {"budget_episodes": first.get("budget_episodes"), "threshold": first.get("threshold"),
                           "mujoco": first.get("mujoco"), **summarise(merged), "running": running,
                           "runs": runs, "per_seed": merged}
        rs, fs = entry["rlhub"]["per_seed"], entry["authors_loop"]["per_seed"]
        if not (rs or fs or entry["rlhub"]["running"] or entry["authors_loop"]["running"]):
            continue
        # Success rates compared on the seeds both loops finished.
        both = sorted({s["seed"] for s in rs} & {s["seed"] for s in fs})
        ra = sum(1 for s in rs if s["seed"] in both and s["reached"])
        fa = sum(1 for s in fs if s["seed"] in both and s["reached"])
        entry["paired"] = {"seeds": both, "rlhub_reached": ra, "authors_loop_reached": fa,
                           "fisher_p_two_sided": fisher_two_sided(ra, len(both), fa, len(both))}
        res["tasks"].append(entry)
        seeds = sorted({s["seed"] for s in rs + fs} | set(entry["rlhub"]["running"]) | set(entry["authors_loop"]["running"]))
        threshold = entry["rlhub"]["threshold"] or entry["authors_loop"]["threshold"]
        md.append(f"\n{task} (threshold {threshold:g}, paper {PAPER_EPISODES[task]} episodes): "
                  "episodes to threshold (100-episode re-evaluation), or — (best evaluation); · not run\n")
        md.append("| loop | " + " | ".join(f"seed {s}" for s in seeds) + " | reached | held | median episodes |")
        md.append("| --- | " + " | ".join("---:" for _ in seeds) + " | ---: | ---: | ---: |")
        for name, loop in (("rlhub", "rlhub"), ("authors' loop", "authors_loop")):
            summ = entry[loop]
            by = {s["seed"]: s for s in summ["per_seed"]}
            n = len(summ["seeds_run"])
            med = f"{summ['episodes_median']:.0f}" if summ["episodes_median"] is not None else "—"
            md.append(f"| {name} | " + " | ".join(cell(by.get(s), s in summ["running"]) for s in seeds) +
                      f" | {summ['reached']}/{n} | {summ['held']}/{summ['reached']} | {med} |")
        pr = entry["paired"]
        if pr["seeds"]:
            md.append(f"\nOn the {len(pr['seeds'])} seeds both ran: rlhub {pr['rlhub_reached']}, the authors' loop "
                      f"{pr['authors_loop_reached']} reached (Fisher exact, two-sided p = {pr['fisher_p_two_sided']:.2f}).")
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.out)
    print("\n".join(md))


if __name__ == "__main__":
    main()
