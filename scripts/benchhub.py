"""A hub for the Python benchmark scripts (scripts/bench_python_*.py).

Hub runs `rlhub serve --listen ADDR --data "" FLAGS` (in-memory store: the
transfer is measured, not the hub's disk) on a free loopback port and
returns once it answers gRPC; stop() ends it (SIGINT, then kill after 20 s).
"""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import tempfile
from typing import Optional

import grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    """One `rlhub serve` process; its output goes to log (default: a kept
    temporary file, rlhub-bench-hub-*.log). Also a context manager."""

    def __init__(self, binary: str, *flags: str, log: Optional[pathlib.Path] = None):
        self.addr = f"127.0.0.1:{free_port()}"
        if log is None:
            with tempfile.NamedTemporaryFile(prefix="rlhub-bench-hub-", suffix=".log", delete=False) as f:
                log = pathlib.Path(f.name)
        self.log = log
        with open(log, "wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen([binary, "serve", "--listen", self.addr, "--data", "", *flags],
                                         stdout=out, stderr=subprocess.STDOUT)
        try:
            with grpc.insecure_channel(self.addr) as ch:
                grpc.channel_ready_future(ch).result(timeout=30)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Hub":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def add_loop_models(addr: str, names=("py", "go")) -> None:
    """The learner loop's models on the hub at addr (Machin's
    PushPullGradServer layout, issue 18): version 1 of one
    nn.Linear(1000, 1000) as each of names, registered for gradients with
    SGD (lr 1e-9, so the weights stay finite), sum reduction, stale
    gradients accepted."""
    import torch

    import rlhub
    from rlhub.grads import GradClient

    model = torch.nn.Linear(1000, 1000)
    with rlhub.StoreClient(addr) as sc, GradClient(addr) as gc:
        for name in names:
            sc.push(name, model.state_dict(), version=1, expect=0)
            gc.register(name, optimizer={"kind": "sgd", "lr": 1e-9}, reduction="sum", staleness="accept")
