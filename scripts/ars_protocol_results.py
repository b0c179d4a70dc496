#!/usr/bin/env python3
"""Collect the paper-protocol ARS runs of issue 21 into one results file and
a Markdown table: rlhub (`rlhub bench ars-paper`, each task's OUT/ars-paper.json,
rewritten after every seed) next to the authors' loop (scripts/ars_reference.py
--protocol paper, its JSON, rewritten after every seed) on the same seeds.
Only seeds that finished are counted; the table says which ran.

    python3 scripts/ars_protocol_results.py --runs runs/s7 \\
        --out docs/results/ars-paper-protocol-2026-12-01.json > /tmp/table.md

--runs holds rlhub-TASK/ars-paper.json and ref-TASK.json (task in lower
case without the version, e.g. rlhub-halfcheetah, ref-halfcheetah.json),
as the session's queue wrote them (docs/benchlog/2026-12-01-s7-paper.md).
"""
import argparse
import json
import os
import statistics

TASKS = ["Hopper-v5", "HalfCheetah-v5", "Swimmer-v5", "Walker2d-v5"]
PAPER_EPISODES = {"Hopper-v5": 1973, "HalfCheetah-v5": 1707, "Swimmer-v5": 100, "Walker2d-v5": 24000}


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


def rlhub_seeds(rep, task):
    for t in (rep or {}).get("tasks", []):
        if t["task"] == task:
            return [{"seed": s["seed"], "reached": s["reached"], "episodes": s["episodes"],
                     "confirm_eval": s.get("confirm_eval"), "held": s.get("held"), "best_eval": s["best_eval"],
                     "wall_seconds": round(s["wall_seconds"], 1), "env_steps": s["env_steps"]} for s in t["per_seed"]], t
    return [], None


def ref_seeds(rep):
    out = []
    for s in (rep or {}).get("seeds", []):
        c = s.get("confirm") or {}
        out.append({"seed": s["seed"], "reached": s["reached"], "episodes": s["episodes"] if s["reached"] else s["training_episodes"],
                    "confirm_eval": c.get("mean"), "held": c.get("held"), "best_eval": s["best_eval"],
                    "wall_seconds": s["wall_s"], "env_steps": s["train_steps"] + s["eval_steps"]})
    return out


def cell(s):
    if s is None:
        return "·"
    if s["reached"]:
        c = s["confirm_eval"]
        return f"{s['episodes']} ({c:.0f})" if c is not None else str(s["episodes"])
    return f"— ({s['best_eval']:.0f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = {"protocol": "paper: evaluation every 10 iterations over 100 episodes, filter frozen, shift 0, training episodes "
                       "counted; a policy that reaches the threshold is evaluated again on 100 fresh episodes",
           "tasks": []}
    md = []
    for task in TASKS:
        rrep = load(os.path.join(a.runs, f"rlhub-{short(task)}", "ars-paper.json"))
        fref = load(os.path.join(a.runs, f"ref-{short(task)}.json"))
        rs, rt = rlhub_seeds(rrep, task)
        fs = ref_seeds(fref)
        if not rs and not fs:
            continue
        entry = {"task": task, "paper_episodes": PAPER_EPISODES[task],
                 "rlhub": {"command": (rrep or {}).get("command"), "mujoco": (rrep or {}).get("mujoco") or None,
                           "workers": (rrep or {}).get("workers"), "budget_episodes": rt and rt["budget_episodes"],
                           "threshold": rt and rt["threshold"], "load_average_at_last_write": (rrep or {}).get("load_average_at_end"),
                           **summarise(rs), "per_seed": rs},
                 "authors_loop": {"command": (fref or {}).get("command"), "mujoco": (fref or {}).get("mujoco"),
                                  "gymnasium": (fref or {}).get("gymnasium"), "budget_episodes": (fref or {}).get("budget_episodes"),
                                  "load_average_at_last_write": (fref or {}).get("load_average"),
                                  **summarise(fs), "per_seed": fs}}
        # Success rates compared on the seeds both loops finished.
        both = sorted({s["seed"] for s in rs} & {s["seed"] for s in fs})
        ra = sum(1 for s in rs if s["seed"] in both and s["reached"])
        fa = sum(1 for s in fs if s["seed"] in both and s["reached"])
        entry["paired"] = {"seeds": both, "rlhub_reached": ra, "authors_loop_reached": fa,
                           "fisher_p_two_sided": fisher_two_sided(ra, len(both), fa, len(both))}
        res["tasks"].append(entry)
        seeds = sorted({s["seed"] for s in rs} | {s["seed"] for s in fs})
        by_r = {s["seed"]: s for s in rs}
        by_f = {s["seed"]: s for s in fs}
        md.append(f"\n{task} (threshold {rt['threshold'] if rt else fref['hyper']['threshold']:g}, paper {PAPER_EPISODES[task]} episodes): "
                  "episodes to threshold (100-episode re-evaluation), or — (best evaluation); · not run\n")
        md.append("| loop | " + " | ".join(f"seed {s}" for s in seeds) + " | reached | held | median episodes |")
        md.append("| --- | " + " | ".join("---:" for _ in seeds) + " | ---: | ---: | ---: |")
        for name, by, summ in (("rlhub", by_r, entry["rlhub"]), ("authors' loop", by_f, entry["authors_loop"])):
            n = len(summ["seeds_run"])
            med = f"{summ['episodes_median']:.0f}" if summ["episodes_median"] is not None else "—"
            md.append(f"| {name} | " + " | ".join(cell(by.get(s)) for s in seeds) +
                      f" | {summ['reached']}/{n} | {summ['held']}/{summ['reached']} | {med} |")
        pr = entry["paired"]
        if pr["seeds"]:
            md.append(f"\nOn the {len(pr['seeds'])} seeds both ran: rlhub {pr['rlhub_reached']}, the authors' loop "
                      f"{pr['authors_loop_reached']} reached (Fisher exact, two-sided p = {pr['fisher_p_two_sided']:.2f}).")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
