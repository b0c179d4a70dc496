#!/usr/bin/env python3
"""Runs the Go race suite several times and compares two trees' runs.

Issue 22 asks for the suite's wall time and flake rate before and after a
change, on the same machine. This keeps the driver in the repo instead of a
session's scratch folder:

    scripts/suite_runs.py run --runs 5 --out /tmp/suite/after            # this tree
    scripts/suite_runs.py run --runs 2 --tree /tmp/before --out /tmp/suite/before
    scripts/suite_runs.py compare /tmp/suite/before /tmp/suite/after

`run` executes `go test -race -count=1 -json -timeout 20m ./...` (with
GOEXPERIMENT=simd and scripts/gotags.sh's tags, as scripts/test.sh does) and
keeps each run's JSON events plus a summary line (start time, load before and
after, wall, failed tests). `compare` prints, per side, the runs, the load at
start, the median wall, the median time spent in the top-level tests both
sides have (same package and name, so new tests do not count against the
after side), and the failed runs with the tests that failed. Nothing is
asserted: it is a measurement, read by a person.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def go_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, GOEXPERIMENT="simd")
    tags = subprocess.run(
        ["bash", "-c", "source scripts/gotags.sh >/dev/null 2>&1; printf %s \"${GOFLAGS:-}\""],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    ).stdout.strip()
    if tags:
        env["GOFLAGS"] = tags
    return env


def load() -> float:
    return os.getloadavg()[0]


def cmd_run(args: argparse.Namespace) -> int:
    tree = Path(args.tree).resolve()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = go_env(tree)
    existing = len(list(out.glob("run-*.json")))
    for k in range(existing + 1, existing + args.runs + 1):
        events = out / f"run-{k}.json"
        before = load()
        start = time.time()
        with events.open("w") as f:
            rc = subprocess.run(
                ["go", "test", "-race", "-count=1", "-json", "-timeout", args.timeout, *args.packages],
                cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, check=False,
            ).returncode
        wall = time.time() - start
        failed = sorted(failures(events))
        line = {
            "run": k, "tree": str(tree), "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
            "load_before": round(before, 2), "load_after": round(load(), 2),
            "wall_s": round(wall, 1), "exit": rc, "failed": failed,
        }
        with (out / "summary.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)
    return 0


def events_of(path: Path):
    with path.open() as f:
        for raw in f:
            raw = raw.strip()
            if not raw.startswith("{"):
                continue
            try:
                yield json.loads(raw)
            except json.JSONDecodeError:
                continue


def failures(path: Path) -> set[str]:
    """Top-level tests that failed, plus packages that failed without one (a panic, a build error)."""
    tests, pkgs = set(), set()
    for e in events_of(path):
        if e.get("Action") != "fail":
            continue
        if e.get("Test"):
            tests.add(f"{e['Package']}.{e['Test'].split('/')[0]}")
        else:
            pkgs.add(e.get("Package", "?"))
    named = {t.rsplit(".", 1)[0] for t in tests}
    return tests | {f"{p} (package)" for p in pkgs - named}


def test_times(path: Path) -> dict[str, float]:
    """Elapsed seconds of each top-level test that passed."""
    times = {}
    for e in events_of(path):
        if e.get("Action") == "pass" and e.get("Test") and "/" not in e["Test"]:
            times[f"{e['Package']}.{e['Test']}"] = float(e.get("Elapsed", 0))
    return times


def side(d: Path):
    runs = []
    for line in (d / "summary.jsonl").read_text().splitlines():
        s = json.loads(line)
        s["times"] = test_times(d / f"run-{s['run']}.json")
        runs.append(s)
    return runs


def cmd_compare(args: argparse.Namespace) -> int:
    sides = {"before": side(Path(args.before)), "after": side(Path(args.after))}
    common = None
    for runs in sides.values():
        for r in runs:
            names = set(r["times"])
            common = names if common is None else common & names
    common = common or set()
    print(f"tests both sides passed in every run: {len(common)}")
    print("| side | runs | load at start | wall (median) | time in the common tests (median) | tests (median) | failed runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, runs in sides.items():
        walls = [r["wall_s"] for r in runs]
        commons = [sum(r["times"][t] for t in common) for r in runs]
        counts = [len(r["times"]) for r in runs]
        loads = [r["load_before"] for r in runs]
        bad = [r for r in runs if r["exit"] != 0]
        failed = "; ".join(f"run {r['run']}: {', '.join(r['failed']) or 'exit ' + str(r['exit'])}" for r in bad)
        print(f"| {name} | {len(runs)} | {min(loads)}–{max(loads)} | {statistics.median(walls):.0f} s | "
              f"{statistics.median(commons):.1f} s | {statistics.median(counts):.0f} | "
              f"{len(bad)} of {len(runs)}{' (' + failed + ')' if failed else ''} |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the race suite N times")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--out", required=True)
    r.add_argument("--tree", default=".")
    r.add_argument("--timeout", default="20m")
    r.add_argument("packages", nargs="*", default=["./..."])
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare", help="compare two output folders")
    c.add_argument("before")
    c.add_argument("after")
    c.set_defaults(func=cmd_compare)
    args = p.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
