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

from conftest import Hub, free_port


class Etcd:
    """etcd on a free loopback port, data under ``tmp``; with ``tls``
    (paths ``cert``, ``key``, ``ca``, ``client_cert``, ``client_key``) it
    serves HTTPS and checks client certificates."""

    def __init__(self, tmp: pathlib.Path, tls: dict | None = None):
        scheme = "https" if tls else "http"
        self.hostport = f"127.0.0.1:{free_port()}"
        self.url = f"{scheme}://{self.hostport}"
        peer = f"http://127.0.0.1:{free_port()}"
        self.log = open(tmp / "etcd.log", "wb")
        args = ["etcd", "--name", "t", "--data-dir", str(tmp / "etcd"), "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", "t=" + peer, "--log-level", "error"]
        self.ctx = None
        if tls:
            args += ["--cert-file", tls["cert"], "--key-file", tls["key"], "--trusted-ca-file", tls["ca"],
                     "--client-cert-auth"]
            self.ctx = ssl.create_default_context(cafile=tls["ca"])
            self.ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
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

    def post(self, path: str, body: dict, token: str | None = None) -> dict:
        """One JSON gateway call (``/v3/kv/range``, ``/v3/auth/...``)."""
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=5, context=self.ctx) as r:
            return json.loads(r.read())

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
