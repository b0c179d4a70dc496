#!/usr/bin/env python3
"""The learner loop: Python client vs Go client vs plain TCP, one hub, one run.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    PYTHONPATH=python python3 scripts/bench_learner_loop.py [--reps 5] [--iters 200]

Machin's PushPullGradServer layout: one `rlhub serve --data ""` with
`--reduce-batch-size 2` (and `--max-wait 1s`, so every batch is exactly 2
gradients and the sync mode below stays in lockstep), a model of one
`nn.Linear(1000, 1000)` (1,001,000 float32 parameters, 4.0 MB) registered
with SGD and sum reduction, and 2 learner processes. Each rep runs, for the
Python client (`GradClient` + `StoreClient.pull_into`), the Go client
(`rlhub bench-loop`: `reducer.Client` + `storerpc.Client`) and plain TCP of the
same bytes (Python sockets, `sendall` / `recv_into`, to a sink process that
answers each 4 MB with 4 MB), interleaved rep by rep, three modes:

* loop — push a gradient, then pull the newest version if it is newer
  (Machin's loop): server gradients/s = both learners' pushes / wall time;
  pull GB/s = bytes / time of the pulls that returned a version.
* push — pushes only: gradients/s.
* sync — push, then wait for a newer version and take it (the Python
  client's data-plane watch / Go's WaitNewer): push→pullable = for each
  version, the first learner's receipt of it minus the later of the two
  pushes that made it (clocks: time.time_ns / UnixNano on one host).

Prints medians over reps and each figure as a ratio Python ÷ Go and
Python ÷ TCP. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "scripts"))

IN, OUT = 1000, 1000
NBYTES = (IN * OUT + OUT) * 4


def py_learner(args) -> None:
    import torch

    import rlhub
    from rlhub.grads import GradClient

    torch.set_num_threads(1)
    model = torch.nn.Linear(IN, OUT)
    grads = {k: torch.full_like(v, 1e-6) for k, v in model.state_dict().items()}
    sc = rlhub.StoreClient(args.hub)
    gc = GradClient(args.hub, client_id=args.id)
    base = sc.pull_into(args.model, model)
    watch = sc.watch_into(args.model, model, after=base) if args.mode == "sync" else None
    recs = []
    for i in range(args.iters + 1):
        if i == 1:  # after one untimed iteration (connections, discovery)
            print("ready", flush=True)
            sys.stdin.readline()
            recs = []
        t0 = time.time_ns()
        gc.push(args.model, base, grads)
        t1 = time.time_ns()
        pulled = 0
        if args.mode == "loop":
            v = sc.pull_into(args.model, model, if_newer_than=base)
            if v is not None:
                base, pulled = v, NBYTES
        elif args.mode == "sync":
            base, pulled = next(watch), NBYTES
        recs.append({"push_start": t0, "push_end": t1, "end": time.time_ns(), "version": base, "pulled": pulled})
    for r in recs:
        print(json.dumps(r))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (grpc threads)


def tcp_server(args) -> None:
    """Sink: reads 4 MB requests; answers b"k" (push) or 4 MB (loop)."""
    import threading

    lis = socket.socket()
    lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lis.bind(("127.0.0.1", 0))
    lis.listen(16)
    print(lis.getsockname()[1], flush=True)
    reply = bytearray(NBYTES)

    def serve(c):
        buf = memoryview(bytearray(NBYTES + 1))
        with c:
            while True:
                got = 0
                while got < NBYTES + 1:
                    k = c.recv_into(buf[got:])
                    if k == 0:
                        return
                    got += k
                c.sendall(reply if buf[0] == ord("l") else b"k")

    while True:
        c, _ = lis.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def tcp_learner(args) -> None:
    import numpy as np

    payload = np.full(NBYTES, 1, np.uint8)
    s = socket.create_connection(("127.0.0.1", int(args.hub)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(np.empty(NBYTES, np.uint8))
    tag = b"l" if args.mode == "loop" else b"p"
    recs = []
    for i in range(args.iters + 1):
        if i == 1:
            print("ready", flush=True)
            sys.stdin.readline()
            recs = []
        t0 = time.time_ns()
        s.sendmsg([tag, payload])  # a "push": 1 + 4 MB
        t1 = time.time_ns()
        pulled = 0
        if args.mode == "loop":
            got = 0
            while got < NBYTES:
                got += s.recv_into(buf[got:])
            pulled = NBYTES
        else:
            s.recv(1)
        recs.append({"push_start": t0, "push_end": t1, "end": time.time_ns(), "version": 0, "pulled": pulled})
    for r in recs:
        print(json.dumps(r))
    sys.stdout.flush()


def run_pair(cmds) -> "tuple[list, int]":
    """Starts the learners, waits until each has done its untimed first
    iteration and printed "ready", starts them together; returns their
    records and the start time (ns)."""
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            p.kill()
            raise RuntimeError(f"{cmds[0][:3]}: {line!r} {p.stderr.read()[-2000:]}")
    at = time.time_ns()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        so, se = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{cmds[0][:3]} failed ({p.returncode}): {se[-2000:]}")
        out.append([json.loads(line) for line in so.splitlines() if line.startswith("{")])
    return out, at


def summarize(mode: str, recs: list, start_at: int) -> dict:
    n = sum(len(r) for r in recs)
    end = max(r[-1]["end"] for r in recs)
    out = {"grads_per_s": n / ((end - start_at) / 1e9)}
    pulls = [(x["end"] - x["push_end"]) for r in recs for x in r if x["pulled"]]
    if pulls:
        out["pull_gbps"] = NBYTES / (statistics.median(pulls) / 1e9) / 1e9
        out["pulls"] = len(pulls)
    if mode == "sync":
        lat = []
        for a, b in zip(*recs):
            if a["version"] == b["version"]:
                lat.append((min(a["end"], b["end"]) - max(a["push_end"], b["push_end"])) / 1e6)
        if lat:
            lat.sort()
            out["p50_ms"] = lat[len(lat) // 2]
            out["p99_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            out["rounds"] = len(lat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "bin" / "rlhub"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200, help="iterations per learner per run (sync: half)")
    ap.add_argument("--learner", choices=["py", "tcp"], help=argparse.SUPPRESS)
    ap.add_argument("--tcp-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hub")
    ap.add_argument("--model")
    ap.add_argument("--mode")
    ap.add_argument("--id", default="")
    args = ap.parse_args()
    if args.tcp_server:
        return tcp_server(args)
    if args.learner == "py":
        return py_learner(args)
    if args.learner == "tcp":
        return tcp_learner(args)

    import grpc
    import torch

    import rlhub
    from benchhub import Hub
    from rlhub.grads import GradClient

    sink = subprocess.Popen([sys.executable, __file__, "--tcp-server"], stdout=subprocess.PIPE, text=True)
    port = sink.stdout.readline().strip()
    hub = Hub(args.bin, "--reduce-batch-size", "2", "--max-wait", "1s")
    results = {}
    load = [os.getloadavg()[0]]
    t_start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    try:
        model = torch.nn.Linear(IN, OUT)
        with rlhub.StoreClient(hub.addr) as sc:
            gc = GradClient(hub.addr)
            for m in ("py", "go"):
                sc.push(m, model.state_dict(), version=1, expect=0)
                gc.register(m, optimizer={"kind": "sgd", "lr": 1e-9}, reduction="sum", staleness="accept")
            gc.close()
        me = [sys.executable, __file__, "--hub", hub.addr]
        kinds = {
            "py": lambda mode, it, i, at: me + ["--learner", "py", "--model", "py", "--mode", mode, "--iters", str(it),
                                                "--id", f"py{i}-{at}"],
            "go": lambda mode, it, i, at: [args.bin, "bench-loop", "--hub", hub.addr, "--model", "go", "--mode", mode,
                                           "--iters", str(it), "--id", f"go{i}-{at}", "--ready"],
            "tcp": lambda mode, it, i, at: [sys.executable, __file__, "--learner", "tcp", "--hub", port, "--mode", mode,
                                            "--iters", str(it)],
        }
        order = ["py", "go", "tcp"]
        for rep in range(args.reps + 1):  # rep 0 warms up and is dropped
            for mode in ("loop", "push", "sync"):
                for kind in (order if rep % 2 else order[::-1]):
                    if kind == "tcp" and mode == "sync":
                        continue
                    it = args.iters // 2 if mode == "sync" else args.iters
                    if rep == 0:
                        it = min(it, 20)
                    at = time.time_ns()  # unique client ids
                    recs, at = run_pair([kinds[kind](mode, it, i, at) for i in range(2)])
                    if rep:
                        results.setdefault((kind, mode), []).append(summarize(mode, recs, at))
            load.append(os.getloadavg()[0])
    finally:
        hub.stop()
        sink.kill()
        sink.wait()

    def med(kind, mode, key):
        xs = [r[key] for r in results.get((kind, mode), []) if key in r]
        return statistics.median(xs) if xs else float("nan")

    print(f"{t_start} UTC, {args.reps} reps × {args.iters} iterations per learner (sync {args.iters // 2}), "
          f"2 learners, {NBYTES / 1e6:.1f} MB per gradient and per pull; 1-min load per rep "
          f"{', '.join(f'{x:.1f}' for x in load)}; torch {torch.__version__}, grpcio {grpc.__version__}")
    print()
    print("| figure (median of reps) | Python | Go | TCP | Python ÷ Go | Python ÷ TCP |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = [("gradients/s, push + pull loop", "loop", "grads_per_s", "{:.0f}"),
            ("gradients/s, push only", "push", "grads_per_s", "{:.0f}"),
            ("pull GB/s (loop)", "loop", "pull_gbps", "{:.2f}"),
            ("push→pullable p50 ms (sync)", "sync", "p50_ms", "{:.2f}"),
            ("push→pullable p99 ms (sync)", "sync", "p99_ms", "{:.2f}"),
            ("gradients/s, sync", "sync", "grads_per_s", "{:.0f}")]
    for label, mode, key, fmt in rows:
        p, g, t = med("py", mode, key), med("go", mode, key), med("tcp", mode, key)
        f = lambda x: "–" if x != x else fmt.format(x)  # noqa: E731
        r = lambda a, b: "–" if a != a or b != b or not b else f"{a / b:.2f}"  # noqa: E731
        print(f"| {label} | {f(p)} | {f(g)} | {f(t)} | {r(p, g)} | {r(p, t)} |")
    print()
    print("per rep:", json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
