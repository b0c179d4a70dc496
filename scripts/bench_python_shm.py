#!/usr/bin/env python3
"""What a Python collector pays per version it reads from shared memory,
copying (the default) against leasing (``ShmSource(lease=True)``), next to
a numpy memcpy of the same bytes in the same run.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    PYTHONPATH=python python3 scripts/bench_python_shm.py [--sizes 16,128] [--reps 30]

For each size a Go `rlhub sync shm-writer` publishes one version of that
many MiB (float32) into a 4-slot segment (2 lease entries) in /dev/shm.
Then, rep by rep, alternating: a numpy copy of the slot's bytes into a warm
buffer; `get_if_newer(0)` on a copying source (seqlock only, verify=False,
as the Go reader's default); the same with the CRC-32C check; and
`get_if_newer(0)` on a leasing source, each returning the newest version
whole and its numpy views (`tensors()`). Prints medians in ms and × memcpy.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import rlhub.wsync as ws  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("RLHUB_BIN", str(REPO / "bin" / "rlhub")))
    ap.add_argument("--sizes", default="16,128", help="model sizes in MiB")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}; crc32c: {ws.crc32c.__module__}")
    print("| MiB | memcpy ms | copy ms (× memcpy) | copy+CRC ms (×) | lease ms (×) |")
    print("| --- | --- | --- | --- | --- |")
    for mib in (int(x) for x in args.sizes.split(",")):
        path = f"/dev/shm/rlhub-bench-shm-{os.getpid()}-{mib}"
        w = subprocess.Popen([args.bin, "sync", "shm-writer", "--path", path, "--model", "m",
                              "--tensors", f"w={mib << 18}", "--versions", "1", "--slots", "4", "--wait-stdin"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert w.stdout.readline().startswith("ready ")
            w.stdin.write("go\n")
            w.stdin.flush()
            assert w.stdout.readline().startswith("done ")
            copying = ws.ShmSource(path, verify=False)
            checking = ws.ShmSource(path, verify=True)
            leasing = ws.ShmSource(path, verify=False, lease=True)
            assert leasing.leasing, "the leasing source got no lease entry"
            src = np.frombuffer(leasing.get_if_newer(0).blob, dtype=np.uint8)
            dst = np.empty_like(src)
            dst[:] = src
            times = {k: [] for k in ("memcpy", "copy", "crc", "lease")}
            for _ in range(args.reps):
                t = time.perf_counter()
                dst[:] = src
                times["memcpy"].append(time.perf_counter() - t)
                for key, s in (("copy", copying), ("crc", checking), ("lease", leasing)):
                    t = time.perf_counter()
                    wv = s.get_if_newer(0)
                    wv.tensors()
                    times[key].append(time.perf_counter() - t)
            assert leasing.stats["in_place"] == leasing.stats["reads"] > 0
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            base = med["memcpy"]
            print(f"| {mib} | {base:.2f} | {med['copy']:.2f} ({med['copy'] / base:.2f}) "
                  f"| {med['crc']:.2f} ({med['crc'] / base:.2f}) | {med['lease']:.3f} ({med['lease'] / base:.3f}) |")
            del src
            for s in (copying, checking, leasing):
                s.close()
        finally:
            w.stdin.close()
            w.wait(timeout=30)
            if os.path.exists(path):
                os.unlink(path)


if __name__ == "__main__":
    main()
