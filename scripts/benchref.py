#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md: one table of current figures per component.

    make benchref            # or: python3 scripts/benchref.py [--out docs/benchmarks.md] [--only store,reducer]

Every row is one benchmark cell run now, on this machine, with the baseline
the benchmark measures in the same run (memcpy, a C loop, plain TCP, the Go
client …) and the ratio between them. The dated history of how each figure
got here is in docs/benchlog/; this file only says where things stand.

The cells are listed in CELLS below: a component, the Go package, the
benchmark (an anchored -test.bench pattern), how many iterations, and which
of the metrics it reports are the figure, the baseline and the ratio. The
Python client's figures come from its own benchmark scripts, whose Markdown
tables are embedded as printed. Test binaries are built once per package
with GOEXPERIMENT=simd (and -tags=mujoco where MuJoCo is installed).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclass
class Cell:
    component: str
    pkg: str          # ./internal/...
    bench: str        # the -test.bench pattern, anchored by the caller
    benchtime: str
    label: str        # what the row measures
    figure: Tuple[str, str]              # (metric unit as reported, how to show it)
    baseline: Optional[Tuple[str, str]]  # (metric, what the baseline is)
    ratio: Optional[Tuple[str, str]]     # (metric, how to read it)
    extra: List[Tuple[str, str]] = field(default_factory=list)  # more (metric, name) columns folded into the figure
    env: Dict[str, str] = field(default_factory=dict)  # the benchmark's own settings, shown in its command
    goals: List["Goal"] = field(default_factory=list)  # what an issue asks of its figures


@dataclass
class Goal:
    """A figure an issue sets a goal for: the row says whether this run met
    it, and the reference opens with every goal missed, so that a figure
    that slides past its goal is seen when the file is regenerated rather
    than a session later."""
    metric: str   # a metric the cell's benchmark reports
    at_most: bool  # the goal is metric <= value (else >=)
    value: float
    what: str     # the goal in words, e.g. "every collector p99 ≤ 3 s (issue 15)"

    def met(self, m: Dict[str, float]) -> Optional[bool]:
        if self.metric not in m:
            return None
        return m[self.metric] <= self.value if self.at_most else m[self.metric] >= self.value


# The failover figure asks for at least 10 kills (about a minute).
FAILOVER_ENV = {"RLHUB_FAILOVER_KILLS": "10"}

