"""A real `rlhub relay` process for failover tests: started on a fixed
loopback address and segment so that a restart comes back where its
collectors look for it, and SIGKILLed to die without a word."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

from conftest import free_port


class Relay:
    def __init__(self, binary: str, upstream: str, model: str, relay_id: str = "relay-fo"):
        self.binary, self.upstream, self.model, self.relay_id = binary, upstream, model, relay_id
        self.shm = f"/dev/shm/rlhub-fo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.listen = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> "Relay":
        """Starts the relay and waits for its segment (a new file: the relay
        writes it under a temporary name and renames it over a killed
        predecessor's)."""
        before = os.stat(self.shm).st_ino if os.path.exists(self.shm) else None
        self.proc = subprocess.Popen(
            [self.binary, "relay", "--upstream", self.upstream, "--model", self.model, "--id", self.relay_id,
             "--listen", self.listen, "--shm", self.shm],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.shm) or (before is not None and os.stat(self.shm).st_ino == before):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the relay exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the relay made no segment within {timeout} s")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: no goodbye to its collectors, the segment left behind."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        try:
            os.unlink(self.shm)
        except FileNotFoundError:
            pass
