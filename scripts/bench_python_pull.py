#!/usr/bin/env python3
"""One Python pull against plain TCP of the same bytes, same run, reps interleaved.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    python3 scripts/bench_python_pull.py [--params 1001000,25000000] [--reps 40,8] [--bin bin/rlhub]

For each model (one float32 tensor; default 1,001,000 and 25M parameters,
4 MB and 100 MB), against one `rlhub serve`, rep by rep in turn: a Python
TCP read of the same bytes with recv_into into a reused buffer (the
baseline, from a server thread in this process), StoreClient.pull (data
plane, fresh buffer), StoreClient.pull_into (data plane, the client's
reused buffer + one copy into the torch tensor) and
StoreClient(transport="grpc").pull; medians, each as a ratio of the TCP
rate. Then what one pull_into allocates per version: a new version is
pushed (from one refilled tensor) before each of --alloc-versions pulls,
outside the measured window, after one untimed push + pull; reported:
tracemalloc's peak during the pull_into call (Python and numpy
allocations; torch's own allocator is not traced, and pull_into writes
into the existing tensor) and the growth of the process's peak RSS over
all of them (pushes included), next to pull's. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import socket
import statistics
import sys
import threading
import time
import tracemalloc

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import rlhub  # noqa: E402
from benchhub import Hub  # noqa: E402


def tcp_reader(nb: int):
    """A loopback TCP server sending nb bytes per 1-byte request, and the
    client read of one response into a reused buffer."""
    data = np.ones(nb, np.uint8)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()

    def serve() -> None:
        c, _ = ls.accept()
        with c:
            while c.recv(1):
                c.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    cs = socket.create_connection(ls.getsockname())
    mv = memoryview(np.empty(nb, np.uint8))

    def read() -> None:
        cs.sendall(b"x")
        got = 0
        while got < nb:
            got += cs.recv_into(mv[got:])

    def close() -> None:
        cs.close()
        ls.close()

    return read, close


def max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def alloc_per_version(sc: "rlhub.StoreClient", n: int, versions: int, start: int) -> dict:
    """tracemalloc peak per call and peak-RSS growth over `versions` new
    versions, for pull_into (into one kept tensor) and for pull."""
    out = {}
    tgt = {"w": torch.zeros(n)}
    src = {"w": torch.zeros(n)}  # what each push sends, one tensor refilled
    v = start
    for kind in ("pull_into", "pull"):
        # Warm: one push and pull first, so buffers exist and the peak RSS
        # already holds one push's and one pull's transient memory.
        v += 1
        src["w"].fill_(float(v))
        sc.push("m", src, version=v)
        sc.pull_into("m", tgt) if kind == "pull_into" else sc.pull("m")
        peaks = []
        rss0 = max_rss_bytes()
        for _ in range(versions):
            v += 1
            src["w"].fill_(float(v))
            sc.push("m", src, version=v)
            tracemalloc.start()
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            got = sc.pull_into("m", tgt) if kind == "pull_into" else sc.pull("m").version
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert got == v, (got, v)
            peaks.append(peak - base)
        out[kind] = {"traced_peak_bytes": statistics.median(peaks), "rss_growth_bytes": max_rss_bytes() - rss0}
    if float(tgt["w"][0]) != float(v - versions - 1):  # the last pull_into round wrote its version
        raise AssertionError("pull_into did not write the version into the tensor")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="1001000,25000000", help="model sizes, float32 parameters")
    ap.add_argument("--reps", default="40,8", help="interleaved reps per size")
    ap.add_argument("--alloc-versions", type=int, default=5, help="new versions per allocation figure")
    ap.add_argument("--bin", default=str(REPO / "bin" / "rlhub"), help="the rlhub binary")
    args = ap.parse_args()
    sizes = [int(x) for x in args.params.split(",")]
    reps = [int(x) for x in args.reps.split(",")]
    reps += [reps[-1]] * (len(sizes) - len(reps))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.1f}\n")
    rows, allocs = [], []
    for n, nrep in zip(sizes, reps):
        with Hub(args.bin) as hub:
            sc = rlhub.StoreClient(hub.addr)
            g = rlhub.StoreClient(hub.addr, transport="grpc")
            sc.push("m", {"w": torch.ones(n)}, version=1)
            tgt = {"w": torch.zeros(n)}
            nb = len(sc.pull("m").blob)
            tcp, close = tcp_reader(nb)
            cases = (("tcp", tcp), ("pull", lambda: sc.pull("m")), ("pull_into", lambda: sc.pull_into("m", tgt)),
                     ("grpc pull", lambda: g.pull("m")))
            for _, f in cases:  # warm-up: connections, buffers
                f()
            res: dict = {k: [] for k, _ in cases}
            loads = []
            for _ in range(nrep):
                for k, f in cases:
                    t = time.perf_counter()
                    f()
                    res[k].append(time.perf_counter() - t)
                loads.append(os.getloadavg()[0])
            close()
            med = {k: statistics.median(v) for k, v in res.items()}
            rows.append((nb, med, min(loads), max(loads)))
            allocs.append((nb, alloc_per_version(sc, n, args.alloc_versions, start=1)))
            sc.close()
            g.close()
    print("| bytes | plain TCP (recv_into) | `pull` (data plane) | `pull_into` (data plane) | `pull` over gRPC | load |")
    print("| --- | --- | --- | --- | --- | --- |")
    for nb, med, lo, hi in rows:
        cells = [f"{med['tcp'] * 1e3:.2f} ms, {nb / med['tcp'] / 1e9:.2f} GB/s"]
        for k in ("pull", "pull_into", "grpc pull"):
            cells.append(f"{med[k] * 1e3:.2f} ms, {med['tcp'] / med[k]:.2f}× TCP")
        print(f"| {nb / 1e6:.1f} MB | " + " | ".join(cells) + f" | {lo:.1f}–{hi:.1f} |")
    print(f"\nAllocation per version ({args.alloc_versions} new versions, each pulled once; "
          "tracemalloc peak during the call, median; peak-RSS growth over all):\n")
    print("| bytes | `pull_into` traced peak | `pull_into` RSS growth | `pull` traced peak | `pull` RSS growth |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for nb, a in allocs:
        pi, p = a["pull_into"], a["pull"]
        print(f"| {nb / 1e6:.1f} MB | {pi['traced_peak_bytes'] / 1e3:,.1f} kB | {pi['rss_growth_bytes'] / 1e6:.1f} MB | "
              f"{p['traced_peak_bytes'] / 1e6:,.1f} MB | {p['rss_growth_bytes'] / 1e6:.1f} MB |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
