#!/usr/bin/env python3
"""Push/pull throughput of the Python client next to the Go client's, same hub, same run.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    PYTHONPATH=python python3 scripts/bench_python_client.py [--sizes 16,128] [--reps 5]

Starts one `rlhub serve --data ""` (in-memory store: the transfer is measured,
not the hub's disk) on a free loopback port. For each size it builds a
float32 state dict of that many MiB (tensors of 4 MiB), writes its
safetensors bytes to a file for the Go side, and then alternates, rep by rep:

* Go: `rlhub model bench --warmup 1 --reps 1 FILE` — one push and one pull
  with the Go store client, timed inside the process after an untimed pair
  (no start-up, dialing or file I/O timed: the Python client is long-lived);
* Python: `StoreClient.push(blob)` (bytes already encoded, as Go's) and
  `StoreClient.pull()` + numpy views of the tensors (Go's pull decodes too),
  plus push of the state dict (encode + push) and pull into torch tensors.

Reps alternate so load changes on the shared machine hit both clients alike.
Prints a Markdown table of medians and of best reps (MB/s, 1 MB = 1e6 bytes)
and Python ÷ Go time ratios (target: push and pull ≤ 1.5; below 1, Python is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import rlhub  # noqa: E402
from benchhub import Hub  # noqa: E402  (scripts/, this script's directory)
import torch  # noqa: E402,F401  (imported before timing: pull → torch must not pay for it)


def state_dict(mib: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(mib)
    per = (4 << 20) // 4
    return {f"layer{i:03d}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(mib // 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("RLHUB_BIN", str(REPO / "bin" / "rlhub")))
    ap.add_argument("--sizes", default="16,128", help="state dict sizes in MiB (multiples of 4)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk-bytes", type=int, default=0, help="Python client chunk size (0: the client's default)")
    args = ap.parse_args()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rlhub-bench-py-"))
    hub = Hub(args.bin, log=tmp / "hub.log")
    addr = hub.addr
    try:
        kw = {"chunk_bytes": args.chunk_bytes} if args.chunk_bytes else {}
        client = rlhub.StoreClient(addr, timeout=300, **kw)
        print(f"# hub {addr}, load average {os.getloadavg()[0]:.2f}, reps {args.reps}, "
              f"python chunk {client.chunk_bytes} bytes")
        rows = []
        for mib in (int(s) for s in args.sizes.split(",")):
            sd = state_dict(mib)
            blob = rlhub.save_bytes(sd)
            f = tmp / f"sd{mib}.safetensors"
            f.write_bytes(blob)
            t: Dict[str, List[float]] = {k: [] for k in ("go push", "go pull", "py push", "py pull",
                                                          "py push dict", "py pull torch")}
            for rep in range(args.reps):
                out = subprocess.run([args.bin, "model", "bench", "--hub", addr, "--name", f"go{mib}",
                                      "--start", str(2 * rep + 1), "--warmup", "1", "--reps", "1", str(f)],
                                     capture_output=True, text=True, check=True).stdout
                for line in out.splitlines():
                    r = json.loads(line)
                    assert r["bytes"] == len(blob)
                    t["go " + r["op"]].append(r["seconds"])

                t0 = time.perf_counter()
                client.push(f"py{mib}", blob, version=2 * rep + 1)
                t["py push"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                v = client.pull(f"py{mib}")
                tensors = v.tensors
                t["py pull"].append(time.perf_counter() - t0)
                assert len(v.blob) == len(blob) and len(tensors) == len(sd)

                t0 = time.perf_counter()
                client.push(f"py{mib}", sd, version=2 * rep + 2)
                t["py push dict"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                v = client.pull(f"py{mib}", framework="torch")
                tensors = v.tensors
                t["py pull torch"].append(time.perf_counter() - t0)
                del v, tensors
            mb = len(blob) / 1e6
            rows.append((mib, {k: statistics.median(x) for k, x in t.items()}, mb, "median"))
            rows.append((mib, {k: min(x) for k, x in t.items()}, mb, "best"))
            print(f"# {mib} MiB raw seconds: " + json.dumps({k: [round(s, 4) for s in x] for k, x in t.items()}))
        print()
        print("| state dict | of reps | Go push | Python push | Python ÷ Go time | Go pull | Python pull | Python ÷ Go time "
              "| Python push (encode + push) | Python pull → torch |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for mib, med, mb, how in rows:
            def r(k: str) -> str:
                return f"{mb / med[k]:.0f} MB/s"
            print(f"| {mib} MiB | {how} | {r('go push')} | {r('py push')} | {med['py push'] / med['go push']:.2f}× "
                  f"| {r('go pull')} | {r('py pull')} | {med['py pull'] / med['go pull']:.2f}× "
                  f"| {r('py push dict')} | {r('py pull torch')} |")
        print(f"\n# load average after: {os.getloadavg()[0]:.2f}")
        client.close()
    finally:
        hub.stop()
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
