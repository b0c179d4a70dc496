#!/usr/bin/env python3
"""Gradient pushes from Python: gRPC against the hub's data plane, same hub, same run.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    PYTHONPATH=python python3 scripts/bench_python_grads.py [--params 1048576] [--pushes 100] [--reps 7]

Starts one `rlhub serve --data ""` on a free loopback port, stores a float32
model of --params parameters (4 tensors), registers it (SGD, tiny lr,
staleness "accept", so every push on base version 1 is admitted), and then
alternates, rep by rep, two GradClients pushing --pushes gradients back to
back from one thread: `transport="grpc"` and `transport="auto"` (the data
plane). The gradient is a dict of torch CPU tensors, as a learner's .grad.
A push returns once the secondary admitted it (the reducer applies it
concurrently, in the hub's process, on the same 2 cores).

Prints, per transport, the median and best rep: pushes/s, MB/s of gradient
bytes (1 MB = 1e6 bytes), the client's CPU ms per push (this process's
user+sys time, less noisy than rates on a shared machine) and the attempts
beyond the first (queue-full back-offs).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import grpc  # noqa: E402
import torch  # noqa: E402

import rlhub  # noqa: E402
from rlhub.grads import GradClient  # noqa: E402
from benchhub import Hub  # noqa: E402  (scripts/, this script's directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "bin" / "rlhub"))
    ap.add_argument("--params", type=int, default=1 << 20)
    ap.add_argument("--pushes", type=int, default=100, help="pushes per rep and transport")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hub-args", default="", help="extra `rlhub serve` flags, space separated")
    args = ap.parse_args()

    hub = Hub(args.bin, *args.hub_args.split())
    addr = hub.addr
    try:
        per = args.params // 4
        zeros = {f"layer{i}.weight": torch.zeros(per) for i in range(4)}
        with rlhub.StoreClient(addr) as s:
            s.push("bench", zeros, version=1)
        g = torch.Generator().manual_seed(0)
        grads = {k: torch.randn(per, generator=g) * 1e-3 for k in zeros}
        nbytes = sum(t.numel() * 4 for t in grads.values())
        clients = {"grpc": GradClient(addr, transport="grpc"), "data plane": GradClient(addr)}
        clients["grpc"].register("bench", optimizer={"kind": "sgd", "lr": 1e-9}, staleness="accept")
        results = {k: [] for k in clients}
        for c in clients.values():  # warm up: connections, first allocations
            for _ in range(5):
                c.push("bench", 1, grads)
        t_start = time.strftime("%H:%M:%S", time.gmtime())
        load0 = os.getloadavg()[0]
        for _ in range(args.reps):
            for name, c in clients.items():
                cpu0, t0 = time.process_time(), time.perf_counter()
                extra = 0
                for _ in range(args.pushes):
                    extra += c.push("bench", 1, grads).attempts - 1
                dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                results[name].append((args.pushes / dt, args.pushes * nbytes / dt / 1e6,
                                      cpu / args.pushes * 1e3, extra))
        load1 = os.getloadavg()[0]
        stats = {k: c.transport_stats() for k, c in clients.items()}
        for c in clients.values():
            c.close()
    finally:
        hub.stop()

    print(f"{args.params:,} float32 params ({nbytes / 1e6:.1f} MB per push), {args.pushes} pushes × "
          f"{args.reps} reps per transport, {t_start} UTC, 1-min load {load0:.1f} → {load1:.1f}, "
          f"torch {torch.__version__}, grpcio {grpc.__version__}")
    print("transport counters:", stats)
    print()
    print("| transport | of reps | pushes/s | MB/s | client CPU ms/push | retried attempts |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, rs in results.items():
        med = [statistics.median(r[i] for r in rs) for i in range(3)]
        best = max(rs, key=lambda r: r[0])
        extra = sum(r[3] for r in rs)
        print(f"| {name} | median | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.2f} | {extra} (all reps) |")
        print(f"| {name} | best | {best[0]:.0f} | {best[1]:.0f} | {best[2]:.2f} | |")
    mg = statistics.median(r[0] for r in results["grpc"])
    mb = statistics.median(r[0] for r in results["data plane"])
    print(f"\ndata plane / gRPC, median pushes/s: {mb / mg:.2f}×")


if __name__ == "__main__":
    main()
