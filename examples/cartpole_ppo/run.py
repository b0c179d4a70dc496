#!/usr/bin/env python3
"""Data-parallel PPO on CartPole-v1 through rlhub, in one command:

    python3 examples/cartpole_ppo/run.py

starts `rlhub serve` (unless --hub is given), two learner processes and two
collector processes, and drives them from this process (the coordinator):

    collectors --rollouts (multiprocessing pipe)--> coordinator
    coordinator --batch (aggregator Learn: split 50/50)--> 2 learners
    learners --gradients (GradClient.push)--> hub reducer (mean of 2, clip, Adam)
    hub --> model store version v+1 --> learners (watch) and collectors
        (rlhub.wsync.Receiver over store pull/watch, or --sync push: the hub's push fan-out)

It stops when the mean return of the last 20 finished training episodes is
at least --target (475), then evaluates the greedy policy, prints the hub's
reducer counters (every pushed gradient applied or dropped), and writes the
curve as CSV and PNG. See docs/python-example.md.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import multiprocessing as mp
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(HERE))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import rlhub  # noqa: E402
from rlhub import _channel  # noqa: E402
from rlhub.aggregator import AggregatorClient  # noqa: E402
from rlhub.grads import GradClient  # noqa: E402

from ppo import ActorCritic, Hyper  # noqa: E402
from roles import MODEL, collector_main, learner_main  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rlhub_binary() -> str:
    b = os.environ.get("RLHUB_BIN")
    if b:
        return b
    b = REPO / "bin" / "rlhub"
    if not b.exists():
        tags = ["-tags=mujoco"] if pathlib.Path("/usr/include/mujoco/mujoco.h").exists() else []
        subprocess.run(["go", "build", *tags, "-o", str(b), "./cmd/rlhub"], cwd=REPO, check=True,
                       env=dict(os.environ, GOEXPERIMENT="simd"))
    return str(b)


def start_hub(data: pathlib.Path) -> tuple[subprocess.Popen, str]:
    addr = f"127.0.0.1:{free_port()}"
    # Batches of exactly the two learners' gradients (a late one is
    # forwarded alone after max-wait): one optimizer step per minibatch.
    p = subprocess.Popen([rlhub_binary(), "serve", "--listen", addr, "--data", str(data / "data"),
                          "--reduce-batch-size", "2", "--max-wait", "200ms"],
                         stdout=open(data / "hub.log", "wb"), stderr=subprocess.STDOUT)
    import grpc
    ch = _channel.channel(addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    ch.close()
    return p, addr


@torch.no_grad()
def evaluate(net: ActorCritic, episodes: int, seed: int) -> list[float]:
    env = gym.make("CartPole-v1")
    out = []
    for i in range(episodes):
        o, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            a = int(net.pi(torch.as_tensor(o, dtype=torch.float32)).argmax())
            o, r, term, trunc, _ = env.step(a)
            total += r
            done = term or trunc
        out.append(total)
    return out


def wait_learners(agg: AggregatorClient, task: str, n: int, timeout: float = 120.0) -> None:
    """Waits until n learners are attached and started on task."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if sum(1 for l in agg.status().learners if l.started_task == task) >= n:
                return
        except rlhub.Unavailable:
            pass  # a hub restarting on its data: not back yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} learners not started on {task} within {timeout:.0f}s")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hub", help="use a running hub instead of starting one (needs --reduce-batch-size 2): "
                    "HOST:PORT, or etcd://ENDPOINTS/CLUSTER to follow a cluster's primary")
    ap.add_argument("--model", help=f"the model's name on the hub (default {MODEL!r} on the hub the example "
                    f"starts; with --hub, {MODEL!r} plus the seed and the start time, so runs can share a hub)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sync", choices=["pull", "push"], default="pull",
                    help="collectors' weight sync: store pull/watch, or the hub's push fan-out")
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--max-iters", type=int, default=400)
    # Outputs go under runs/ (ignored by git), like `rlhub train ars`: a run
    # never overwrites the committed figure; docs/python-example.md names
    # the flags that regenerate it.
    ap.add_argument("--csv", default=str(REPO / "runs" / "cartpole_ppo" / "curve.csv"))
    ap.add_argument("--png", default=str(REPO / "runs" / "cartpole_ppo" / "curve.png"))
    args = ap.parse_args()
    model = args.model or (f"{MODEL}-s{args.seed}-{time.strftime('%Y%m%dT%H%M%S')}" if args.hub else MODEL)
    h = Hyper()
    torch.set_num_threads(1)
    t_start = time.monotonic()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rlhub-cartpole-"))
    hub_proc, addr = (None, args.hub) if args.hub else start_hub(tmp)
    print(f"hub {addr}" + (f" (log {tmp / 'hub.log'})" if hub_proc else "") + f", model {model}", flush=True)

    ctx = mp.get_context("spawn")
    procs: list = []
    pipes = []
    try:
        torch.manual_seed(args.seed)
        net = ActorCritic(hidden=h.hidden)
        with rlhub.StoreClient(addr) as store:
            store.push(model, net.state_dict(), version=1, expect=0)
        grads = GradClient(addr, "coordinator")
        grads.register(model, optimizer=torch.optim.Adam(net.parameters(), lr=h.lr, eps=1e-5),
                       reduction="mean", gradient_max=h.max_grad_norm)

        for i in range(2):
            p = ctx.Process(target=learner_main, args=(addr, f"learner-{i}", h, args.seed * 1000 + i, model), daemon=True)
            p.start()
            procs.append(p)
        for i in range(2):
            a, b = ctx.Pipe()
            p = ctx.Process(target=collector_main, args=(b, addr, h, args.seed * 1000 + 100 * (i + 1),
                                                         f"collector-{i}", args.sync, model), daemon=True)
            p.start()
            procs.append(p)
            pipes.append(a)

        agg = AggregatorClient(addr)
        deadline = time.monotonic() + 60
        while len(agg.resources()) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("learners did not attach")
            time.sleep(0.05)
        task = agg.start(model, dataclasses.asdict(h)).task_id
        demand = agg.get_data_demand(task)
        print(f"learners {demand.learners} demand {demand.batch_sizes} rows", flush=True)

        store = rlhub.StoreClient(addr)
        version, env_steps, returns, rows = 1, 0, [], []
        failovers = 0
        solved = False
        for it in range(args.max_iters):
            for c in pipes:
                c.send(version)
            got = [c.recv() for c in pipes]
            for _, fin, ran in got:
                assert ran >= version, (ran, version)
                returns += fin
            env_steps += sum(len(d["obs"]) for d, _, _ in got)
            mean20 = float(np.mean(returns[-20:])) if returns else 0.0
            row = dict(iteration=it, env_steps=env_steps, wall_s=round(time.monotonic() - t_start, 2),
                       version=version, episodes=len(returns), mean_return_20=round(mean20, 2))
            if len(returns) >= 20 and mean20 >= args.target:
                rows.append(row)
                solved = True
                break
            batch = {k: np.concatenate([d[k] for d, _, _ in got]) for k in got[0][0]}
            try:
                res = agg.learn(task, batch, metadata={"step": str(it)})
            except rlhub.Unavailable as e:
                # The hub went away with the learn in flight (restarted on
                # its data, or a cluster's primary killed): its outcome is
                # unknown, some minibatch steps may have landed. The task
                # lives on in the hub's data (and a new primary's); once
                # the learners are back on it, collect again at the newest
                # version.
                failovers += 1
                print(f"iteration {it}: learn failed ({str(e)[:200]}); waiting for the learners to be "
                      f"back on the hub, then collecting again", flush=True)
                wait_learners(agg, task, 2)
                version = max(m.version for m in store.list() if m.name == model)
                continue
            if res.failed:
                print(f"iteration {it}: learners failed and were re-split: {res.failed}", flush=True)
            version = max(m.version for m in store.list() if m.name == model)
            row.update(pg_loss=round(float(np.mean(res.info["pg_loss"])), 5),
                       v_loss=round(float(np.mean(res.info["v_loss"])), 3),
                       approx_kl=round(float(np.mean(res.info["approx_kl"])), 5))
            rows.append(row)
            if it % 10 == 0:
                print(f"iter {it:3d}  steps {env_steps:6d}  version {version:4d}  "
                      f"mean return (last 20) {mean20:6.1f}  {row['wall_s']:6.1f}s", flush=True)
        wall = time.monotonic() - t_start
        print(f"{'solved' if solved else 'NOT solved'}: mean return of the last 20 episodes "
              f"{rows[-1]['mean_return_20']:.1f} after {env_steps} env steps, {len(rows)} iterations, "
              f"model version {version}, {wall:.1f}s", flush=True)

        final = store.pull(model, framework="torch")
        net.load_state_dict(final.tensors)
        ev = evaluate(net, 10, seed=12345)
        print(f"greedy evaluation of version {final.version}: mean return {np.mean(ev):.1f} over 10 episodes")

        st = grads.stats()
        t = st.total
        if failovers:
            print(f"{failovers} learn(s) cut by the hub going away (a restart or a failover): the counters "
                  f"below are the serving hub's, since it started")
        print(f"reducer counters: pushed {t.pushed}  reduced {t.reduced}  applied {t.applied}  "
              f"steps {t.steps}  dropped {t.dropped_total} {t.dropped or ''}  queue {t.queue_depth}")
        for name, c in sorted(st.parts.items()):
            print(f"  {name:14s} pushed {c.pushed}  reduced {c.reduced}  applied {c.applied}  "
                  f"steps {c.steps}  dropped {c.dropped_total}")
        ok = t.pushed == t.applied + t.dropped_total
        print(f"every gradient accounted for (pushed = applied + dropped): {ok}; "
              f"publish latency p50 {st.publish_p50_us:.0f}µs p99 {st.publish_p99_us:.0f}µs")
        import rlhub.wsync as ws
        for m in ws.status(addr, model):
            lags = ", ".join(f"{c.collector_id} v{c.version} lag {c.lag} via {c.via}" for c in m.collectors)
            print(f"weight sync: newest v{m.newest}; {lags}")
        agst = agg.status()
        print(f"aggregator: learn ok {agst.learn_ok} failed {agst.learn_failed} resplits {agst.resplits}")

        write_curve(rows, args.csv, args.png, wall, solved)
        return 0 if solved and ok else 1
    finally:
        for c in pipes:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
                p.join()
        if hub_proc is not None:
            hub_proc.send_signal(signal.SIGINT)
            try:
                hub_proc.wait(20)
            except subprocess.TimeoutExpired:
                hub_proc.kill()
            shutil.rmtree(tmp, ignore_errors=True)


def write_curve(rows: list, csv_path: str, png_path: str, wall: float, solved: bool) -> None:
    pathlib.Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    keys = ["iteration", "env_steps", "wall_s", "version", "episodes", "mean_return_20", "pg_loss", "v_loss",
            "approx_kl"]
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    print(f"curve: {csv_path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["env_steps"] for r in rows], [r["mean_return_20"] for r in rows], label="mean return, last 20 episodes")
    ax.axhline(475, color="gray", linestyle="--", label="target 475")
    ax.set_xlabel("environment steps (2 collectors × 8 envs)")
    ax.set_ylabel("return")
    ax.set_title(f"CartPole-v1, PPO, 2 learners → rlhub reducer ({'solved' if solved else 'not solved'} in {wall:.0f}s)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    pathlib.Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    print(f"plot: {png_path}")


if __name__ == "__main__":
    sys.exit(main())
