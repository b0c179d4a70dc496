"""Fixtures that run the real rlhub binary.

RLHUB_BIN names a built binary (scripts/test.sh sets it); otherwise the
binary is built once per session with `go build`.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import socket
import subprocess
import time

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Ray on Linux resolves 127.0.0.1 to the host's outward address; with this
# set before ray is imported every node, driver and worker stays on
# loopback. Here, not in test_ray.py: importing torchrl imports ray, so a
# test module that imports torchrl first would fix Ray's choice before
# test_ray.py could set it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def rlhub_bin(tmp_path_factory) -> str:
    b = os.environ.get("RLHUB_BIN")
    if b:
        return b
    out = tmp_path_factory.mktemp("bin") / "rlhub"
    env = dict(os.environ, GOEXPERIMENT="simd")
    subprocess.run(["go", "build", "-o", str(out), "./cmd/rlhub"], cwd=REPO, env=env, check=True)
    return str(out)


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on at the moment of the call, below
    the kernel's ephemeral range and not handed out before by this process:
    for a server that binds the port it is given (etcd, a relay's or a
    hub's --listen, a hub restarted on its address), and for an address
    that must refuse connections. A port from the ephemeral range (what
    binding port 0 gives) could meanwhile become the source port of an
    outgoing connection — a client reconnecting to a hub being restarted,
    another etcd member's peer link — and the server's bind then fails
    ("bind: address already in use", seen in CI for an etcd cluster). A
    server that can report the port it bound binds port 0 itself instead
    (Hub does)."""
    low = min(_ephemeral_low(), 65536)
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12000), low)
        if port in _given:  # handed to a server not started yet
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port below {low}")


_given: set[int] = set()


class Hub:
    """A running `rlhub serve` process on loopback. Without addr it binds
    port 0 and reports the port it got through --addr-file; with addr (a
    restart on the address of an earlier hub) it listens there."""

    def __init__(self, binary: str, data_dir: pathlib.Path, extra=(), addr: str | None = None):
        self.binary = binary
        self.data_dir = data_dir
        self.log = open(data_dir / "hub.log", "wb")
        addr_file = data_dir / "hub.addr"
        addr_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", addr or "127.0.0.1:0", "--addr-file", str(addr_file),
             "--data", str(data_dir / "data"), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.addr = self._read_addr(addr_file)
        self._wait_ready()

    def _read_addr(self, path: pathlib.Path, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"hub did not start: {(self.data_dir / 'hub.log').read_text()}")
            time.sleep(0.01)
        return path.read_text().strip()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        """Waits for the hub to answer, with a fresh channel every 3 s: a
        cluster member's first connection can land in its switch from the
        standby server to the hub and then wait out grpc's connect timeout
        and back-off (seen twice in CI: 30 s without READY while the hub
        served; the open "join stall" of issue 15)."""
        deadline = time.monotonic() + timeout
        while True:
            ch = grpc.insecure_channel(self.addr)
            try:
                grpc.channel_ready_future(ch).result(timeout=max(0.1, min(3.0, deadline - time.monotonic())))
                return
            except grpc.FutureTimeoutError:
                if time.monotonic() >= deadline:
                    self.stop()
                    raise RuntimeError(f"hub did not start: {(self.data_dir / 'hub.log').read_text()}")
            finally:
                ch.close()

    def run_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *args], capture_output=True, text=True, check=check, timeout=120)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def hub(rlhub_bin, tmp_path):
    h = Hub(rlhub_bin, tmp_path)
    yield h
    h.stop()
