#!/usr/bin/env python3
"""The learner loop: Python client vs Go client vs plain TCP vs Machin, one run.

    GOEXPERIMENT=simd go build -o bin/rlhub ./cmd/rlhub
    scripts/setup_machin.sh   # Machin 0.4.2 into .cache/machin (setup.sh and benchref run it)
    PYTHONPATH=python python3 scripts/bench_learner_loop.py [--reps 5] [--iters 200] [--arms py,go,tcp,machin]

Machin's PushPullGradServer layout: one `rlhub serve --data ""` with
`--reduce-batch-size 2` (and `--max-wait 1s`, so every batch is exactly 2
gradients and the sync mode below stays in lockstep), a model of one
`nn.Linear(1000, 1000)` (1,001,000 float32 parameters, 4.0 MB) registered
with SGD and sum reduction, and 2 learner processes. Each rep runs, for the
Python client (`GradClient` + `StoreClient.pull_into`), the Go client
(`rlhub bench-loop`: `reducer.Client` + `storerpc.Client`), plain TCP of the
same bytes (Python sockets, `sendall` / `recv_into`, to a sink process that
answers each 4 MB with 4 MB) and Machin 0.4.2 itself, interleaved rep by rep,
three modes:

* loop — push a gradient, then pull the newest version if it is newer
  (Machin's loop): server gradients/s = both learners' pushes / wall time;
  pull GB/s = bytes / time of the pulls that returned a version.
* push — pushes only: gradients/s.
* sync — push, then wait for a newer version and take it (the Python
  client's data-plane watch / Go's WaitNewer): push→pullable = for each
  version, the first learner's receipt of it minus the later of the two
  pushes that made it (clocks: time.time_ns / UnixNano on one host).

The Machin arm is Machin's own PushPullGradServerImpl in the layout of its
test and grad_server_helper: a 3-process Machin World (torch RPC over
TensorPipe with the options World gives it, which let TensorPipe pick its
best transport and channel for the host; --machin-transport uv|shm|cma
starts the RPC agent with one instead), rank 0 the primary and only secondary
reducer managing the model (SGD, sum, reduce_batch_size 2), ranks 1 and 2
the learners using the accessor `group.get_paired("server")`, a new World
per run (its size is fixed). loop is the accessor's push(model) (push the
gradient, then pull the whole newest state dict, always); push is the first
half of that call; sync pushes 2 gradients per learner per round, since
Machin's primary reducer batches reduce_batch_size secondary results and a
version takes 4 gradients, and polls the ordered server's pull until the
version is newer. Machin's queues drop the oldest gradients past 64 and
gradients/s counts pushes accepted, as for rlhub. Machin 0.4.2 needs two
names torch 2.15 dropped (see import_machin); the arm is skipped, with the
reason printed, when .cache/machin has no Machin.

Each run also takes the CPU time, from "go" to the end, of the learners
(their getrusage less what they had spent when ready) and of the server
process (the hub, the TCP sink or Machin's rank 0: /proc utime + stime),
per gradient: on a shared machine wall-clock rates swing with the load,
CPU per gradient much less, and learners and server compete for the same
cores.

Prints medians over reps and each figure as a ratio Python ÷ Go,
Python ÷ TCP and Python ÷ Machin. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
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
MACHIN = REPO / ".cache" / "machin"  # scripts/setup_machin.sh installs Machin 0.4.2 here
MACHIN_MEMBERS = ["0", "1", "2"]  # rank 0 the server, 1 and 2 the learners


def start_gate(i: int) -> bool:
    """At iteration 1, after one untimed iteration (connections, discovery):
    says "ready", waits for the parent's "go" and returns True (the caller
    drops its records); False at every other iteration."""
    if i != 1:
        return False
    print("ready", flush=True)
    sys.stdin.readline()
    return True


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
        if start_gate(i):
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


def import_machin():
    """Imports machin.parallel from .cache/machin (scripts/setup_machin.sh)
    and returns the machin.parallel module; ImportError when Machin is not
    installed there.

    Two things stand between Machin 0.4.2 and torch 2.15, both names that
    torch dropped and that Machin's modules touch when they are imported
    (neither is called on the path measured here):

    * machin/parallel/pickle.py imports torch.multiprocessing.reductions'
      reduce_event, which torch renamed _reduce_event ("ImportError: cannot
      import name 'reduce_event'"); it goes into a pickler's dispatch table
      for CUDA events. The old name is bound to the same function.
    * machin/parallel/distributed/_world.py decorates CollectiveGroup's
      *_multigpu methods with _copy_doc(dist.broadcast_multigpu) and three
      more functions torch.distributed removed ("AttributeError: module
      'torch.distributed' has no attribute 'broadcast_multigpu'"); the
      decorator only copies their docstrings under Sphinx. The names are
      bound to functions that raise, so a call would say what is missing.

    Machin's top-level package and machin.utils run `from . import ...` of
    every subpackage (environments over gym, algorithms over torchviz, media
    over moviepy and matplotlib, tensorboardX), none of which
    machin.parallel uses; their __init__ files are not run (the packages are
    entered as bare modules with Machin's own __path__), so those
    dependencies (about 250 MB with ffmpeg) are not needed. Every module the
    server and learners do run is Machin's own, unchanged.
    """
    import importlib.machinery
    import types

    import torch
    import torch.distributed as dist
    import torch.multiprocessing.reductions as reductions

    if not (MACHIN / "machin" / "parallel").is_dir():
        raise ImportError(f"Machin is not installed in {MACHIN} (scripts/setup_machin.sh installs it)")
    if str(MACHIN) not in sys.path:
        sys.path.insert(0, str(MACHIN))
    if not hasattr(reductions, "reduce_event"):
        reductions.reduce_event = reductions._reduce_event
    for name in ("broadcast_multigpu", "all_reduce_multigpu", "reduce_multigpu", "all_gather_multigpu"):
        if not hasattr(dist, name):
            def removed(*_a, _name=name, **_k):
                raise RuntimeError(f"torch.distributed.{_name} is not in torch {torch.__version__}")
            setattr(dist, name, removed)
    for pkg in ("machin", "machin.utils"):
        if pkg in sys.modules:
            continue
        parent_name, _, leaf = pkg.rpartition(".")
        parent = sys.modules.get(parent_name)
        spec = importlib.machinery.PathFinder.find_spec(pkg, list(parent.__path__) if parent else [str(MACHIN)])
        if spec is None:
            raise ImportError(f"{pkg} not found in {MACHIN}")
        mod = types.ModuleType(pkg)
        mod.__path__ = list(spec.submodule_search_locations)
        mod.__spec__, mod.__file__ = spec, spec.origin
        sys.modules[pkg] = mod
        if parent is not None:
            setattr(parent, leaf, mod)
    import machin.parallel
    import machin.parallel.server  # noqa: F401  (None if torch.distributed failed)

    if machin.parallel.server is None or machin.parallel.distributed is None:
        raise ImportError("machin.parallel could not import its distributed/server modules on this torch")
    return machin.parallel


def machin_world(args):
    """Machin's World for this process: rank args.rank of 3, torch RPC
    (TensorPipe, with the options Machin's World gives it) and the gloo
    process group it also starts, rendezvous on the two ports in args.hub."""
    from machin.parallel.distributed import World
    from machin.parallel.distributed._world import is_world_initialized
    from torch.distributed import rpc

    dist_port, rpc_port = args.hub.split(",")
    name, init = MACHIN_MEMBERS[args.rank], f"tcp://127.0.0.1:{rpc_port}"
    if args.machin_transport != "default":
        # World(init_rpc=False) over an RPC agent started here with one
        # TensorPipe transport (and the channel that goes with it).
        opts = {"uv": {"_transports": ["uv"], "_channels": ["basic"]},
                "shm": {"_transports": ["shm"], "_channels": ["basic"]},
                "cma": {"_transports": ["shm"], "_channels": ["cma"]}}[args.machin_transport]
        rpc.init_rpc(name, rank=args.rank, world_size=len(MACHIN_MEMBERS), backend=rpc.BackendType.TENSORPIPE,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=60, **opts))
    world = World(name=name, rank=args.rank, world_size=len(MACHIN_MEMBERS), init_rpc=args.machin_transport == "default",
                  dist_init_method=f"tcp://127.0.0.1:{dist_port}", rpc_init_method=init)
    # Rank 0 keeps the World's lookup tables, and its World object exists only
    # once its constructor returns, a moment after RPC is up everywhere: a
    # learner that registers first fails on rank 0 ("'NoneType' object has
    # no attribute 'service_lut'"). Wait for it (start-up, untimed).
    while args.rank and not rpc.rpc_sync(MACHIN_MEMBERS[0], is_world_initialized):
        time.sleep(0.01)
    return world


def machin_server(args) -> None:
    """Rank 0: Machin's PushPullGradServerImpl as its own test and
    grad_server_helper lay it out: primary and only secondary reducer, the
    managed model with SGD, sum, reduce batch 2; runs until killed."""
    import torch

    import_machin()
    from machin.parallel.server import PushPullGradServerImpl

    world = machin_world(args)
    group = world.create_rpc_group("group", MACHIN_MEMBERS)
    server = PushPullGradServerImpl("server", group, primary_reducer="0", secondary_reducers=["0"],
                                    reduce_method="sum", reduce_batch_size=2)
    model = torch.nn.Linear(IN, OUT)
    server.manage_model(model, torch.optim.SGD(model.parameters(), lr=1e-9))
    server.start()
    group.barrier()
    print("serving", flush=True)
    while True:
        server.watch()  # re-raises an exception of the reduction thread
        time.sleep(0.05)


def machin_learner(args) -> None:
    """Ranks 1 and 2: the accessor group.get_paired("server") gives.

    loop: PushPullGradServer.push(model) — Machin's push gradient + pull the
      newest model (its pull always returns the whole state dict; the
      accessor's pull is wrapped only to note when it starts).
    push: the push half of that call (the gradient dict copied as push does,
      group.registered_sync to the secondary reducer's service).
    sync: two such pushes, then o_server.pull until the version is newer and
      load it: Machin's primary reducer also batches reduce_batch_size
      secondary results, so a version takes 4 gradients, 2 per learner.
    """
    import random
    from copy import deepcopy

    import torch

    import_machin()
    from machin.parallel.server.param_server import ReduceType
    from machin.utils.prepare import prep_load_state_dict

    torch.set_num_threads(1)
    world = machin_world(args)
    group = world.create_rpc_group("group", MACHIN_MEMBERS)
    group.barrier()
    server = group.get_paired("server").to_here()
    model = torch.nn.Linear(IN, OUT)
    grads = [torch.full_like(p, 1e-6) for p in model.parameters()]

    def set_grads():  # what backward() leaves; Machin's pull sets them to None
        for p, g in zip(model.parameters(), grads):
            p.grad = g

    pull_at = []
    accessor_pull = server.pull

    def timed_pull(m):
        pull_at.append(time.time_ns())
        return accessor_pull(m)

    server.pull = timed_pull

    def push_only():  # the first half of PushPullGradServer.push
        set_grads()
        grad_dict = {k: deepcopy(v.grad).to("cpu") for k, v in model.named_parameters()}
        group.registered_sync(random.choice(server.secondary_services), args=(grad_dict, ReduceType.REDUCE_SECONDARY))

    def newest():
        got = server.o_server.pull(server.model_name)
        return got if got is not None else (None, 0)

    base = 0
    recs = []
    for i in range(args.iters + 1):
        if start_gate(i):
            recs = []
        t0 = time.time_ns()
        pulled, n = 0, 1
        if args.mode == "loop":
            set_grads()
            got = server.push(model)  # True when its pull returned a model (none before the first version)
            t1, pulled = pull_at[-1], NBYTES if got else 0
        elif args.mode == "push":
            push_only()
            t1 = time.time_ns()
        else:
            push_only()
            push_only()
            t1, n = time.time_ns(), 2
            while True:
                state, v = newest()
                if v > base:
                    break
            prep_load_state_dict(model, state)
            base, pulled = v, NBYTES
        recs.append({"push_start": t0, "push_end": t1, "end": time.time_ns(), "version": base, "pulled": pulled,
                     "grads": n})
    print(json.dumps({"final_version": newest()[1]}))
    for r in recs:
        print(json.dumps(r))
    sys.stdout.flush()
    os._exit(0)  # the other learner may still be calling the server; no rpc.shutdown barrier


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
        if start_gate(i):
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


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live (or not yet reaped) process so far."""
    f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def run_pair(cmds, servers=()) -> "tuple[list, int, list, dict]":
    """Starts the learners, waits until each has done its untimed first
    iteration and printed "ready", starts them together; returns their
    records, the start time (ns), the versions the learners report
    last (Machin's learners only) and the CPU seconds spent from "go" to
    the end: by the learners ("learners", their whole lives from
    getrusage(RUSAGE_CHILDREN) minus what they had spent when they said
    ready) and by the server processes ``servers`` (pids, "server")."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                p.kill()
                raise RuntimeError(f"{cmds[0][:3]}: {line!r} {p.stderr.read()[-2000:]}")
        ready = sum(cpu_seconds(p.pid) for p in procs)
        srv0 = sum(cpu_seconds(pid) for pid in servers)
        at = time.time_ns()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out, finals = [], []
        for p in procs:
            so, se = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{cmds[0][:3]} failed ({p.returncode}): {se[-2000:]}")
            lines = [json.loads(line) for line in so.splitlines() if line.startswith("{")]
            out.append([x for x in lines if "push_start" in x])
            finals.extend(x["final_version"] for x in lines if "final_version" in x)
        srv = sum(cpu_seconds(pid) for pid in servers) - srv0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        lrn = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - ready
        return out, at, finals, {"learners": lrn, "server": srv}
    finally:
        # One learner failing leaves the other waiting (a Machin learner
        # spins on a server that is gone): end every one this call started.
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def summarize(mode: str, recs: list, start_at: int, cpu: dict) -> dict:
    n = sum(x.get("grads", 1) for r in recs for x in r)
    end = max(r[-1]["end"] for r in recs)
    out = {"grads_per_s": n / ((end - start_at) / 1e9),
           "learner_cpu_ms": cpu["learners"] * 1e3 / n, "server_cpu_ms": cpu["server"] * 1e3 / n}
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
    ap.add_argument("--arms", default="py,go,tcp,machin",
                    help="comma-separated subset of py, go, tcp, machin (default: all)")
    ap.add_argument("--modes", default="loop,push,sync", help="comma-separated subset of loop, push, sync")
    ap.add_argument("--no-warmup", action="store_true", help="skip the dropped warm-up rep (the smoke test)")
    ap.add_argument("--machin-transport", choices=["default", "uv", "shm", "cma"], default="default",
                    help="Machin's torch RPC: the options its World gives TensorPipe (default: every transport and "
                         "channel, TensorPipe picks), or one transport/channel: uv (TCP), shm, shm + cma")
    ap.add_argument("--json", help="also write the per-rep results and Machin's versions to this file")
    ap.add_argument("--learner", choices=["py", "tcp", "machin"], help=argparse.SUPPRESS)
    ap.add_argument("--tcp-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--machin-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hub")
    ap.add_argument("--model")
    ap.add_argument("--mode")
    ap.add_argument("--id", default="")
    args = ap.parse_args()
    if args.tcp_server:
        return tcp_server(args)
    if args.machin_server:
        return machin_server(args)
    if args.learner == "py":
        return py_learner(args)
    if args.learner == "tcp":
        return tcp_learner(args)
    if args.learner == "machin":
        return machin_learner(args)

    import grpc
    import torch

    from benchhub import Hub, add_loop_models, free_port

    order = [a for a in ("py", "go", "tcp", "machin") if a in args.arms.split(",")]
    if not order or set(args.arms.split(",")) - set(order):
        ap.error(f"--arms: a subset of py,go,tcp,machin, got {args.arms!r}")
    modes = [m for m in ("loop", "push", "sync") if m in args.modes.split(",")]
    if not modes or set(args.modes.split(",")) - set(modes):
        ap.error(f"--modes: a subset of loop,push,sync, got {args.modes!r}")
    machin_note = ""
    if "machin" in order:
        try:
            import_machin()
            from importlib.metadata import version

            machin_note = (f", Machin {version('machin')} (PushPullGradServer over torch RPC, TensorPipe "
                           f"{args.machin_transport})")
        except ImportError as e:
            order.remove("machin")
            machin_note = f"; Machin arm skipped: {e}"
            print(f"bench_learner_loop: Machin arm skipped: {e}", file=sys.stderr)

    sink = hub = None
    port = ""
    if "tcp" in order:
        sink = subprocess.Popen([sys.executable, __file__, "--tcp-server"], stdout=subprocess.PIPE, text=True)
        port = sink.stdout.readline().strip()
    results = {}
    machin_versions = []
    load = [os.getloadavg()[0]]
    t_start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    try:
        if "py" in order or "go" in order:
            hub = Hub(args.bin, "--reduce-batch-size", "2", "--max-wait", "1s")
            add_loop_models(hub.addr)
        me = [sys.executable, __file__, "--hub", hub.addr if hub else ""]
        kinds = {
            "py": lambda mode, it, i, at: me + ["--learner", "py", "--model", "py", "--mode", mode, "--iters", str(it),
                                                "--id", f"py{i}-{at}"],
            "go": lambda mode, it, i, at: [args.bin, "bench-loop", "--hub", me[3], "--model", "go", "--mode", mode,
                                           "--iters", str(it), "--id", f"go{i}-{at}", "--ready"],
            "tcp": lambda mode, it, i, at: [sys.executable, __file__, "--learner", "tcp", "--hub", port, "--mode", mode,
                                            "--iters", str(it)],
            "machin": lambda mode, it, i, at: [sys.executable, __file__, "--learner", "machin", "--hub", at,
                                               "--rank", str(i + 1), "--mode", mode, "--iters", str(it),
                                               "--machin-transport", args.machin_transport],
        }
        for rep in range(1 if args.no_warmup else 0, args.reps + 1):  # rep 0 warms up and is dropped
            for mode in modes:
                for kind in (order if rep % 2 else order[::-1]):
                    if kind == "tcp" and mode == "sync":
                        continue
                    it = args.iters // 2 if mode == "sync" else args.iters
                    if rep == 0:
                        it = min(it, 20)
                    at = str(time.time_ns())  # unique client ids
                    server = None
                    if kind == "machin":  # a new World per run: Machin's has a fixed size
                        at = f"{free_port()},{free_port()}"
                        server = subprocess.Popen([sys.executable, __file__, "--machin-server", "--hub", at,
                                                   "--machin-transport", args.machin_transport],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    try:
                        servers = {"py": hub, "go": hub, "tcp": sink, "machin": server}[kind]
                        recs, t0, finals, cpu = run_pair([kinds[kind](mode, it, i, at) for i in range(2)],
                                                         [servers.proc.pid if kind in ("py", "go") else servers.pid])
                    except RuntimeError:
                        if server is not None and server.poll() is not None:
                            print(f"machin server exited {server.returncode}: {server.stderr.read()[-2000:]}",
                                  file=sys.stderr)
                        raise
                    finally:
                        if server is not None:
                            server.kill()
                            server.communicate()
                    if kind == "machin":
                        machin_versions.append({"rep": rep, "mode": mode, "final_versions": finals})
                    if rep:
                        results.setdefault((kind, mode), []).append(summarize(mode, recs, t0, cpu))
            load.append(os.getloadavg()[0])
    finally:
        if hub is not None:
            hub.stop()
        if sink is not None:
            sink.kill()
            sink.wait()

    def med(kind, mode, key):
        xs = [r[key] for r in results.get((kind, mode), []) if key in r]
        return statistics.median(xs) if xs else float("nan")

    print(f"{t_start} UTC, {args.reps} reps × {args.iters} iterations per learner (sync {args.iters // 2}), "
          f"2 learners, {NBYTES / 1e6:.1f} MB per gradient and per pull; 1-min load per rep "
          f"{', '.join(f'{x:.1f}' for x in load)}; torch {torch.__version__}, grpcio {grpc.__version__}{machin_note}")
    print()
    print("| figure (median of reps) | Python | Go | TCP | Machin | Python ÷ Go | Python ÷ TCP | Python ÷ Machin |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [("gradients/s, push + pull loop", "loop", "grads_per_s", "{:.0f}"),
            ("gradients/s, push only", "push", "grads_per_s", "{:.0f}"),
            ("pull GB/s (loop)", "loop", "pull_gbps", "{:.2f}"),
            ("push→pullable p50 ms (sync)", "sync", "p50_ms", "{:.2f}"),
            ("push→pullable p99 ms (sync)", "sync", "p99_ms", "{:.2f}"),
            ("gradients/s, sync", "sync", "grads_per_s", "{:.0f}"),
            ("learners' CPU ms per gradient (loop)", "loop", "learner_cpu_ms", "{:.2f}"),
            ("server's CPU ms per gradient (loop)", "loop", "server_cpu_ms", "{:.2f}")]
    for label, mode, key, fmt in rows:
        p, g, t, m = (med(k, mode, key) for k in ("py", "go", "tcp", "machin"))
        f = lambda x: "–" if x != x else fmt.format(x)  # noqa: E731
        r = lambda a, b: "–" if a != a or b != b or not b else f"{a / b:.2f}"  # noqa: E731
        print(f"| {label} | {f(p)} | {f(g)} | {f(t)} | {f(m)} | {r(p, g)} | {r(p, t)} | {r(p, m)} |")
    print()
    print("per rep:", json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {f"{k[0]}/{k[1]}": v for k, v in results.items()}, "machin_versions": machin_versions,
                       "arms": order, "load": load}, f)


if __name__ == "__main__":
    main()
