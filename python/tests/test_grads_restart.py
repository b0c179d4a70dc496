"""GradClient rides out restarts (docs/durability.md): a SIGKILLed primary hub
restarted on its --data takes the pushes of clients that were running, without
registering again, and a secondary restarted at a new address gets pushes from
them by the periodic refresh."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import threading
import time

import grpc
import pytest
import torch

import rlhub
from rlhub.grads import GradClient
from rlhub.errors import RlhubError
from conftest import free_port


def serve(binary: str, log: pathlib.Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([binary, "serve", *args], stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def wait_ready(addr: str, timeout: float = 30.0) -> None:
    ch = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(ch).result(timeout=timeout)
    finally:
        ch.close()


def kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait()


def eventually(cond, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def grads(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, generator=g)}


def test_push_rides_out_a_primary_hub_kill(rlhub_bin, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    args = ("--listen", addr, "--data", str(tmp_path / "data"))
    hub = serve(rlhub_bin, tmp_path / "hub.log", *args)
    try:
        wait_ready(addr)
        with rlhub.StoreClient(addr) as s:
            s.push("pol", {"w": torch.zeros(64)}, version=1)
        with GradClient(addr, seed=3, deadline=60.0) as g:
            g.register("pol", optimizer={"kind": "adam", "lr": 0.01})
            for i in range(3):
                g.push("pol", 0, grads(i))
            eventually(lambda: g.stats().versions.get("pol", 0) >= 2, "a step before the kill")
            kill(hub)
            hub = serve(rlhub_bin, tmp_path / "hub.log", *args)
            # The client was running before the restart: no register again.
            r = g.push("pol", 0, grads(100))
            assert r.attempts >= 1
            st = g.stats()
            eventually(lambda: g.stats().parts["primary"].applied >= 1, "the push applied after the restart")
            assert "pol" in st.versions
    finally:
        kill(hub)


def test_restarted_secondary_gets_pushes_from_running_clients(rlhub_bin, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    hub = serve(rlhub_bin, tmp_path / "hub.log", "--listen", addr, "--data", "", "--reducer-secondaries", "-1")
    procs = [hub]

    def secondary() -> str:
        a = f"127.0.0.1:{free_port()}"
        procs.append(serve(rlhub_bin, tmp_path / "sec.log", "--role", "reducer", "--primary", addr,
                           "--listen", a, "--data", "", "--max-wait", "1ms"))
        return a

    stop = threading.Event()
    failures = []
    try:
        wait_ready(addr)
        with rlhub.StoreClient(addr) as s:
            s.push("pol", {"w": torch.zeros(64)}, version=1)
        stay, victim = secondary(), secondary()
        with GradClient(addr, seed=5, refresh_every=0.2) as g:
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.01})
            listed = lambda a: any(x == a for x, _ in g.secondaries())  # noqa: E731
            eventually(lambda: listed(stay) and listed(victim), "both secondaries attached")

            def pushing() -> None:
                i = 0
                while not stop.is_set():
                    try:
                        g.push("pol", 0, grads(i))
                    except Exception as e:  # noqa: BLE001 - reported below
                        failures.append(e)
                        return
                    i += 1

            t = threading.Thread(target=pushing)
            t.start()
            try:
                def pushed_at(a: str) -> int:
                    try:
                        return g.stats(a).total.pushed
                    except RlhubError:
                        return 0

                eventually(lambda: pushed_at(victim) > 0, "pushes at the victim")
                kill(procs[2])
                with GradClient(addr) as admin:
                    eventually(lambda: not any(x == victim for x, _ in admin.secondaries()), "the victim's session to end")
                back = secondary()
                eventually(lambda: pushed_at(back) > 0, "pushes from the running client at the restarted secondary")
            finally:
                stop.set()
                t.join(timeout=60)
        assert not failures, failures
    finally:
        for p in procs:
            kill(p)
