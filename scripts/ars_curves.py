#!/usr/bin/env python3
"""Collect `rlhub train ars` runs (finished or stopped) into one results file
for docs/results/ (issue 21).

For each OUT directory it reads OUT/config.yaml (the resolved run file:
env, seed, hyperparameters, protocol), OUT/curve.csv (one row per
iteration) and, when the run finished, OUT/summary.json. It writes, per
run: the configuration, how far it got (iterations, training episodes,
env steps, wall seconds), every evaluation row (training episodes behind
the policy, mean and std over its episodes) and the best one, and the
summary's outcome (target reached, the 100-fresh-episode re-evaluation)
or "stopped" for a run ended from outside. With --load FILE (lines
"HH:MM:SS l1 l5 l15", e.g. sampled from /proc/loadavg once a minute
while the runs ran) it records the range of the 1-minute load too.

    python3 scripts/ars_curves.py --note "..." --load load.log \\
        --out docs/results/ars-walker2d-ant-2026-12-01.json RUN_DIR...

A reference run of scripts/ars_reference.py --progress can be added with
--reference LOG (its per-iteration lines: episodes and training mean).
"""
import argparse
import csv
import json
import os
import re
import sys

import yaml


def run_record(out):
    with open(os.path.join(out, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    rows = list(csv.DictReader(open(os.path.join(out, "curve.csv"))))
    evals = [{"iteration": int(r["iteration"]), "training_episodes": int(r["policy_training_episodes"]),
              "mean": round(float(r["eval_mean"]), 2), "std": round(float(r["eval_std"]), 2),
              "confirm": r.get("confirm") == "true"}
             for r in rows if r["eval_mean"]]
    train = [[int(r["training_episodes"]), round(float(r["train_return"]), 2)] for r in rows]
    last = rows[-1] if rows else {}
    rec = {"dir": os.path.basename(os.path.normpath(out)), "config": cfg,
           "iterations": int(last["iteration"]) + 1 if rows else 0,
           "training_episodes": int(last["training_episodes"]) if rows else 0,
           "env_steps": int(last["env_steps"]) if rows else 0,
           "wall_seconds": round(float(last["wall_seconds"]), 1) if rows else 0.0,
           "evaluations": evals,
           "best_eval": max((e for e in evals if not e["confirm"]), key=lambda e: e["mean"], default=None),
           "train_return": train}
    sp = os.path.join(out, "summary.json")
    if os.path.exists(sp):
        s = json.load(open(sp))
        rec["outcome"] = "finished"
        rec["summary"] = {k: s[k] for k in s if k in (
            "reached", "target", "target_held", "confirm_mean", "confirm_std", "confirm_episodes",
            "episodes", "training_episodes", "protocol", "stop_reason", "final_eval_mean")}
    else:
        rec["outcome"] = "stopped from outside before the target or the budget (no summary.json)"
    return rec


def reference_record(path):
    pat = re.compile(r"(\S+) seed (\d+) iteration (\d+): (\d+) episodes, (\d+) steps, train mean ([-\d.]+), "
                     r"last eval ([-\d.]+), (\d+) s")
    pts, task, seed, wall = [], None, None, 0
    for line in open(path):
        m = pat.match(line.strip())
        if m:
            task, seed = m.group(1), int(m.group(2))
            pts.append([int(m.group(4)), float(m.group(6))])
            wall = int(m.group(8))
    return {"log": os.path.basename(path), "task": task, "seed": seed, "iterations": len(pts),
            "wall_seconds": wall, "train_return": pts,
            "note": "scripts/ars_reference.py --progress: the authors' loop on Gymnasium; train mean over the 2N "
                    "(shifted) training rollouts of each iteration, its evaluations are rlhub's fast rule"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--load", help="load samples, one 'HH:MM:SS l1 l5 l15' a line")
    ap.add_argument("--reference", action="append", default=[], help="ars_reference.py --progress log")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"{a.out} exists: results files are never overwritten; choose a new name")
    rep = {"command": " ".join(["ars_curves.py"] + sys.argv[1:]), "note": a.note,
           "runs": [run_record(r) for r in a.runs],
           "references": [reference_record(p) for p in a.reference]}
    if a.load:
        ls = [float(l.split()[1]) for l in open(a.load) if len(l.split()) >= 2]
        lines = open(a.load).read().split("\n")
        rep["load_1min"] = {"min": min(ls), "max": max(ls), "median": sorted(ls)[len(ls) // 2], "samples": len(ls),
                            "from": lines[0].split()[0], "to": [l for l in lines if l][-1].split()[0]}
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    for r in rep["runs"]:
        b = r["best_eval"]
        print(f"{r['config']['env']} seed {r['config']['seed']}: {r['iterations']} iterations,"
              f" {r['training_episodes']} episodes, {r['wall_seconds']} s, best eval"
              f" {b['mean'] if b else None} at {b['training_episodes'] if b else None}; {r['outcome']}")


if __name__ == "__main__":
    main()
