#!/usr/bin/env python3
"""Weights to collectors: rlhub's BenchmarkDeliver next to torch.distributed
gloo broadcast of the same bytes to the same number of receivers, one run.

    PYTHONPATH=python python3 scripts/bench_weights_vs_gloo.py [--mib 128] [--collectors 2,8] [--rounds 2] [--cells relay-dp-shm,shm]

gloo: world = 1 + n processes on 127.0.0.1, rank 0 broadcasts a float32
tensor of --mib MiB; one delivery = broadcast + a 1-element all-reduce
(every receiver has it), timed at rank 0, 10 deliveries after 2 warm-ups,
median, and the CPU time of every rank per delivery. rlhub: `go test
-bench Deliver/<cell>` (internal/wsync, 10 deliveries per cell; CPU ms/op
is the test process's, hub and collectors together) for the transports
below, run between two gloo measurements; each round alternates.
gloo's broadcast ends with the bytes in each receiver's own tensor; the
row that compares like with like is shm-lease-into (the default shm
collector: the version in each collector's own tensors). "× memcpy" is
the cell's p50 over one memcpy of the same bytes measured right before it.
Reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CELLS = ["push", "push-dp", "relay-shm", "relay-dp-shm", "relay-dp-lease", "shm-lease-into", "shm-copy-into", "shm",
         "shm-nocrc", "shm-lease"]
# What each cell is, for the table (BenchmarkDeliver's doc has the detail).
WHAT = {
    "shm-lease-into": "default shm collector: lease, copy into its own tensors, release",
    "shm-copy-into": "copying reader (explicit option), then copy into its own tensors",
    "shm": "copying reader with CRC, adopts its private copy",
    "shm-nocrc": "copying reader, seqlock only, adopts its private copy",
    "shm-lease": "lease, reads the slot in place (no copy into tensors)",
}


def gloo_worker(rank: int, world: int, port: int, nbytes: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import resource

    t = torch.ones(nbytes // 4) if rank == 0 else torch.empty(nbytes // 4)
    ack = torch.zeros(1)
    ts = []
    cpu = 0.0
    for i in range(12):
        dist.barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        dist.broadcast(t, 0)
        dist.all_reduce(ack)
        if i >= 2:
            ts.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu += r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    out.put(("cpu", cpu / len(ts) * 1e3))
    if rank == 0:
        out.put(("p50", statistics.median(ts) * 1e3))
    dist.destroy_process_group()


def gloo(n: int, nbytes: int) -> "tuple[float, float]":
    """gloo's p50 ms per delivery and its CPU ms per delivery (every rank's
    user + system time over the timed deliveries, summed)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=gloo_worker, args=(r, n + 1, port, nbytes, q)) for r in range(n + 1)]
    for p in procs:
        p.start()
    p50, cpu = 0.0, 0.0
    for _ in range(n + 2):
        kind, v = q.get(timeout=600)
        if kind == "p50":
            p50 = v
        else:
            cpu += v
    for p in procs:
        p.join(60)
    return p50, cpu


def go_cells(mib: int, n: int, cells: "list[str]") -> dict:
    if n == 8 and cells == CELLS:
        cells = CELLS + ["2relays-dp-lease"]
    pat = f"Deliver/^({'|'.join(cells)})$/{mib}MiB/{n}collectors"
    env = dict(os.environ, GOEXPERIMENT="simd")
    r = subprocess.run([str(REPO / "bin" / "wsync.test"), "-test.run", "^$", "-test.bench", pat, "-test.benchtime", "10x"],
                       cwd=REPO / "internal" / "wsync", env=env, capture_output=True, text=True, timeout=1800)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"BenchmarkDeliver/([^/]+)/\d+MiB/\d+collectors\S*\s+\d+\s+\d+ ns/op(.*)", line)
        if m:
            metrics = dict((k, float(v)) for v, k in re.findall(r"([\d.e+]+) (\S+)", m.group(2)))
            out[m.group(1)] = metrics
    if not out:
        raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--collectors", default="2,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cells", default=",".join(CELLS), help="BenchmarkDeliver transports to run (default: all)")
    args = ap.parse_args()
    cells_wanted = args.cells.split(",")
    env = dict(os.environ, GOEXPERIMENT="simd")
    subprocess.run(["go", "test", "-c", "-o", str(REPO / "bin" / "wsync.test"), "."], cwd=REPO / "internal" / "wsync",
                   env=env, check=True)
    nbytes = args.mib << 20
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, {args.mib} MiB, 1-min load {os.getloadavg()[0]:.1f}")
    for n in (int(x) for x in args.collectors.split(",")):
        for rnd in range(args.rounds):
            (g1, c1) = gloo(n, nbytes)
            cells = go_cells(args.mib, n, cells_wanted)
            (g2, c2) = gloo(n, nbytes)
            g, gc = (g1 + g2) / 2, (c1 + c2) / 2
            print(f"\n{n} collectors, round {rnd + 1}: gloo broadcast p50 {g1:.1f} / {g2:.1f} ms, "
                  f"CPU {c1:.1f} / {c2:.1f} ms per delivery, all ranks (load {os.getloadavg()[0]:.1f})")
            print("| transport | p50 ms | p99 ms | CPU ms/op | × memcpy | gloo p50 ÷ p50 (≥ 1: faster than gloo) | gloo CPU ÷ CPU |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            print(f"| gloo broadcast (into each receiver's tensor) | {g:.1f} | – | {gc:.1f} | – | 1 | 1 |")
            for name, m in cells.items():
                label = f"{name} ({WHAT[name]})" if name in WHAT else name
                print(f"| {label} | {m['p50-ms']:.1f} | {m['p99-ms']:.1f} | {m['cpu-ms/op']:.1f} | {m['x-memcpy']:.2f} | "
                      f"{g / m['p50-ms']:.2f} | {gc / m['cpu-ms/op']:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