CELLS: List[Cell] = [
    Cell("Kernels", "./internal/kernels", "Kernels/size=16MiB/Add$", "200x", "float32 add, 16 MiB",
         ("GB/s", "GB/s"), ("CGB/s", "C -O3 loop GB/s"), ("x_C_cpu", "× C loop (CPU clock)")),
    Cell("Kernels", "./internal/kernels", "Kernels/size=256MiB/Add$", "10x", "float32 add, 256 MiB",
         ("GB/s", "GB/s"), ("CGB/s", "C -O3 loop GB/s"), ("x_C_cpu", "× C loop (CPU clock)")),
    Cell("Safetensors", "./internal/safetensors", "Safetensors/size=16MiB/decode$", "200x", "decode 16 MiB (zero-copy views)",
         ("GB/s", "GB/s"), ("copyGB/s", "memcpy GB/s"), ("x_copy_cpu", "× memcpy (CPU clock)")),
    Cell("Safetensors", "./internal/safetensors", "Safetensors/size=16MiB/encode-into$", "200x", "encode 16 MiB into a buffer",
         ("GB/s", "GB/s"), ("copyGB/s", "memcpy GB/s"), ("x_copy_cpu", "× memcpy (CPU clock)")),
    Cell("Model store", "./internal/store/storebench", "Pull/size=16MiB/readers=1/codec=blob$", "20x", "pull 16 MiB over gRPC",
         ("MB/s", "MB/s"), ("tcp_MB/s", "plain TCP MB/s"), ("ratio_vs_tcp", "× TCP (median of per-rep ratios)")),
    Cell("Model store", "./internal/store/storebench", "Pull/size=16MiB/readers=1/dst=reused/codec=blob$", "20x", "pull 16 MiB into a reused buffer",
         ("MB/s", "MB/s"), ("tcp_warm_MB/s", "TCP into a warm buffer MB/s"), ("ratio_vs_tcp_warm", "× warm TCP")),
    Cell("Model store", "./internal/store/storebench", "Pull/size=256MiB/readers=1/codec=blob$", "5x", "pull 256 MiB over gRPC",
         ("MB/s", "MB/s"), ("tcp_MB/s", "plain TCP MB/s"), ("ratio_vs_tcp", "× TCP")),
    Cell("Model store", "./internal/store/storebench", "Push/size=16MiB/store=memory/transport=dataplane$", "20x", "push 16 MiB on the data plane",
         ("MB/s", "MB/s"), ("tcp_MB/s", "plain TCP MB/s"), ("ratio_vs_tcp", "× TCP")),
    Cell("Model store", "./internal/store/storebench", "Push/size=16MiB/store=memory/transport=grpc$", "20x", "push 16 MiB over gRPC",
         ("MB/s", "MB/s"), ("tcp_MB/s", "plain TCP MB/s"), ("ratio_vs_tcp", "× TCP")),
    Cell("Gradient server", "./internal/reducer", "PushPull/params=1M/batch=1/secondary=in-hub/loop=pushpull$", "300x",
         "1M params, push + pull loop, 2 clients", ("grads_applied/s", "gradients/s"), ("tcp_MB/s", "plain TCP MB/s"),
         ("ratio_vs_tcp", "× TCP"), [("p50_ms", "p50 push→visible ms"), ("p99_ms", "p99 ms")]),
    Cell("Gradient server", "./internal/reducer", "PushPull/params=1M/batch=1/secondary=in-hub/loop=push$", "300x",
         "1M params, saturated push, 2 clients", ("grads_applied/s", "gradients/s"), ("tcp_MB/s", "plain TCP MB/s"),
         ("ratio_vs_tcp", "× TCP"), [("p50_ms", "p50 push→visible ms")]),
    Cell("Gradient server", "./internal/reducer", "DurableSteps/floats=1048576$", "300x",
         "durable steps: 1M params, Adam, journal record and optimizer state fsynced before each version, vs without them, file store both",
         ("grads/s", "gradients/s"), ("grads/s_volatile", "gradients/s without the step state"), ("x_volatile", "× without")),
    Cell("Wire", "./internal/wire", "Send/size=16MiB/grpc-stream$", "10x", "one gRPC stream, 16 MiB chunks",
         ("GB/s", "GB/s"), ("tcpGB/s", "plain TCP GB/s"), ("x_tcp", "× TCP")),
    Cell("Weight sync", "./internal/wsync", "Deliver/shm-lease-into/128MiB/2collectors$", "10x",
         "128 MiB to 2 collectors, default shm collector (lease, copy into its tensors)",
         ("p50-ms", "p50 ms"), ("memcpy-ms", "memcpy ms"), ("x-memcpy", "× memcpy time")),
    Cell("Weight sync", "./internal/wsync", "Deliver/shm-lease/128MiB/2collectors$", "10x", "128 MiB to 2 collectors, shm leases",
         ("p50-ms", "p50 ms"), ("memcpy-ms", "memcpy ms"), ("x-memcpy", "× memcpy time")),
    Cell("Weight sync", "./internal/wsync", "Deliver/shm/128MiB/2collectors$", "10x", "128 MiB to 2 collectors, shm copy + CRC",
         ("p50-ms", "p50 ms"), ("memcpy-ms", "memcpy ms"), ("x-memcpy", "× memcpy time")),
    Cell("Weight sync", "./internal/wsync", "Deliver/push/128MiB/2collectors$", "10x", "128 MiB to 2 collectors, push streams",
         ("p50-ms", "p50 ms"), ("tcp-ms", "plain TCP ms"), ("%tcp-rate", "% of TCP rate")),
    Cell("Weight sync", "./internal/wsync", "Deliver/push-dp/128MiB/2collectors$", "10x", "128 MiB to 2 collectors, push on the data plane",
         ("p50-ms", "p50 ms"), ("tcp-ms", "plain TCP ms"), ("%tcp-rate", "% of TCP rate")),
    Cell("Weight sync", "./internal/wsync", "Deliver/relay-shm/128MiB/2collectors$", "10x", "128 MiB, hub → relay → shm, 2 collectors",
         ("p50-ms", "p50 ms"), ("tcp-ms", "plain TCP ms"), ("%tcp-rate", "% of TCP rate")),
    Cell("Learner aggregator", "./internal/aggregator", "LearnRoundTrip/learners=2$", "20x", "learn task round trip, 2 learners",
         ("p50_ms", "p50 ms"), ("upload_p50_ms", "upload alone p50 ms"), ("x_upload_p50", "× upload")),
    Cell("ARS", "./internal/arsrpc", "Iteration/directions=256/workers=2$", "5x", "one iteration, 256 directions, LQR, 2 workers",
         ("env-steps/s", "env steps/s"), None, None),
    Cell("Environments", "./internal/env", "Step/CartPole-v1$", "200000x", "CartPole-v1 step",
         ("steps/s", "steps/s"), None, None),
    # The monitoring endpoint (docs/metrics.md) over a real in-memory store
    # of 5,000 models and weight sync with 16,940 collectors, server and
    # pollers in one process: CPU per request, and how many store readings
    # a request caused (1: each paid its own; below 1: shared). reuse=off
    # is pages polling every second (each past the last reading's 500 ms);
    # reuse=default, pollers hammering the endpoint.
    Cell("Monitoring", "./internal/metrics", "Poll/api/state/reuse=off/pollers=1$", "10x", "/api/state, one poller (5,000 models, 16,940 collectors)",
         ("cpu-ms/req", "ms CPU per request"), None, None, [("store-reads/req", "store readings per request")]),
    Cell("Monitoring", "./internal/metrics", "Poll/api/state/reuse=off/pollers=8$", "10x", "/api/state, 8 pollers at once (one shared reading)",
         ("cpu-ms/req", "ms CPU per request"), None, None, [("store-reads/req", "store readings per request")]),
    Cell("Monitoring", "./internal/metrics", "Poll/api/state/reuse=default/pollers=8$", "10x", "/api/state, 8 pollers back to back (readings reused for 500 ms)",
         ("cpu-ms/req", "ms CPU per request"), None, None, [("store-reads/req", "store readings per request")]),
    Cell("Monitoring", "./internal/metrics", "Poll/metrics/reuse=default/pollers=1$", "10x", "/metrics, one scraper",
         ("cpu-ms/req", "ms CPU per scrape"), None, None, [("store-reads/req", "store readings per scrape")]),
    Cell("Monitoring", "./internal/metrics", "Poll/metrics/reuse=default/pollers=8$", "10x", "/metrics, 8 scrapers at once (one shared gather)",
         ("cpu-ms/req", "ms CPU per scrape"), None, None, [("store-reads/req", "store readings per scrape")]),
    # The cluster (docs/cluster.md): real etcd and rlhub serve --etcd
    # processes on loopback, one host. Failover: 10 kills at a 2 s lease
    # (p99 is the maximum); the ratio is p99 over the lease. Replication:
    # 5 rounds, each of 100 × 1 MiB publishes, 100 pulls and 30 gradients
    # and two 3 s steady loads on a single hub, a primary with two
    # standbys (acks all) and one with acks 0, interleaved; ratios are
    # medians of the per-round ratios.
    Cell("Cluster", "./internal/replica", "Failover/lease=2s$", "1x", "primary SIGKILLed → first version by the new primary, 3 hubs, 2 s lease, 10 kills",
         ("p50_s", "p50 s"), ("lease_s", "lease TTL s"), ("p99_leases", "× lease (p99)"), [("p99_s", "p99 (max) s")], FAILOVER_ENV,
         [Goal("p99_s", True, 3.0, "kill → first version by the new primary p99 ≤ 3 s at a 2 s lease (issue 15)")]),
    # The same run as the row above (one run, both figures from the same kills).
    Cell("Cluster", "./internal/replica", "Failover/lease=2s$", "1x", "primary SIGKILLed → every collector (data plane, push stream, Failover, relay shm) on the new term, same kills",
         ("every_p50_s", "p50 s"), ("lease_s", "lease TTL s"), ("every_p99_leases", "× lease (p99)"), [("every_p99_s", "p99 (max) s")], FAILOVER_ENV,
         [Goal("every_p99_s", True, 3.0, "kill → every collector on the new term p99 ≤ 3 s at a 2 s lease (issue 15)")]),
    # Shared: every process on both cores (the standbys take the primary's
    # CPU). Pinned: the primary (or the single hub) and the load clients on
    # one half of the CPUs, the standbys and etcd on the other, standing in
    # for separate hosts. Steady states: gradient training, 4 gradient
    # learners (none waiting for a version) and 2 collectors pulling the
    # trained model back to back (issue 15's figure: gradients applied and
    # pulls); mixed, the 4 learners with 2 store clients pushing 1 MiB
    # versions of other models back to back and 2 pulling those; serial:
    # one client, each op waiting for the one before (the per-op latency
    # cost). One run gives every row.
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "gradient training (4 learners, 2 collectors pulling the trained model, 1 MiB): primary + 2 standbys (acks all) vs a single hub, pinned as separate hosts (primary + clients on CPU 0, standbys + etcd on CPU 1)",
         ("train_grads/s_pinned", "gradients applied/s"), ("single_train_grads/s_pinned", "single hub gradients applied/s"), ("x_train_grads_pinned", "× single hub"),
         [("x_train_grads_min_pinned", "× single hub, lowest round"), ("x_train_grads_max_pinned", "× single hub, highest round"), ("x_train_pulls_pinned", "× single hub pulls/s"), ("x_train_grads_acks0_pinned", "× single hub gradients applied/s with acks 0")], {},
         [Goal("x_train_grads_pinned", False, 0.85, "replication costs ≤ 15% of a single hub's gradients applied/s (issue 15)"),
          Goal("x_train_pulls_pinned", False, 0.85, "replication costs ≤ 15% of a single hub's pulls/s (issue 15)")]),
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "the same, all on the same cores",
         ("train_grads/s", "gradients applied/s"), ("single_train_grads/s", "single hub gradients applied/s"), ("x_train_grads", "× single hub"),
         [("x_train_grads_min", "× single hub, lowest round"), ("x_train_grads_max", "× single hub, highest round"), ("x_train_pulls", "× single hub pulls/s"), ("x_train_grads_acks0", "× single hub gradients applied/s with acks 0")]),
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "mixed steady state (4 learners, 2 pushers, 2 pullers of the pushed models, 1 MiB): primary + 2 standbys (acks all) vs a single hub, all on the same cores",
         ("grads/s", "gradients applied/s"), ("single_grads/s", "single hub gradients applied/s"), ("x_steady_grads", "× single hub"),
         [("x_steady_grads_min", "× single hub, lowest round"), ("x_steady_grads_max", "× single hub, highest round"), ("x_steady_pushes", "× single hub pushes/s"), ("x_steady_pulls", "× single hub pulls/s"), ("x_steady_grads_acks0", "× single hub gradients applied/s with acks 0")]),
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "the same, pinned as separate hosts (primary + clients on CPU 0, standbys + etcd on CPU 1)",
         ("grads/s_pinned", "gradients applied/s"), ("single_grads/s_pinned", "single hub gradients applied/s"), ("x_steady_grads_pinned", "× single hub"),
         [("x_steady_grads_min_pinned", "× single hub, lowest round"), ("x_steady_grads_max_pinned", "× single hub, highest round"), ("x_steady_pushes_pinned", "× single hub pushes/s"), ("x_steady_pulls_pinned", "× single hub pulls/s"), ("x_steady_grads_acks0_pinned", "× single hub gradients applied/s with acks 0")]),
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "the same run, per-op latency: one client's serial 1 MiB pushes, acks all vs a single hub, pinned",
         ("serial_pushes/s_pinned", "pushes/s"), ("single_serial_pushes/s_pinned", "single hub pushes/s"), ("x_serial_pushes_pinned", "× single hub"),
         [("x_serial_grads_pinned", "× single hub serial gradients (each waiting for its version)"), ("x_serial_pulls_pinned", "× single hub serial pulls/s"), ("x_serial_pushes", "× single hub, shared cores")]),
    Cell("Cluster", "./internal/replica", "ReplicationCost/size=1MiB$", "1x", "the same run: CPU time per 1 MiB push (user + system, pinned), primary (acks all) vs single hub",
         ("cpu_ms/push_primary", "ms primary"), ("cpu_ms/push_single", "ms single hub"), ("x_cpu_primary", "× single hub's CPU per push"),
         [("cpu_ms/push_standbys", "ms both standbys together")]),
    # A reducer step ships its journal's new bytes only (Source.Appended):
    # what a step costs the primary as the journal grows, at the default
    # compaction and at the former 16 MiB default, 30 s of 16 learners (64
    # KiB model, batches of 64) each, figures over the last 10 s.
    Cell("Cluster", "./internal/replica", "JournalShipping$", "1x", "reducer steps, primary + 1 standby (acks all), 64 KiB model, after 30 s: journal compacted at the default vs at 16 MiB",
         ("steps/s", "steps/s"), ("steps/s_16MiB", "steps/s at 16 MiB"), ("x_steps_16MiB", "× steps/s at 16 MiB"),
         [("cpu_ms/step", "ms primary CPU per step"), ("cpu_ms/step_16MiB", "ms at 16 MiB"), ("KiB_written/step", "KiB the primary writes per step (files and sockets)"), ("KiB_written/step_16MiB", "KiB at 16 MiB"), ("journal_KiB", "KiB journal"), ("journal_KiB_16MiB", "KiB journal at 16 MiB")]),
]

