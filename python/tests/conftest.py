"""Fixtures that run the real rlhub binary.

RLHUB_BIN names a built binary (scripts/test.sh sets it); otherwise the
binary is built once per session with `go build`.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import time

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def rlhub_bin(tmp_path_factory) -> str:
    b = os.environ.get("RLHUB_BIN")
    if b:
        return b
    out = tmp_path_factory.mktemp("bin") / "rlhub"
    env = dict(os.environ, GOEXPERIMENT="simd")
    subprocess.run(["go", "build", "-o", str(out), "./cmd/rlhub"], cwd=REPO, env=env, check=True)
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    """A running `rlhub serve` process on a free loopback port."""

    def __init__(self, binary: str, data_dir: pathlib.Path, extra=()):
        self.binary = binary
        self.data_dir = data_dir
        self.addr = f"127.0.0.1:{free_port()}"
        self.log = open(data_dir / "hub.log", "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", self.addr, "--data", str(data_dir / "data"), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        ch = grpc.insecure_channel(self.addr)
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout)
        except grpc.FutureTimeoutError:
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
