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
    """``upstream`` is the hub's address; or ``etcd=(endpoints, cluster)``
    for a relay that follows the cluster's primary and announces itself
    in etcd."""

    def __init__(self, binary: str, upstream: str | None, model: str, relay_id: str = "relay-fo",
                 etcd: tuple[str, str] | None = None):
        self.binary, self.upstream, self.model, self.relay_id = binary, upstream, model, relay_id
        self.etcd = etcd
        self.proc: subprocess.Popen[bytes] | None = None
        self.move()

    def move(self) -> None:
        """The next start listens on a new port and writes a new segment
        (the old one removed)."""
        if getattr(self, "shm", None):
            self._remove()
        self.shm = f"/dev/shm/rlhub-fo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.listen = f"127.0.0.1:{free_port()}"

    def start(self, timeout: float = 30.0) -> "Relay":
        """Starts the relay and waits for its segment (a new file: the relay
        writes it under a temporary name and renames it over a killed
        predecessor's)."""
        before = os.stat(self.shm).st_ino if os.path.exists(self.shm) else None
        where = ["--etcd", self.etcd[0], "--cluster", self.etcd[1]] if self.etcd else ["--upstream", str(self.upstream)]
        with open(self.shm + ".log", "ab") as log:  # the relay's stderr, read when a start fails
            self.proc = subprocess.Popen(
                [self.binary, "relay", *where, "--model", self.model, "--id", self.relay_id,
                 "--listen", self.listen, "--shm", self.shm],
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.shm) or (before is not None and os.stat(self.shm).st_ino == before):
            if self.proc.poll() is not None:
                with open(self.shm + ".log", "rb") as f:
                    err = f.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"the relay exited with {self.proc.returncode}: {err}")
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
        self._remove()

    def _remove(self) -> None:
        for p in (self.shm, self.shm + ".log"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