# The Python client's scripts, and the two speed scripts that compare
# rlhub with another system in one run: the learner loop (Python vs Go vs
# plain TCP vs Machin 0.4.2's PushPullGradServer) and weights to collectors (BenchmarkDeliver vs
# torch.distributed gloo broadcast). "tables" embeds the Markdown tables
# the script prints; "text" its whole report (captions with the date and
# load of each table), without the per-rep JSON.
PYTHON = [
    ("Python client", "store push/pull, Python vs Go client, same hub", ["scripts/bench_python_client.py", "--sizes", "16", "--reps", "5"], "tables"),
    ("Python client", "gradient pushes, data plane vs gRPC", ["scripts/bench_python_grads.py"], "tables"),
    ("Python client", "one pull vs plain TCP, 4 MB and 100 MB (25M parameters); pull_into allocation per version",
     ["scripts/bench_python_pull.py", "--reps", "40,8", "--alloc-versions", "5"], "text"),
    ("Python client", "the learner loop, Python vs Go client vs plain TCP vs Machin's PushPullGradServer, one run",
     ["scripts/bench_learner_loop.py", "--reps", "5", "--iters", "200"], "text"),
    ("Weight sync", "128 MiB to 2 and 8 collectors vs torch.distributed gloo broadcast", ["scripts/bench_weights_vs_gloo.py", "--mib", "128", "--collectors", "2,8", "--rounds", "1"], "text"),
]

LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def parse_metrics(text: str) -> Dict[str, float]:
    """The metrics of the one benchmark line in text: {unit: value}."""
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        parts = m.group(3).split()
        out = {}
        for i in range(0, len(parts) - 1, 2):
            try:
                out[parts[i + 1]] = float(parts[i])
            except ValueError:
                pass
        return out
    raise ValueError("no benchmark line in output:\n" + text[-2000:])


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def go_env() -> Dict[str, str]:
    env = dict(os.environ, GOEXPERIMENT="simd")
    if pathlib.Path("/usr/include/mujoco/mujoco.h").exists() and "-tags" not in env.get("GOFLAGS", ""):
        env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -tags=mujoco").strip()
    return env


def load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--only", default="", help="comma-separated components (default: all)")
    ap.add_argument("--no-python", action="store_true", help="skip the Python client's scripts")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    env = go_env()
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    start = datetime.datetime.now(datetime.timezone.utc)
    load_before = load()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rlhub-benchref-"))
    binaries: Dict[str, pathlib.Path] = {}
    rows: Dict[str, List[str]] = {}
    ran: Dict[Tuple[str, str, str, Tuple[Tuple[str, str], ...]], subprocess.CompletedProcess] = {}
    goals: List[Tuple[Goal, Optional[bool], str]] = []  # each goal, whether met (None: not measured), its row
    for cell in CELLS:
        if only and cell.component not in only:
            continue
        if cell.pkg not in binaries:
            out = tmp / (cell.pkg.strip("./").replace("/", "_") + ".test")
            print(f"benchref: building {cell.pkg}", file=sys.stderr)
            subprocess.run(["go", "test", "-c", "-o", str(out), cell.pkg], cwd=REPO, env=env, check=True)
            binaries[cell.pkg] = out
        first, *rest = cell.bench.split("/")
        # A benchmark without sub-benchmarks: one element (a trailing "/"
        # would ask for a sub-benchmark and match none).
        pattern = "^Benchmark" + first.rstrip("$") + "$" + "".join("/^" + p + ("" if p.endswith("$") else "$") for p in rest)
        cmd = [str(binaries[cell.pkg]), "-test.run", "^$", "-test.bench", pattern, "-test.benchtime", cell.benchtime]
        print(f"benchref: {cell.component}: {cell.label}", file=sys.stderr)
        key = (cell.pkg, pattern, cell.benchtime, tuple(sorted(cell.env.items())))
        if key not in ran:  # cells that share a benchmark share its one run
            ran[key] = subprocess.run(cmd, cwd=REPO / cell.pkg, env=dict(env, **cell.env), capture_output=True, text=True, timeout=1800)
        res = ran[key]
        settings = "".join(f"{k}={v} " for k, v in sorted(cell.env.items()))
        shown = f"`{settings}go test -run '^$' -bench '{cell.bench}' -benchtime {cell.benchtime} {cell.pkg}`"
        try:
            m = parse_metrics(res.stdout)
        except ValueError as e:
            rows.setdefault(cell.component, []).append(f"| {cell.label} | failed: exit {res.returncode} | | | {shown} |")
            print(f"benchref: {cell.label}: {e}\n{res.stderr[-2000:]}", file=sys.stderr)
            goals += [(g, None, cell.label) for g in cell.goals]
            continue
        fig = f"{fmt(m[cell.figure[0]])} {cell.figure[1]}" if cell.figure[0] in m else "—"
        for unit, name in cell.extra:
            if unit in m:
                fig += f"; {fmt(m[unit])} {name}"
        base = f"{fmt(m[cell.baseline[0]])} {cell.baseline[1]}" if cell.baseline and cell.baseline[0] in m else "—"
        ratio = f"**{fmt(m[cell.ratio[0]])}** {cell.ratio[1]}" if cell.ratio and cell.ratio[0] in m else "—"
        for g in cell.goals:
            met = g.met(m)
            goals.append((g, met, cell.label))
            ratio += f"; goal {g.what}: " + {True: "met", False: "**missed**", None: "**not measured**"}[met]
        rows.setdefault(cell.component, []).append(f"| {cell.label} | {fig} | {base} | {ratio} | {shown} |")

    py_sections: List[Tuple[str, str, str, str]] = []
    if not args.no_python and (not only or any(p[0] in only for p in PYTHON)):
        binp = tmp / "rlhub"
        subprocess.run(["go", "build", "-o", str(binp), "./cmd/rlhub"], cwd=REPO, env=env, check=True)
        penv = dict(env, PYTHONPATH=str(REPO / "python"), RLHUB_BIN=str(binp))
        # The learner loop's Machin arm (into .cache/machin; quick when present),
        # so the reference always has Machin measured beside rlhub.
        subprocess.run([str(REPO / "scripts" / "setup_machin.sh")], cwd=REPO, check=True)
        for comp, what, argv, keep in PYTHON:
            if only and comp not in only:
                continue
            print(f"benchref: {comp}: {what}", file=sys.stderr)
            full = [sys.executable, *argv]
            if "--bin" in subprocess.run([sys.executable, argv[0], "--help"], cwd=REPO, env=penv, capture_output=True, text=True).stdout:
                full += ["--bin", str(binp)]
            res = subprocess.run(full, cwd=REPO, env=penv, capture_output=True, text=True, timeout=1800)
            if keep == "text":
                shown_lines = [l for l in res.stdout.splitlines() if not l.startswith("per rep:")]
            else:
                shown_lines = [l for l in res.stdout.splitlines() if l.startswith("|")]
            table = "\n".join(shown_lines).strip() if res.returncode == 0 else ""
            table = table or f"failed: exit {res.returncode}\n\n```\n{res.stderr[-1500:]}\n```"
            py_sections.append((comp, what, " ".join(shlex.quote(a) for a in ["python3", *argv]), table))

    end = datetime.datetime.now(datetime.timezone.utc)
    lines = [
        "# Benchmarks: current figures",
        "",
        "Generated by `make benchref` (`python3 scripts/benchref.py`); do not edit by hand.",
        "Each row is one benchmark run at the commit below, with the baseline that",
        "benchmark measures in the same run and the ratio between them. How each figure",
        "got here, and the runs behind earlier decisions, are in [benchlog/](benchlog/).",
        "",
        f"- commit `{commit}`{' (with uncommitted changes)' if dirty else ''}",
        f"- run {start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC on {os.cpu_count()} cores",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load()}",
        "",
        "Under load the absolute figures drop; the ratios, taken against a baseline",
        "measured rep by rep beside them, are the figures to read.",
        "",
    ]
    if goals:
        missed = [(g, met, label) for g, met, label in goals if not met]
        lines += [f"Goals the issues set: {len(goals) - len(missed)} of {len(goals)} met in this run"
                  + (":" if missed else "."), ""]
        for g, met, label in missed:
            lines.append(f"- **{'missed' if met is False else 'not measured'}**: {g.what} — {label}")
            print(f"benchref: goal {'missed' if met is False else 'not measured'}: {g.what}", file=sys.stderr)
        if missed:
            lines.append("")
    order = []
    for cell in CELLS:
        if cell.component in rows and cell.component not in order:
            order.append(cell.component)
    for comp in order:
        lines += [f"## {comp}", "", "| cell | figure | baseline | ratio | command |", "| --- | --- | --- | --- | --- |", *rows[comp], ""]
    for comp, what, cmd, table in py_sections:
        lines += [f"## {comp}: {what}", "", f"`{cmd}`", "", table, ""]
    pathlib.Path(args.out).write_text("\n".join(lines))
    print(f"benchref: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
