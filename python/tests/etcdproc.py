"""One real etcd process on loopback for the cluster tests (Debian's
``etcd-server``: scripts/setup.d/20-etcd.sh), spoken to through its JSON
gateway."""

from __future__ import annotations

import base64
import json
import pathlib
import signal
import ssl
import subprocess
import time
import urllib.request
from typing import Callable, Iterable, TypeVar

from conftest import Hub, free_port


def listen_port() -> int:
    """A loopback port for an etcd to listen on: etcd binds the port it is
    given, not port 0; ``free_port``'s are below the ephemeral range."""
    return free_port()


class Etcd:
    """etcd on a free loopback port, data under ``tmp``; with ``tls``
    (paths ``cert``, ``key``, ``ca``, ``client_cert``, ``client_key``) it
    serves HTTPS and checks client certificates. A member of a cluster
    (:func:`start_etcd_cluster`) is given its ``name``, ``peer`` URL and
    the ``initial`` cluster, and ``wait=False`` (no member serves until a
    quorum runs). ``extra`` are more etcd flags. ``addr`` (host:port) is
    where it serves clients instead of a free loopback port, and ``wrap``
    the command it runs under (a lab host's namespace: netlab)."""

    def __init__(self, tmp: pathlib.Path, tls: dict | None = None, name: str = "t", peer: str | None = None,
                 initial: str | None = None, wait: bool = True, extra: tuple[str, ...] = (),
                 addr: str | None = None, wrap: tuple[str, ...] = ()):
        scheme = "https" if tls else "http"
        self.hostport = addr or f"127.0.0.1:{listen_port()}"
        self.url = f"{scheme}://{self.hostport}"
        peer = peer or f"http://127.0.0.1:{listen_port()}"
        initial = initial or f"{name}={peer}"
        self.log = open(tmp / f"etcd-{name}.log" if name != "t" else tmp / "etcd.log", "wb")
        data = tmp / (f"etcd-{name}" if name != "t" else "etcd")
        args = ["etcd", "--name", name, "--data-dir", str(data), "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", initial, "--log-level", "error"]
        if "," in initial:
            args.append("--pre-vote")  # a member back from a stop does not depose the leader (as clustertest)
        self.ctx = None
        if tls:
            args += ["--cert-file", tls["cert"], "--key-file", tls["key"], "--trusted-ca-file", tls["ca"],
                     "--client-cert-auth"]
            self.ctx = ssl.create_default_context(cafile=tls["ca"])
            self.ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
        args += extra
        self.proc = subprocess.Popen([*wrap, *args], stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_serving()

    def wait_serving(self) -> None:
        """Waits until the member answers a read (30 s), else stops it and
        raises."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self.post("/v3/kv/range", {"key": "eA=="})
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("etcd did not start")
                time.sleep(0.05)

    def post(self, path: str, body: dict, token: str | None = None, timeout: float = 5.0) -> dict:
        """One JSON gateway call (``/v3/kv/range``, ``/v3/auth/...``)."""
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as r:
            return json.loads(r.read())

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of etcd's /metrics samples of ``name`` whose labels
        contain ``labels``."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5, context=self.ctx) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if (line.startswith(name + " ") or line.startswith(name + "{")) and labels in line)

    def leader(self, cluster: str) -> tuple[str, int] | None:
        """(member id, epoch) of ``cluster``'s election holder, from etcd
        itself; None when nobody holds it."""
        prefix = f"/rlhub/{cluster}/election/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        kvs = self.post("/v3/kv/range", {"key": base64.b64encode(prefix).decode(),
                                         "range_end": base64.b64encode(end).decode(),
                                         "sort_order": "ASCEND", "sort_target": "CREATE", "limit": 1}).get("kvs") or []
        if not kvs:
            return None
        return json.loads(base64.b64decode(kvs[0]["value"]))["id"], int(kvs[0]["create_revision"])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def start_etcd_cluster(tmp: pathlib.Path, n: int = 3) -> list[Etcd]:
    """n etcd members on loopback forming one cluster, each serving; the
    caller stops them."""
    peers = [f"http://127.0.0.1:{listen_port()}" for _ in range(n)]
    initial = ",".join(f"m{i}={p}" for i, p in enumerate(peers))
    return serving([lambda i=i, p=p: Etcd(tmp, name=f"m{i}", peer=p, initial=initial, wait=False)
                    for i, p in enumerate(peers)])


E = TypeVar("E", bound=Etcd)


def serving(members: Iterable[Callable[[], E]]) -> list[E]:
    """Starts each member (none serves until a quorum runs), then waits
    until each serves; a failure stops those started and raises."""
    es: list[E] = []
    try:
        for start in members:
            es.append(start())
        for e in es:
            e.wait_serving()
    except BaseException:
        for e in es:
            if not e.log.closed:
                e.stop()
        raise
    return es


def start_cluster(rlhub_bin: str, tmp: pathlib.Path, cluster: str, extra: tuple[str, ...] = ()) -> tuple[Etcd, dict[str, Hub]]:
    """One etcd and three `rlhub serve --etcd` hubs (members h0, h1, h2) of
    ``cluster`` with a 1 s lease and ``extra`` flags; the caller stops them."""
    etcd = Etcd(tmp)
    hubs: dict[str, Hub] = {}
    try:
        for i in range(3):
            d = tmp / f"h{i}"
            d.mkdir()
            hubs[f"h{i}"] = Hub(rlhub_bin, d, extra=["--etcd", etcd.url, "--cluster", cluster, "--lease-ttl", "1s",
                                                     "--member-id", f"h{i}", *extra])
    except BaseException:
        for h in hubs.values():
            h.stop()
        etcd.stop()
        raise
    return etcd, hubs


def stop_cluster(etcd: Etcd, hubs: dict[str, Hub]) -> None:
    """Stops what start_cluster started, SIGCONTing first any hub a test
    left stopped (a stopped process does not die of SIGTERM)."""
    for h in hubs.values():
        h.proc.send_signal(signal.SIGCONT)
        h.stop()
    etcd.stop()


def wait_leader(etcd: Etcd, cluster: str, other_than: str | None = None, after: int = 0) -> tuple[str, int]:
    """(member id, epoch) of ``cluster``'s primary once etcd names one
    other than ``other_than`` at an epoch above ``after`` (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        lead = etcd.leader(cluster)
        if lead is not None and lead[0] != other_than and lead[1] > after:
            return lead
        assert time.monotonic() < deadline, "no primary elected within 30 s"
        time.sleep(0.05)


def sigstop(proc: subprocess.Popen) -> None:
    """SIGSTOPs proc and waits until the kernel shows it stopped: a call
    sent before that could still be answered."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {proc.pid} not stopped within 10 s of SIGSTOP")
        time.sleep(0.001)
